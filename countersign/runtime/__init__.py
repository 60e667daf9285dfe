"""The app, the server and its listeners, start-up checks, the dev stack, the Lambda entry point."""

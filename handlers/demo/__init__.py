"""The demo tools and their SQLite business database."""

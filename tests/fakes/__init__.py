"""Local stand-ins for services that cannot run here, each a real HTTP server on 127.0.0.1."""

"""Test support code: real restate-server and handlers processes for the pytest fixtures."""

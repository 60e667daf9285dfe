"""The operator CLI and what its commands do."""

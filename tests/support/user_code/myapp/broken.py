"""A module of the user's app that raises when imported: tests/integration/test_user_services.py checks
that `COUNTERSIGN_SERVICES=myapp.broken:greeter` stops `serve` at start with one line saying so."""

raise RuntimeError("boom at import")

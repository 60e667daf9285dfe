"""Entry point for `python -m handlers`."""

import sys

from pydantic import ValidationError

from handlers.cli import main

try:
    sys.exit(main())
except ValidationError as exc:
    sys.exit(f"configuration error: {exc}")

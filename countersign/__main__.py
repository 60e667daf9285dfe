"""Entry point for `python -m countersign`."""

import sys

from pydantic import ValidationError

from countersign.ops.cli import main

try:
    sys.exit(main())
except ValidationError as exc:
    # One line, naming each bad variable as it is spelled in the environment.
    problems = "; ".join(
        f"{'.'.join(str(part) for part in error['loc']).upper()}: {error['msg'].removeprefix('Value error, ')}"
        for error in exc.errors()
    )
    sys.exit(f"configuration error: {problems}" if exc.title == "Settings" else f"error: {exc.title}: {problems}")

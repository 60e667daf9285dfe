"""Entry point for `python -m countersign` and the `countersign` console script (`console`).

Guarantee: a configuration the library refuses (a CountersignError, or settings that do not
validate) ends the command with one line on stderr naming the setting and a non-zero exit status,
never a traceback; see countersign.ops.cli for the commands themselves.
"""

import os
import sys

from pydantic import ValidationError

from countersign.ops.cli import main


def console() -> None:
    """Run the command line in `sys.argv` and exit with its status."""
    # As under `python -m countersign`: the modules COUNTERSIGN_TOOLS and COUNTERSIGN_SERVICES name
    # import from the folder the command runs in (then PYTHONPATH, then what is installed).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        code = main()  # a CountersignError is already one line and exit 1 there
    except ValidationError as exc:
        # One line, naming each bad variable as it is spelled in the environment.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']).upper()}: {error['msg'].removeprefix('Value error, ')}"
            for error in exc.errors()
        )
        sys.exit(f"configuration error: {problems}" if exc.title == "Settings" else f"error: {exc.title}: {problems}")
    sys.exit(code)


if __name__ == "__main__":
    console()

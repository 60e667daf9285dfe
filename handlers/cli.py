"""Command line: `python -m handlers dev | serve | decode`.

Guarantee: bad arguments print a usage error (exit 2), configuration errors a one-line reason
(exit 1); never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import re


def _bind(value: str) -> str:
    if not re.match(r"^[\w.\[\]:-]+:\d{1,5}$", value):
        raise argparse.ArgumentTypeError("expected HOST:PORT, e.g. 127.0.0.1:9080")
    return value


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m handlers", description="Countersign: emailed approval for agents.")
    commands = root.add_subparsers(dest="command", required=True)
    dev = commands.add_parser("dev", help="run restate-server, the handlers and registration locally")
    dev.add_argument("--demo", action="store_true", help="also start one demo run (a $612.40 refund)")
    serve = commands.add_parser("serve", help="serve the handlers only (for deployment)")
    serve.add_argument("--bind", type=_bind, default="127.0.0.1:9080", help="HOST:PORT (default 127.0.0.1:9080)")
    commands.add_parser(
        "decode",
        help="open a sealed journal value or ingress answer read from stdin (COUNTERSIGN_JOURNAL_KEYS, "
        "else the dev stack's key)",
    )
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "dev":
        from handlers.devstack import run_dev

        return run_dev(args.demo)
    if args.command == "decode":
        from handlers.devstack import decode_stdin

        return decode_stdin()
    from handlers import startup
    from handlers.app import create_app
    from handlers.server import serve
    from handlers.settings import get_settings

    startup.configure_logging()
    settings = get_settings()
    startup.check(settings)
    asyncio.run(serve(create_app(settings), args.bind))
    return 0

"""Serve an ASGI app with hypercorn from code, so SIGTERM stops it.

Guarantee: SIGTERM and SIGINT both trigger hypercorn's graceful shutdown. (The Restate SDK installs
its own SIGTERM handler on the first request, displacing hypercorn's; we register through the SDK's
hook list so ours still runs.) The committed `hypercorn.toml` (package data, so an installed wheel has it
too) sets the HTTP/2 limits Restate needs; it is always applied.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from restate.server import install_shutdown_hook

HYPERCORN_TOML = Path(__file__).resolve().parent / "hypercorn.toml"


def hypercorn_config(bind: str) -> Config:
    # No silent fallback to hypercorn's defaults: they close a Restate connection after 1000 requests.
    config = Config.from_toml(HYPERCORN_TOML)
    config.bind = [bind]
    return config


async def serve(app: Any, bind: str, stop: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or `stop` is set)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    install_shutdown_hook(loop, stop.set, signal.SIGTERM)
    # Ctrl-C takes the SIGTERM path: only that one also tells the SDK to end its open invocation
    # streams, without which hypercorn's graceful shutdown waits on them forever.
    loop.add_signal_handler(signal.SIGINT, os.kill, os.getpid(), signal.SIGTERM)
    await hypercorn_serve(app, hypercorn_config(bind), shutdown_trigger=stop.wait)

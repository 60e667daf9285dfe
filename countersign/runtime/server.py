"""Serve ASGI apps with hypercorn from code, so SIGTERM stops them, each listener with its own limits.

Guarantee: SIGTERM and SIGINT both trigger hypercorn's graceful shutdown of every listener. (The
Restate SDK installs its own SIGTERM handler on the first request, displacing hypercorn's; we
register through the SDK's hook list so ours still runs.) The limits come from `hypercorn.toml`
inside the installed package, never from the current folder: `[restate]` for the Restate endpoint
(long-lived HTTP/2 streams), `[public]` plus the PAGES_* timeouts for the pages and for the metrics
listener (COUNTERSIGN_METRICS_BIND, when set: an address of its own). If one listener
stops (or cannot bind), the others stop too, and a busy address is a one-line SettingsError naming
its setting (an address that is also the pages' is refused the same way, before anything binds).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from restate.server import install_shutdown_hook

from countersign.exceptions import SettingsError
from countersign.settings import SHARED_LISTENER, Settings

HYPERCORN_TOML = "hypercorn.toml"
"""Package data of `countersign` (see pyproject.toml), read with importlib.resources."""


@cache
def _limits() -> dict[str, dict[str, Any]]:
    text = resources.files("countersign.runtime").joinpath(HYPERCORN_TOML).read_text(encoding="utf-8")
    return tomllib.loads(text)


def _config(table: str, bind: str) -> Config:
    config = Config.from_mapping(_limits()[table])
    config.bind = [bind]
    # Given a logger, hypercorn uses it as it is; given its default ("-"), it adds a handler of its
    # own to "hypercorn.error", which also propagates to the root's: every line came out twice.
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


def restate_config(bind: str) -> Config:
    """The Restate endpoint's listener: streams may stay open, silent, for as long as a run waits."""
    return _config("restate", bind)


def public_config(bind: str, settings: Settings) -> Config:
    """The pages' listener: idle (and header) and read timeouts from settings."""
    config = _config("public", bind)
    config.keep_alive_timeout = settings.pages_idle_timeout_seconds
    config.read_timeout = settings.pages_read_timeout_seconds
    return config


@dataclass(frozen=True)
class Listener:
    app: Any
    config: Config
    setting: str
    """What sets its address (named when it cannot bind)."""


def listeners(settings: Settings, bind: str) -> list[Listener]:
    """What `python -m countersign serve --bind BIND` serves: the pages on BIND and the Restate endpoint
    on RESTATE_ENDPOINT_BIND; or, with RESTATE_ENDPOINT_BIND=shared, both on BIND with the Restate
    limits (the pages then keep only their body deadline: idle and header timeouts are per listener)."""
    from countersign.runtime.app import create_app, public_app, restate_app

    extra = metrics_listener(settings, bind)
    if settings.restate_endpoint_bind == SHARED_LISTENER:
        return [Listener(create_app(settings), restate_config(bind), "--bind"), *extra]
    if settings.restate_endpoint_bind == bind:
        raise SettingsError(
            "RESTATE_ENDPOINT_BIND",
            f"RESTATE_ENDPOINT_BIND {bind} is the pages' --bind too: give it another port, "
            f"or `{SHARED_LISTENER}` to serve both on one",
        )
    return [
        Listener(public_app(settings), public_config(bind, settings), "--bind"),
        Listener(restate_app(settings), restate_config(settings.restate_endpoint_bind), "RESTATE_ENDPOINT_BIND"),
        *extra,
    ]


def metrics_listener(settings: Settings, bind: str) -> list[Listener]:
    """COUNTERSIGN_METRICS_BIND's listener (none when unset): `/metrics` only, with the pages' limits,
    on an address of its own (never the pages' or the Restate endpoint's)."""
    from countersign.runtime.metrics import metrics_app

    metrics_bind = settings.countersign_metrics_bind
    if metrics_bind is None:
        return []
    if metrics_bind in (bind, settings.restate_endpoint_bind):
        raise SettingsError(
            "COUNTERSIGN_METRICS_BIND",
            f"COUNTERSIGN_METRICS_BIND {metrics_bind} is also the pages' or the Restate endpoint's address: "
            "give the metrics a port of their own",
        )
    return [Listener(metrics_app(settings), public_config(metrics_bind, settings), "COUNTERSIGN_METRICS_BIND")]


async def serve(*listeners: Listener, stop: asyncio.Event | None = None) -> None:
    """Serve every listener until SIGTERM/SIGINT (or `stop` is set, or one of them stops)."""
    for listener in listeners:
        # Bind once before any listener starts: hypercorn binds after the app's lifespan started and
        # leaves that lifespan dangling when the bind fails.
        try:
            sockets = listener.config.create_sockets()
        except OSError as exc:
            raise _cannot_bind(listener, exc) from None
        for sock in (*sockets.secure_sockets, *sockets.insecure_sockets, *sockets.quic_sockets):
            sock.close()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    install_shutdown_hook(loop, stop.set, signal.SIGTERM)
    # Ctrl-C takes the SIGTERM path: only that one also tells the SDK to end its open invocation
    # streams, without which hypercorn's graceful shutdown waits on them forever.
    loop.add_signal_handler(signal.SIGINT, os.kill, os.getpid(), signal.SIGTERM)

    failures: list[SettingsError] = []

    async def one(listener: Listener) -> None:
        try:
            await hypercorn_serve(listener.app, listener.config, shutdown_trigger=stop.wait)
        except OSError as exc:  # taken since the check above: the others shut down gracefully, then we exit
            failures.append(_cannot_bind(listener, exc))
        finally:
            stop.set()

    async with asyncio.TaskGroup() as group:
        for listener in listeners:
            group.create_task(one(listener))
    if failures:
        raise failures[0]


def _cannot_bind(listener: Listener, exc: OSError) -> SettingsError:
    where = f"{listener.setting} {', '.join(listener.config.bind)}"
    return SettingsError(listener.setting, f"{where}: {exc.strerror or exc}")

"""Serverless test parts: the Lambda stand-in process and deployment look-ups.

Guarantee: the Lambda stand-in is managed like the app (own session, stopped by PID, bounded
waits); the deployment helpers only read the admin API.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

import httpx

from support.processes import AppServer, RestateServer

BRIDGE = Path(__file__).resolve().parent / "lambda_bridge.py"


class LambdaBridge(AppServer):
    """`tests/support/lambda_bridge.py`: Restate's HTTP/1.1 requests in, Lambda events to the handler."""

    own_restate_listener = False

    @staticmethod
    def _command(port: int) -> list[str]:
        return [sys.executable, str(BRIDGE), "--bind", f"127.0.0.1:{port}"]

    @property
    def restate_uri(self) -> str:
        # A Lambda deployment has no path prefix: Restate sends /discover and /invoke/... as event paths.
        return self.url

    def event_lines(self) -> list[str]:
        """`METHOD PATH -> STATUS` for every event the handler received so far."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return [line.removeprefix("lambda event: ") for line in text.splitlines() if line.startswith("lambda event: ")]


def deployments(restate: RestateServer) -> list[dict[str, Any]]:
    """The admin API's deployment list (id, uri, protocol_type, http_version, services...)."""
    response = httpx.get(f"{restate.admin_url}/deployments", timeout=30.0, trust_env=False)
    response.raise_for_status()
    return cast(list[dict[str, Any]], response.json()["deployments"])


def deployment_id(restate: RestateServer, uri: str) -> str:
    [found] = [d for d in deployments(restate) if d["uri"].rstrip("/") == uri.rstrip("/")]
    return str(found["id"])


def pinned_deployments(restate: RestateServer, run_ids: list[str]) -> dict[str, str | None]:
    """run id -> the deployment its `run` invocation is pinned to (None if not pinned yet)."""
    keys = ", ".join("'" + run_id.replace("'", "''") + "'" for run_id in run_ids)
    rows = restate.sql(
        "select target_service_key, pinned_deployment_id from sys_invocation"
        f" where target_service_name = 'AgentRun' and target_handler_name = 'run' and target_service_key in ({keys})"
    )
    return {row["target_service_key"]: row["pinned_deployment_id"] for row in rows}

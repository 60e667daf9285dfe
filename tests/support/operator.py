"""What an operator reaches beside the app in tests: the console commands, an inbox, an approval's audit trail."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from support.processes import REPO, Ingress, RestateServer


def cli(restate: RestateServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "RESTATE_INGRESS_URL": restate.ingress_url,
        "RESTATE_ADMIN_URL": restate.admin_url,
        "COUNTERSIGN_JOURNAL_KEYS": restate.journal_keys,
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, "-m", "countersign", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def inbox(ingress: Ingress, approver: str) -> list[str]:
    reply = ingress.call("ApprovalInbox", approver, "pending", None)
    reply.raise_for_status()
    return [item["approval_id"] for item in reply.json()["pending"]]


def audit_entries(ingress: Ingress, approval: str) -> list[dict[str, Any]]:
    reply = ingress.call("ApprovalAudit", approval, "entries", None)
    reply.raise_for_status()
    return list(reply.json()["entries"])

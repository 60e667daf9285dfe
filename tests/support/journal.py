"""What Restate itself stores about a workflow (journal, state, promises), decoded to text, for plaintext checks."""

from __future__ import annotations

import json
from typing import Any

from support.processes import RestateServer

BINARY_COLUMNS = {"raw", "value", "completion_success_value"}


def everything_restate_holds(restate: RestateServer, key: str) -> str:
    """Every row about workflow `key`, with binary columns (hex in SQL answers) decoded to text."""
    ids = f"select id from sys_invocation where target_service_key = '{key}'"
    rows: list[dict[str, Any]] = []
    for query in (
        f"select * from sys_journal where id in ({ids})",
        f"select * from sys_journal_events where id in ({ids})",
        f"select * from sys_invocation where target_service_key = '{key}'",
        f"select * from state where service_key = '{key}'",
        f"select * from sys_promise where service_key = '{key}'",
        f"select * from sys_inbox where service_key = '{key}'",
    ):
        rows += restate.sql(query)
    assert rows, f"Restate holds nothing about {key}"
    parts = []
    for row in rows:
        for column, value in row.items():
            if column in BINARY_COLUMNS and isinstance(value, str):
                parts.append(bytes.fromhex(value).decode("utf-8", errors="replace"))
            else:
                parts.append(json.dumps(value))
    return "\n".join(parts)

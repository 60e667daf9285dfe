"""Per-tool policy overrides from the TOML file in `APPROVALS_POLICY_FILE` (`[tools.<name>]` tables).

Guarantee: a file that cannot be read, holds anything but `[tools.<name>]` tables, or makes a policy
invalid is a PolicyError naming the setting, raised before anything is served.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from countersign.exceptions import PolicyError
from countersign.tools.policy import ToolPolicy, errors_text

POLICY_FILE = "APPROVALS_POLICY_FILE"


def load_overrides(path: Path | None) -> dict[str, dict[str, Any]]:
    """Per-tool overrides from the policy file: `[tools.<name>]` tables of ToolPolicy fields
    (PolicyError naming APPROVALS_POLICY_FILE when it cannot be read or holds anything else)."""
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{POLICY_FILE} {path}: {exc}", setting=POLICY_FILE) from exc
    tools = data.get("tools", {})
    if not isinstance(tools, dict) or set(data) - {"tools"}:
        raise PolicyError(f"{POLICY_FILE} {path}: expected only [tools.<name>] tables", setting=POLICY_FILE)
    return {str(name): dict(table) for name, table in tools.items()}


def merge(
    default: ToolPolicy, override: Mapping[str, Any] | None, *, source: str, setting: str | None = None
) -> ToolPolicy:
    """`default` with `override`'s fields; PolicyError (naming `source`, and `setting` when given)
    when the result is not a valid policy."""
    if not override:
        return default
    try:
        kept = {} if "approvers" in override else {"approvers_from": default.approvers_from}
        return ToolPolicy.model_validate({**default.model_dump(), **kept, **override})
    except ValidationError as exc:
        raise PolicyError(f"{source}: {errors_text(exc)}", setting=setting) from None

"""The graduation dial: the policy-file change that lets a tool's calls run alone (`graduate`), and
its inverse (`tighten`).

Guarantee: a change is computed from the tool's policy in code and its `[tools.<name>]` table in the
policy file, and is validated as a whole policy (a bad condition is refused, nothing is written);
`tighten` with the same condition undoes `graduate` exactly (the table returns to what it was,
keys equal to the code's defaults are dropped rather than repeated). Writing edits only that table,
keeps the rest of the file (comments included, through tomlkit) and replaces the file atomically.
The handlers read the policy file at start: a change applies to calls made after they restart, and
their audit entries name the policy version (`policy_version`) that answered.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from countersign.tools.policy import PolicyError, ToolPolicy, policy_version
from countersign.tools.policy_file import merge
from countersign.tools.registry import Tool


class DialRefused(ValueError):
    """The change cannot be made (already so, a condition in code, an invalid condition)."""


@dataclass(frozen=True)
class DialChange:
    tool: str
    table: dict[str, Any]
    """The whole `[tools.<name>]` table after the change (empty: no table at all)."""
    before: str
    after: str
    """Policy versions before and after."""
    summary: str

    def toml(self) -> str:
        doc = tomlkit.document()
        doc.add(tomlkit.comment(f"{self.tool}: {self.summary}; policy {self.before} -> {self.after}"))
        tools = tomlkit.table(is_super_table=True)
        table = tomlkit.table()
        for key, value in self.table.items():
            table[key] = value
        tools[self.tool] = table
        doc["tools"] = tools
        return tomlkit.dumps(doc)


def table_in(path: Path | None, tool: str) -> dict[str, Any]:
    """The tool's table in a policy file (empty when the file or the table is absent)."""
    if path is None or not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DialRefused(f"{path}: {exc}") from None
    found = data.get("tools", {}).get(tool, {})
    return dict(found) if isinstance(found, Mapping) else {}


def _effective(code: Tool, table: Mapping[str, Any]) -> ToolPolicy:
    try:
        return merge(code.policy, table, source=f"[tools.{code.name}]")
    except PolicyError as exc:  # merge refuses a start; here it is a refusal with the same message
        raise DialRefused(str(exc)) from None


def _with(code: Tool, table: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    """`table` with `changes`; a value equal to the code's default is dropped (the file stays minimal)."""
    out = dict(table)
    defaults = code.policy
    for key, value in changes.items():
        default = getattr(defaults, key)
        if value == default or (value is None and default is None):
            out.pop(key, None)
        elif value is None:  # "no condition" where the code has one: every call
            out[key] = "true"
        else:
            out[key] = value
    return out


def _text_condition(policy: ToolPolicy, tool: str) -> str | None:
    if policy.when is not None and not isinstance(policy.when, str):
        raise DialRefused(f"{tool}'s condition is code, not text: write its policy-file table by hand")
    return policy.when


def graduate(code: Tool, table: Mapping[str, Any], when: str | None = None) -> DialChange:
    """Calls of `code` (all, or those where `when` holds) run without approval."""
    current = _effective(code, table)
    if not current.gated:
        raise DialRefused(f"{code.name} already runs without approval")
    if when is None:
        new = _with(code, table, gated=False)
        summary = "every call runs without approval"
    else:
        old = _text_condition(current, code.name)
        condition = f"!({when})" if old in (None, "true") else f"({old}) && !({when})"
        new = _with(code, table, when=condition)
        summary = f"calls where {when} run without approval"
    return _change(code, table, new, summary)


def tighten(code: Tool, table: Mapping[str, Any], when: str | None = None) -> DialChange:
    """Calls of `code` (all, or those where `when` holds) need approval again; undoes `graduate`."""
    current = _effective(code, table)
    if when is None:
        if current.gated and current.when in (None, "true"):
            raise DialRefused(f"{code.name} already needs approval for every call")
        new = _with(code, table, gated=True) if not current.gated else _with(code, table, when=None)
        summary = "every call needs approval"
        return _change(code, table, new, summary)
    summary = f"calls where {when} need approval"
    if not current.gated:
        return _change(code, table, _with(code, table, gated=True, when=when), summary)
    old = _text_condition(current, code.name)
    if old is None or old == "true":
        raise DialRefused(f"{code.name} already needs approval for every call")
    if old == f"!({when})":
        condition: str | None = None
    elif old.endswith(f" && !({when})") and old.startswith("("):
        condition = old[1 : -len(f") && !({when})")]
    else:
        condition = f"({old}) || ({when})"
    return _change(code, table, _with(code, table, when=condition), summary)


def _change(code: Tool, table: Mapping[str, Any], new: dict[str, Any], summary: str) -> DialChange:
    before, after = _effective(code, table), _effective(code, new)
    return DialChange(
        tool=code.name,
        table=new,
        before=policy_version(code.name, before),
        after=policy_version(code.name, after),
        summary=summary,
    )


def write(path: Path, change: DialChange) -> None:
    """Put `change.table` in `path` as `[tools.<name>]` (created if need be), keeping the rest."""
    doc = tomlkit.parse(path.read_text(encoding="utf-8")) if path.exists() else tomlkit.document()
    tools = doc.get("tools")
    if tools is None:
        tools = tomlkit.table(is_super_table=True)
        doc["tools"] = tools
    if change.table:
        table = tomlkit.table()
        for key, value in change.table.items():
            table[key] = value
        tools[change.tool] = table
    elif change.tool in tools:
        del tools[change.tool]
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(tomlkit.dumps(doc))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

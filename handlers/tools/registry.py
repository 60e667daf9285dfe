"""The tool registry: each tool's argument model, description, default policy and effect.

Guarantee: a tool runs only with arguments that validated against its pydantic model, and its
effect receives the idempotency key of the call, so a re-run after a crash finds its own earlier
effect instead of repeating it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from handlers.policy import ToolPolicy, load_overrides, merge


class ToolError(Exception):
    """A business refusal (order not found, amount too high): final, reported to the model."""


@dataclass(frozen=True)
class EditRule:
    """Which way an approver may change one argument; the tool's model still validates the result."""

    direction: Literal["any", "decrease_only"] = "any"

    def describe(self) -> str:
        return "may only be lowered" if self.direction == "decrease_only" else "may be changed"


@dataclass(frozen=True)
class EffectContext:
    db_path: Path
    idempotency_key: str


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args_model: type[BaseModel]
    policy: ToolPolicy
    effect: Callable[[Any, EffectContext], dict[str, Any]]
    summarize: Callable[[Any], str]
    editable: Mapping[str, EditRule] = field(default_factory=dict)
    precondition: Callable[[Any, EffectContext], str | None] | None = None
    """Checked right before execution; returns what changed in the world since approval, or None."""
    confirm_field: str | None = None
    """The argument an approver retypes to confirm a high-stakes call (else the fingerprint)."""

    def validate(self, raw: Mapping[str, Any]) -> BaseModel:
        return self.args_model.model_validate(dict(raw))

    def schema(self) -> dict[str, Any]:
        return copy.deepcopy(_json_schema(self.args_model))


@functools.cache
def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    # Every model turn lists every tool's schema; generating one costs about 0.2 ms of CPU.
    return model.model_json_schema()


class Registry:
    def __init__(self, tools: list[Tool], policy_file: Path | None = None) -> None:
        overrides = load_overrides(policy_file)
        unknown = set(overrides) - {t.name for t in tools}
        if unknown:
            raise SystemExit(f"APPROVALS_POLICY_FILE names unknown tools: {sorted(unknown)}")
        source = f"APPROVALS_POLICY_FILE {policy_file}"
        for tool in tools:
            if tool.confirm_field and tool.confirm_field not in tool.args_model.model_fields:
                raise SystemExit(f"tool {tool.name}: confirm_field {tool.confirm_field!r} is not one of its arguments")
        self._tools = {t.name: replace(t, policy=merge(t.policy, overrides.get(t.name), source=source)) for t in tools}

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())


def validation_message(exc: ValidationError) -> str:
    """A short, model-readable account of what was wrong with the arguments."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)

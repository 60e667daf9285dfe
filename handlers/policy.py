"""Which tool calls need a person, which people, and how long they have.

Guarantee: a policy is plain data (overridable per tool from the TOML file in
`APPROVALS_POLICY_FILE`), and `evaluate` is a pure function of the policy and the validated
arguments, so the agent loop can journal its answer once and replay it unchanged.
"""

from __future__ import annotations

import operator
import re
import tomllib
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from handlers.contract import EMAIL_PATTERN

MAX_DEADLINE_SECONDS = 7 * 24 * 3600
_CONDITION = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?)\s*$")
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


class ToolPolicy(BaseModel):
    """How one tool is gated. `when` is a threshold such as `amount_usd > 500`; None means always."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gated: bool = False
    when: str | None = None
    approvers: tuple[str, ...] = ()
    quorum: int = Field(default=1, ge=1)
    deadline_seconds: int = Field(default=24 * 3600, ge=1, le=MAX_DEADLINE_SECONDS)
    reminders_seconds: tuple[int, ...] = ()
    escalate_after_seconds: int | None = Field(default=None, ge=1)
    escalate_to: tuple[str, ...] = ()
    timeout_outcome: Literal["deny", "allow", "fail"] = "deny"
    low_risk: bool = False
    on_superseded: Literal["reapprove", "tell_model"] = "reapprove"
    high_stakes: bool = False
    """High-stakes approvals need the approver to type the amount, id or fingerprint to confirm."""
    high_stakes_when: str | None = None

    @field_validator("when", "high_stakes_when")
    @classmethod
    def _check_condition(cls, when: str | None) -> str | None:
        if when is not None and not _CONDITION.match(when):
            raise ValueError(f"condition {when!r} must look like 'field > number'")
        return when

    @field_validator("approvers", "escalate_to")
    @classmethod
    def _check_approvers(cls, approvers: tuple[str, ...]) -> tuple[str, ...]:
        for approver in approvers:
            if not re.fullmatch(EMAIL_PATTERN, approver):
                raise ValueError(f"approver {approver!r} is not an email address")
        normalized = tuple(a.lower() for a in approvers)
        if len(set(normalized)) != len(normalized):
            raise ValueError("the same person is listed twice (one person counts once)")
        return normalized

    @model_validator(mode="after")
    def _consistent(self) -> ToolPolicy:
        if self.gated and not self.approvers:
            raise ValueError("a gated tool needs at least one approver")
        if self.quorum > max(1, len(self.approvers)):
            raise ValueError(f"quorum {self.quorum} needs at least {self.quorum} approvers")
        if self.quorum > 1 and self.escalate_to:
            raise ValueError("escalation is for single-approver tools (quorum 1)")
        if self.escalate_to and not self.escalate_after_seconds:
            raise ValueError("escalate_to needs escalate_after_seconds")
        if self.high_stakes_when and not self.high_stakes:
            raise ValueError("high_stakes_when needs high_stakes = true")
        if self.high_stakes and self.low_risk:
            raise ValueError("a tool cannot be both low_risk and high_stakes")
        if self.timeout_outcome == "allow" and not self.low_risk:
            raise ValueError("timeout_outcome 'allow' is only for tools marked low_risk")
        if any(r <= 0 or r >= self.deadline_seconds for r in self.reminders_seconds):
            raise ValueError(
                f"reminders_seconds {list(self.reminders_seconds)} must fall between 0 and "
                f"deadline_seconds {self.deadline_seconds} (set reminders_seconds = [] to have none)"
            )
        return self

    def describe(self, tool: str) -> str:
        if not self.gated:
            return f"{tool}: autonomous"
        condition = f" when {self.when}" if self.when else " always"
        who = f", {self.quorum} of {len(self.approvers)} approvers" if self.quorum > 1 else ""
        return f"{tool}: needs approval{condition}{who}"


class PolicyVerdict(BaseModel):
    """The journaled answer for one call: gated or not, and the whole deadline policy that applies."""

    gated: bool
    rule: str
    policy: ToolPolicy
    high_stakes: bool = False


def evaluate(tool: str, policy: ToolPolicy, args: Mapping[str, Any]) -> PolicyVerdict:
    gated = policy.gated and (policy.when is None or _condition_holds(policy.when, args))
    high = policy.high_stakes and (policy.high_stakes_when is None or _condition_holds(policy.high_stakes_when, args))
    return PolicyVerdict(gated=gated, rule=policy.describe(tool), policy=policy, high_stakes=gated and high)


def _condition_holds(when: str, args: Mapping[str, Any]) -> bool:
    match = _CONDITION.match(when)
    assert match is not None
    field, op, threshold = match.groups()
    if field not in args:
        return True  # a condition on a missing field cannot clear the gate: fail closed
    try:
        value = Decimal(str(args[field]))
    except InvalidOperation:
        return True
    return _OPERATORS[op](value, Decimal(threshold))


def load_overrides(path: Path | None) -> dict[str, dict[str, Any]]:
    """Per-tool overrides from the policy file: `[tools.<name>]` tables of ToolPolicy fields."""
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(f"APPROVALS_POLICY_FILE {path}: {exc}") from exc
    tools = data.get("tools", {})
    if not isinstance(tools, dict) or set(data) - {"tools"}:
        raise SystemExit(f"APPROVALS_POLICY_FILE {path}: expected only [tools.<name>] tables")
    return {str(name): dict(table) for name, table in tools.items()}


def merge(default: ToolPolicy, override: Mapping[str, Any] | None, *, source: str) -> ToolPolicy:
    if not override:
        return default
    try:
        return ToolPolicy.model_validate({**default.model_dump(), **override})
    except ValidationError as exc:
        raise SystemExit(f"{source}: {exc}") from exc

"""Which tool calls need a person, which people, and how long they have.

Guarantee: a policy is overridable per tool from the TOML file in `APPROVALS_POLICY_FILE`, and
`evaluate` resolves it into plain data (the condition's answer, a concrete tuple of approvers and a
text of the rule), so the agent loop journals that answer once, inside the model turn's step, and a
replay re-uses it: neither a policy-file change nor an approver callable can re-route a replay.
Conditions fail closed: a missing argument, a type error or an exception in a condition gates the call
(the condition language: countersign.tools.conditions; the file's overrides: countersign.tools.policy_file).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from countersign.contract import EMAIL_PATTERN, ModelRetiredChoice, StopReason
from countersign.exceptions import PolicyError as PolicyError
from countersign.tools import checkpoints
from countersign.tools.conditions import (
    Condition,
    cel_arguments,
    check_condition,
    condition_holds,
    describe_condition,
    name_of,
)

log = logging.getLogger(__name__)

MAX_DEADLINE_SECONDS = 7 * 24 * 3600
ChannelName = Literal["email", "slack"]
"""The channels an approval request can go out through (see countersign.channels)."""


@dataclass(frozen=True)
class ApproverContext:
    """What an approver callable is told about the call it names approvers for."""

    tool: str
    args: Any
    """The validated arguments (an instance of the tool's `args_model`)."""
    requester: str
    tenant: str


ApproverSource: TypeAlias = Sequence[str] | Callable[[ApproverContext], Sequence[str]]
"""Approvers' emails, or a callable that names them for one call (the requester's manager, on-call)."""


class PlanPolicy(BaseModel):
    """Post-plan gating for one tool (`[tools.<name>.plan]`): a run that may call it asks the model for
    a plan first; approved once, the calls inside it run without a new approval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_deviation: Literal["ask", "refuse"] = "ask"
    """A gated call of this tool outside the approved plan: a fresh approval, or refused."""


MAX_GRANT_SECONDS = 30 * 24 * 3600
MAX_GRANT_USES = 1000


class GrantPolicy(BaseModel):
    """Standing approvals for one tool (`[tools.<name>.grants]`): an approver who approves a call may
    also let calls like it run without asking, for a time they pick up to `max_seconds`, at most
    `max_uses` times. "Like it" is the same tool, the same requester (or tenant, with `scope =
    "tenant"`), each `same` field equal to the approved call's value and each `at_most` field (a
    number) no larger than it. High-stakes calls, quorum tools and calls a checkpoint stopped are
    never offered one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_seconds: int = Field(ge=60, le=MAX_GRANT_SECONDS)
    max_uses: int = Field(ge=1, le=MAX_GRANT_USES)
    scope: Literal["requester", "tenant"] = "requester"
    same: tuple[str, ...] = ()
    """Fields a covered call must have equal to the approved call's (e.g. `customer_id`)."""
    at_most: tuple[str, ...] = ()
    """Numeric fields a covered call may not exceed the approved call's value in (e.g. `amount_usd`)."""

    @model_validator(mode="after")
    def _distinct(self) -> GrantPolicy:
        if set(self.same) & set(self.at_most):
            raise ValueError("a field is bound either by `same` or by `at_most`, not both")
        return self


_GRANT_STEPS = (3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600, 30 * 24 * 3600)


def grant_choices(max_seconds: int) -> list[int]:
    """The durations the page and the Slack modal offer for a standing approval: the usual steps up
    to the policy's maximum, and the maximum."""
    return [s for s in _GRANT_STEPS if s < max_seconds] + [max_seconds]


class ToolPolicy(BaseModel):
    """How one tool is gated. `when` is a condition such as `amount_usd > 500`; None means always."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gated: bool = False
    when: Condition | None = None
    approvers: tuple[str, ...] = ()
    """Emails. `ToolPolicy(approvers=callable)` is accepted too: it is kept in `approvers_from`."""
    approvers_from: Callable[[ApproverContext], Sequence[str]] | None = Field(default=None, exclude=True)
    """Names the approvers of one gated call; resolved into `approvers` by `evaluate` (never journaled)."""
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
    high_stakes_when: Condition | None = None
    # Checkpoint placement (issue 17), kept together: post-plan gating.
    plan: PlanPolicy | None = None
    """Ask for a plan before calls of this tool (see PlanPolicy); None: pre-act gating only."""

    # Confidence-gated checkpoints: reasons to stop a call that the fields above let run alone
    # (never to let one run): see countersign.tools.checkpoints.
    gate_below_confidence: float | None = Field(default=None, ge=0, le=1)
    """Stop a call whose reported confidence (0..1) is below this, or that reports none."""
    checks: tuple[str, ...] = Field(default=(), max_length=checkpoints.MAX_CHECKS)
    """CEL expressions over `args` and `results` (the run's earlier results by tool name) that must hold."""
    # When the pinned model is gone as the run goes on after this tool's approval.
    on_model_retired: ModelRetiredChoice | None = None
    """"end", or {"successor": "<model id>"}; a run's own choice (AgentTask.on_model_retired) comes first."""
    channels: tuple[ChannelName, ...] = ("email",)
    """How the request reaches each approver: `email` (the default), `slack`, or both."""
    approver_channels: dict[str, tuple[ChannelName, ...]] = Field(default_factory=dict)
    """Per approver (email -> channels), instead of `channels` for that person."""
    slack_channel: str | None = Field(default=None, pattern=r"^[A-Za-z0-9#][A-Za-z0-9._#-]{0,79}$")
    """A Slack channel (id or name) to post the request in, instead of a DM to each approver."""
    grants: GrantPolicy | None = None
    """Standing approvals an approver may give with an approval (see GrantPolicy); None: never offered."""

    def channels_for(self, approver: str) -> tuple[ChannelName, ...]:
        return self.approver_channels.get(approver.lower(), self.channels)

    def uses_channel(self, channel: ChannelName) -> bool:
        return channel in self.channels or any(channel in c for c in self.approver_channels.values())

    @field_validator("channels")
    @classmethod
    def _check_channels(cls, channels: tuple[ChannelName, ...]) -> tuple[ChannelName, ...]:
        return _distinct_channels(channels)

    @field_validator("approver_channels")
    @classmethod
    def _check_approver_channels(cls, table: dict[str, tuple[ChannelName, ...]]) -> dict[str, tuple[ChannelName, ...]]:
        for approver, channels in table.items():
            if not re.fullmatch(EMAIL_PATTERN, approver):
                raise ValueError(f"approver_channels: {approver!r} is not an email address")
            _distinct_channels(channels)
        return {a.lower(): c for a, c in table.items()}

    @model_validator(mode="before")
    @classmethod
    def _approvers_in_code(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and callable(data.get("approvers")):
            if data.get("approvers_from") is not None:
                raise ValueError("give approvers as a list or as a callable, not both")
            return {**data, "approvers": (), "approvers_from": data["approvers"]}
        return data

    @field_validator("when", "high_stakes_when")
    @classmethod
    def _check_condition(cls, when: Condition | None) -> Condition | None:
        if isinstance(when, str):
            check_condition(when)
        return when

    @field_validator("checks")
    @classmethod
    def _check_checks(cls, checks: tuple[str, ...]) -> tuple[str, ...]:
        for expression in checks:
            checkpoints.check_expression(expression)
        return checks

    @property
    def has_checkpoints(self) -> bool:
        return self.gate_below_confidence is not None or bool(self.checks)

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
        # Approvers named by a callable are counted when it has named them (see `evaluate`).
        if self.approvers_from is not None and self.approvers:
            raise ValueError("give approvers as a list or as a callable, not both")
        if self.approvers_from is None:
            if self.gated and not self.approvers:
                raise ValueError("a gated tool needs at least one approver")
            if self.has_checkpoints and not self.approvers:
                raise ValueError("gate_below_confidence and checks need at least one approver (who is asked)")
            if self.quorum > max(1, len(self.approvers)):
                raise ValueError(f"quorum {self.quorum} needs at least {self.quorum} approvers")
        if self.grants is not None and self.quorum > 1:
            raise ValueError("grants are for single-approver tools (quorum 1): a grant would stand in for a quorum")
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
        unless = self._checkpoints_text()
        if not self.gated:
            return f"{tool}: autonomous" + (f" unless {unless}" if unless else "")
        condition = f" when {describe_condition(self.when)}" if self.when else " always"
        if callable(self.when):
            condition += " holds"  # "when a condition in code holds", "when big_refund() holds"
        if self.approvers_from is not None:
            named = f"the approvers named by {name_of(self.approvers_from, 'a function in code')}"
            who = f", {self.quorum} of {named}" if self.quorum > 1 else f", by {named}"
        else:
            who = f", {self.quorum} of {len(self.approvers)} approvers" if self.quorum > 1 else ""
        return f"{tool}: needs approval{condition}{who}" + (f"; also when {unless}" if unless else "")

    def _checkpoints_text(self) -> str:
        parts = []
        if self.gate_below_confidence is not None:
            parts.append(f"the model's confidence is below {self.gate_below_confidence:.2f}")
        parts += [f"check `{c}` fails" for c in self.checks]
        return " or ".join(parts)


def _distinct_channels(channels: tuple[ChannelName, ...]) -> tuple[ChannelName, ...]:
    if not channels or len(set(channels)) != len(channels):
        raise ValueError("channels must name at least one of email, slack, each once")
    return channels


class PolicyVerdict(BaseModel):
    """The journaled answer for one call: gated or not, and the whole deadline policy that applies.

    `policy` is plain data: a condition or approvers given as callables were resolved by `evaluate`
    (the condition's answer is `gated`/`high_stakes`, its text is in `rule`)."""

    gated: bool
    rule: str
    policy: ToolPolicy
    high_stakes: bool = False
    version: str = ""
    """`policy_version` of the tool's policy that gave this answer (empty in older journals)."""
    stopped_because: list[StopReason] = Field(default_factory=list)
    """Why a call the policy would let run alone was stopped (confidence, failed checks); may be set on
    a gated call too, where it tells the approver what else was wrong."""
    webhooks: bool = True
    """Whether the tenant had webhook endpoints when this answer was journaled: the call's events are
    sent only then, so a replay never depends on the configuration (older journals: sent)."""


def evaluate(
    tool: str,
    policy: ToolPolicy,
    args: BaseModel | Mapping[str, Any],
    *,
    requester: str = "",
    tenant: str = "",
    confidence: float | None = None,
    results: Mapping[str, Any] | None = None,
) -> PolicyVerdict:
    """The policy's answer for one call, as plain data. `args` should be the validated arguments
    (a Mapping of JSON values is accepted too, as in tests). Raises PolicyError when approvers given
    as a callable cannot be named for a gated call; the call must then not run. `confidence` (what
    the model reported) and `results` (the run's earlier results by tool name) feed the checkpoints."""
    stopped = (
        checkpoints.stops(
            below=policy.gate_below_confidence,
            checks=policy.checks,
            args=cel_arguments(args),
            results=cel_arguments(results or {}),
            confidence=confidence,
        )
        if policy.has_checkpoints
        else []
    )
    gated = (policy.gated and (policy.when is None or condition_holds(policy.when, args))) or bool(stopped)
    high = policy.high_stakes and (policy.high_stakes_when is None or condition_holds(policy.high_stakes_when, args))
    resolved = _resolved(tool, policy, gated, ApproverContext(tool, args, requester, tenant))
    return PolicyVerdict(
        gated=gated,
        rule=policy.describe(tool),
        policy=resolved,
        high_stakes=gated and high,
        version=policy_version(tool, policy),
        stopped_because=stopped,
    )


def policy_version(tool: str, policy: ToolPolicy) -> str:
    """A short name of exactly this policy of `tool` (`p-` and 12 hex digits of a digest of its fields;
    a condition or approvers in code by their function's name): it changes when the policy does, so
    an audit entry can say which policy let a call run alone."""
    plain = policy.model_dump(mode="json", exclude={"when", "high_stakes_when", "approvers_from"})
    # How the request is delivered is not what gates the call: left at their defaults these fields
    # are not part of the version, so the versions of existing policies stay what they were.
    for name, default in (("channels", ["email"]), ("approver_channels", {}), ("slack_channel", None)):
        if plain.get(name) == default:
            plain.pop(name, None)
    plain["when"] = None if policy.when is None else describe_condition(policy.when)
    plain["high_stakes_when"] = None if policy.high_stakes_when is None else describe_condition(policy.high_stakes_when)
    plain["approvers_from"] = None if policy.approvers_from is None else name_of(policy.approvers_from, "code")
    if plain.get("grants") is None:  # a policy without grants keeps the version it had before them
        plain.pop("grants", None)
    if plain.get("plan") is None:  # a policy without a plan keeps the version it had before plans existed
        plain.pop("plan", None)
    for name in ("gate_below_confidence", "checks", "on_model_retired"):
        if not plain.get(name):  # left out at their defaults: the versions of older policies stay as they were
            plain.pop(name, None)
    canonical = json.dumps({"tool": tool, "policy": plain}, sort_keys=True, separators=(",", ":"))
    return "p-" + hashlib.sha256(b"countersign.policy.v1\x00" + canonical.encode()).hexdigest()[:12]


def _resolved(tool: str, policy: ToolPolicy, gated: bool, context: ApproverContext) -> ToolPolicy:
    changes: dict[str, Any] = {}
    if callable(policy.when):
        changes["when"] = None
    if callable(policy.high_stakes_when):
        changes["high_stakes_when"] = None
    if policy.approvers_from is not None:
        changes["approvers_from"] = None
        if gated:
            changes["approvers"] = _named(tool, policy.approvers_from, context)
        else:  # nobody is asked about this call, so nobody needs naming
            changes.update(gated=False, approvers=(), quorum=1, gate_below_confidence=None, checks=())
    if not changes:
        return policy
    try:
        return ToolPolicy.model_validate({**policy.model_dump(), **changes})
    except ValidationError as exc:
        raise PolicyError(f"the approvers named for {tool} are not valid: {errors_text(exc)}") from None


def _named(tool: str, source: Callable[[ApproverContext], Sequence[str]], context: ApproverContext) -> tuple[str, ...]:
    try:
        named = source(context)
    except Exception as exc:
        log.warning("the approvers of %s could not be named: %r", tool, exc)
        raise PolicyError(f"the approvers of {tool} could not be named: {type(exc).__name__}: {exc}") from None
    if isinstance(named, str | bytes) or not isinstance(named, Sequence | set | frozenset):
        raise PolicyError(f"the approvers of {tool} must be a list of emails, not {type(named).__name__}")
    if not all(isinstance(n, str) for n in named):
        raise PolicyError(f"the approvers of {tool} must be a list of emails (strings)")
    return tuple(named)


def errors_text(exc: ValidationError) -> str:
    """A pydantic error on one line: `field: message; ...`."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'policy'}: {e['msg']}" for e in exc.errors())

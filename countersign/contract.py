"""Pydantic models of the public contract: what callers send to and get back from `AgentRun`.

Guarantee: every handler input and output is one of these models; unknown fields are refused, so a
typo in a request is a clear 4xx, never a silently ignored setting.
"""

from __future__ import annotations

import json
from decimal import Decimal
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

# ASCII letters, digits and `._%+-` before the @: addresses are shown to people in emails and pages
# and used as object keys, so no commas (a second recipient), quotes, angle brackets, control,
# invisible or bidirectional characters. Use it with `re.fullmatch` (`$` alone lets a final newline in).
EMAIL_PATTERN = r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,190}\.[A-Za-z]{2,24}$"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MAX_TOOL_ARGS_BYTES = 64 * 1024
"""The most one tool call's arguments may weigh as JSON (the demo tools' largest valid call is ~5 KB)."""
MAX_WHY = 2000
"""The longest `why` of a call or plan, in characters (what the approver reads as the reason for it)."""
MAX_GOAL = 4000
"""The longest `goal` of a run, in characters."""


def clipped(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the cut marked with "…": how a `why` or `goal` longer than its
    bound is kept (it tells the approver about a call, and is never what is approved)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def args_size(args: dict[str, Any]) -> int:
    return len(json.dumps(args, ensure_ascii=False, separators=(",", ":")).encode())


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Outcome(StrEnum):
    """What happened to one proposed tool call (shown to the model, in status, result and audit)."""

    AUTONOMOUS = "autonomous"
    APPROVED = "approved"
    APPROVED_WITH_EDITS = "approved_with_edits"
    REJECTED = "rejected"
    EXPIRED = "expired"
    ESCALATED = "escalated"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    UNDELIVERABLE = "undeliverable"
    INVALID = "invalid"
    FAILED = "failed"
    GRANTED = "granted"
    """Ran without a person, covered by a standing approval (`grant_id` names it)."""


class Successor(Strict):
    """`on_model_retired = {successor = "<model id>"}`: continue the run on this model."""

    successor: str = Field(min_length=1, max_length=120)


ModelRetiredChoice = Literal["end"] | Successor
"""What a run does when its pinned model is gone (the provider answers 404 model not found): go on
with a named successor, or `end` with the status `model_retired` (a fresh plan is needed)."""


class StopReason(BaseModel):
    """Why a call that its policy would let run alone was stopped for a person (confidence-gated
    checkpoints): `confidence` (the model reported low confidence) or `check` (a declared check on
    the call failed or could not be evaluated). `text` is shown on the page, in the email and audit."""

    kind: Literal["confidence", "check"]
    text: str


class ScriptStep(Strict):
    tool: str = Field(min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)
    why: str = Field(default="", max_length=MAX_WHY)
    if_rejected: ScriptStep | None = Field(default=None, description="proposed next if this call is rejected")
    also: list[ScriptStep] = Field(default_factory=list, max_length=10, description="proposed in the same turn")
    confidence: float | None = Field(default=None, ge=0, le=1, description="the confidence the model reports")

    @field_validator("args")
    @classmethod
    def _bounded(cls, args: dict[str, Any]) -> dict[str, Any]:
        if (size := args_size(args)) > MAX_TOOL_ARGS_BYTES:
            raise ValueError(f"the arguments are {size} bytes of JSON; at most {MAX_TOOL_ARGS_BYTES} are accepted")
        return args


# --- Post-plan gating: a plan of intended tool calls, approved once (see countersign/approval/plan.py).


MAX_PLAN_FORM_FIELDS = 50
"""A plan's editable fields on its page, bounded so that they and the page's own few fields stay under
the pages' form-field cap (60) and a plan can always be decided."""


class PlanStep(Strict):
    """One intended kind of call: `tool`, with `args` fixed to these values, each field of `one_of`
    taking one of its values, each number of `at_most` at most its bound, at most `calls` times."""

    tool: str = Field(min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict, max_length=20)
    one_of: dict[str, list[Any]] = Field(default_factory=dict, max_length=10)
    at_most: dict[str, Decimal] = Field(default_factory=dict, max_length=10)
    calls: int = Field(default=1, ge=1, le=100)
    why: str = Field(default="", max_length=MAX_WHY)

    @field_validator("at_most")
    @classmethod
    def _finite(cls, bounds: dict[str, Decimal]) -> dict[str, Decimal]:
        if not all(b.is_finite() for b in bounds.values()):
            raise ValueError("a bound must be a finite number")
        return bounds


class Plan(Strict):
    """An ordered list of intended calls; `max_calls` bounds them all together (default: the sum of
    the steps' `calls`)."""

    steps: list[PlanStep] = Field(min_length=1, max_length=50)
    max_calls: int | None = Field(default=None, ge=1, le=500)
    why: str = Field(default="", max_length=MAX_WHY)

    @model_validator(mode="after")
    def _bounded(self) -> Plan:
        if (size := args_size(self.model_dump(mode="json"))) > MAX_TOOL_ARGS_BYTES:
            raise ValueError(f"the plan is {size} bytes of JSON; at most {MAX_TOOL_ARGS_BYTES} are accepted")
        if (fields := self.form_fields) > MAX_PLAN_FORM_FIELDS:
            raise ValueError(
                f"the plan needs {fields} fields on its approval page (1 + per step 2 + one per at_most bound); "
                f"at most {MAX_PLAN_FORM_FIELDS} fit: use fewer steps or bounds"
            )
        return self

    @property
    def form_fields(self) -> int:
        """How many editable fields its approval page has (see `countersign.approval.plan.editable_fields`)."""
        return 1 + sum(2 + len(step.at_most) for step in self.steps)

    @property
    def total(self) -> int:
        every = sum(s.calls for s in self.steps)
        return every if self.max_calls is None else min(self.max_calls, every)


class PlanOptions(Strict):
    """`AgentTask.plan`: ask the model for a plan before it acts; approved once, then followed."""

    on_deviation: Literal["ask", "refuse"] | None = None
    """A gated call outside the approved plan: a fresh approval (`ask`) or refused; by default the
    tool's `plan.on_deviation`, else `ask`."""
    script: Plan | None = None
    """The scripted model's plan (by default: its script's steps, each with its exact arguments)."""


class AgentTask(Strict):
    """Input of `AgentRun.run`."""

    goal: str = Field(min_length=1, max_length=MAX_GOAL)
    requester: str = Field(pattern=EMAIL_PATTERN)
    tenant: str = Field(default="default", pattern=NAME_PATTERN)
    model: str | None = Field(default=None, max_length=120)
    script: list[ScriptStep] | None = Field(default=None, max_length=200)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32)
    plan: PlanOptions | None = None
    """Ask the model for a plan first (a tool whose policy has a `plan` table asks too)."""
    on_model_retired: ModelRetiredChoice | None = Field(
        default=None, description='"end" or {"successor": "<model id>"}; else the policy\'s choice, else "end"'
    )

    # Set only by the input serde when the request body did not validate; see agent_run.TaskSerde.
    _refusal: str | None = PrivateAttr(default=None)

    @classmethod
    def refused(cls, message: str) -> AgentTask:
        task = cls.model_construct(goal="", requester="")
        task._refusal = message
        return task

    @property
    def refusal(self) -> str | None:
        return self._refusal


DecisionSource = Literal["human", "deadline_default", "system", "grant"]
AskedBy = Literal["agent", "code"]
"""Who asked for an approval: an agent (AgentRun, a framework adapter) or a handler's own code."""


class ActionRecord(BaseModel):
    """One proposed tool call and what became of it. `args` are the executed ones (None if not run)."""

    index: int
    tool: str
    proposed_args: dict[str, Any]
    args: dict[str, Any] | None = None
    edits: dict[str, Any] | None = None
    outcome: Outcome
    decision_source: DecisionSource | None = None
    approval_id: str | None = None
    approved_by: list[str] = Field(default_factory=list)
    reason: str | None = None
    result: dict[str, Any] | None = None
    idempotency_key: str | None = None
    plan_approval_id: str | None = None
    """The approval of the plan this call ran inside (no approval of its own), if any."""
    deviation: str | None = None
    """How this call departed from the approved plan (it was then asked again or refused)."""
    grant_id: str | None = None
    """The standing approval that let this call run without a person (`approved_by` names who gave it)."""


class ModelSwitch(BaseModel):
    """The pinned model was gone on a turn (provider 404): what the run did about it."""

    retired: str
    successor: str | None = None
    """The model the run went on with; None when the run ended (status `model_retired`)."""
    turn: int
    detail: str = ""
    """The provider's own words."""


class RunResult(BaseModel):
    """Output of `AgentRun.run`. `model_retired`: the pinned model was gone and the run's choice was
    to end; the approved actions ran, and a fresh plan (a new run) is needed for what follows."""

    run_id: str
    status: Literal["completed", "failed", "cancelled", "model_retired"]
    answer: str
    model: str
    actions: list[ActionRecord]


Phase = Literal["planning", "acting", "awaiting_approval", "completed", "failed", "cancelled", "model_retired"]
ApprovalState = Literal[
    "pending",
    "approved",
    "approved_with_edits",
    "rejected",
    "expired",
    "cancelled",
    "superseded",
    "undeliverable",
    "failed",
]


class Vote(BaseModel):
    """One approver slot's decision in one round."""

    slot: int
    round: int
    kind: str
    by: str | None = None
    at: float
    reason: str | None = None


class Fact(BaseModel):
    """One labelled fact a tool's `context` function read for the approver (e.g. "Order total": "$612.40")."""

    label: str
    value: str


class TrailStep(BaseModel):
    """One earlier call of the run, as the approver sees it: what it was, how it ended, in short."""

    index: int
    tool: str
    outcome: str
    args: str = ""
    """The call's arguments, shortened."""
    result: str = ""
    """Its result (or error), shortened."""


class GrantScope(BaseModel):
    """What a standing approval covers: calls of one tool for `scope_value` (a requester's email or a
    tenant), each `same` field equal to the approved call's, each `at_most` field (a number, as text)
    no larger, at most `max_uses` of them."""

    max_uses: int
    scope: Literal["requester", "tenant"]
    scope_value: str
    same: dict[str, Any] = Field(default_factory=dict)
    at_most: dict[str, str] = Field(default_factory=dict)


class GrantOffer(GrantScope):
    """A standing approval an approver may give with their approval: calls like this one run without
    asking, for up to `max_seconds`; `words` says its scope in plain words."""

    max_seconds: int
    words: str


class ApprovalRecord(BaseModel):
    """A frozen action waiting for (or past) a human decision. `digest` binds the exact arguments.

    `approvers` are slots: escalation appends, never reorders, so a slot number stays one person.
    `nonces[r - 1]` is round r's nonce; a new round (escalation, re-approval) makes older links stale.
    """

    approval_id: str
    run_id: str
    tenant: str
    index: int
    tool: str
    args: dict[str, Any]
    digest: str
    summary: str
    why: str
    policy: str
    requester: str
    approvers: list[str]
    quorum: int = 1
    active_slots: list[int]
    round: int = 1
    nonces: list[str]
    requested_at: float
    round_started_at: float
    deadline: float
    editable: dict[str, str] = Field(default_factory=dict)
    confirm_field: str | None = Field(default=None, description="high stakes: what the approver retypes")
    batch: list[int] = Field(default_factory=list, description="indexes of the approvals asked together")
    change_note: str | None = None
    reminders_sent: int = 0
    escalations: int = 0
    votes: list[Vote] = Field(default_factory=list)
    state: ApprovalState = "pending"
    decision_source: DecisionSource | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    decided_via: str | None = Field(default=None, description="the channel the deciding person used: email, slack")
    reason: str | None = None
    approved_by: list[str] = Field(default_factory=list)
    edits: dict[str, Any] | None = None
    context: list[Fact] = Field(default_factory=list, description="facts the tool read when the call was frozen")
    context_error: str | None = Field(default=None, description="why the tool's facts could not be read")
    trail: list[TrailStep] = Field(default_factory=list, description="the run's earlier calls, before this one")
    policy_version: str = Field(default="", description="the version of the tool's policy that gated the call")
    kind: Literal["action", "plan", "question"] = Field(
        default="action",
        description="a plan: `args` is the frozen Plan; a question: `args` holds its text and form, "
        "and the approving verdict's `edits` are the answer",
    )
    asked_by: AskedBy = Field(
        default="agent",
        description="who asked: an agent, or a handler's own code (the email and page word the request by it); "
        "records of earlier versions were all worded as an agent's",
    )
    deviation: str | None = Field(default=None, description="how this call departs from the approved plan")
    stopped_because: list[StopReason] = Field(
        default_factory=list, description="why a call the policy would let run alone was stopped (checkpoints)"
    )
    confidence: float | None = Field(default=None, description="the confidence the model reported in the call")
    webhooks: bool = Field(
        default=True, description="whether its events go to the tenant's webhooks (journaled with the policy's answer)"
    )
    grant_offer: GrantOffer | None = Field(
        default=None, description="the standing approval the approver may give with an approval (None: none offered)"
    )
    grant_missed: str | None = Field(
        default=None, description="why a standing approval of this tool did not cover this call (the bound it missed)"
    )
    grant_id: str | None = Field(default=None, description="the standing approval given with this approval, if any")

    @property
    def nonce(self) -> str:
        return self.nonces[self.round - 1]

    @property
    def asker(self) -> Literal["agent", "workflow"]:
        """Who asked, as the emails and pages name it: an agent (an agent run or a framework adapter)
        or a workflow (a handler's own code, through the library calls)."""
        return "agent" if self.asked_by == "agent" else "workflow"

    def approvals_in_round(self) -> list[Vote]:
        return [v for v in self.votes if v.round == self.round and v.kind == "approve"]


class PendingApproval(BaseModel):
    approval_id: str
    tool: str
    args: dict[str, Any]
    digest: str
    approvers: list[str]
    quorum: int
    approvals: int
    round: int
    escalated: bool
    deadline: float
    age_seconds: float


class RunStatus(BaseModel):
    """Output of `AgentRun.status`."""

    run_id: str
    phase: Phase | Literal["unknown"]
    goal: str | None = None
    requester: str | None = None
    model: str | None = None
    pending: list[PendingApproval] = Field(default_factory=list)
    approvals: list[ApprovalRecord] = Field(default_factory=list)
    history: list[ActionRecord] = Field(default_factory=list)
    answer: str | None = None
    model_switches: list[ModelSwitch] = Field(default_factory=list)


class Decision(Strict):
    """Input of `AgentRun.decide`: a person's verdict, carried by the link token they were sent."""

    token: str = Field(min_length=10, max_length=400)
    verdict: Literal["approve", "reject"]
    reason: str = Field(default="", max_length=2000)
    edits: dict[str, str] = Field(default_factory=dict, max_length=20)
    confirm: str = Field(default="", max_length=200, description="high stakes: the retyped amount, id or fingerprint")
    client: str = Field(default="", max_length=300)
    grant_seconds: int | None = Field(
        default=None, description="approve and give a standing approval for this long (only where one is offered)"
    )


class DecisionReceipt(BaseModel):
    """Output of `AgentRun.decide`. `accepted` is false when another completion won first.

    `state` is how this approver's decision point ended: approved, approved_with_edits, rejected,
    expired, cancelled, escalated (handed to the next approver), superseded, undeliverable."""

    accepted: bool
    approval_id: str
    state: str
    decided_by: str | None = None
    decided_at: float | None = None
    decided_via: str | None = None
    reason: str | None = None
    edits: dict[str, Any] | None = None
    quorum: int = 1


class CancelRequest(Strict):
    reason: str = Field(min_length=1, max_length=2000)
    by: str | None = Field(
        default=None, min_length=1, max_length=200, description="who asked (recorded in the audit trail)"
    )


class ReassignRequest(Strict):
    """Input of `AgentRun.reassign`: hand one approver's part of a pending approval to someone else."""

    approval_id: str = Field(min_length=1, max_length=200)
    to: str = Field(pattern=EMAIL_PATTERN)
    replacing: str | None = Field(default=None, pattern=EMAIL_PATTERN, description="needed when several decide")
    reason: str = Field(default="", max_length=2000)
    by: str | None = Field(
        default=None, min_length=1, max_length=200, description="who asked (recorded in the audit trail)"
    )


class PageView(Strict):
    """Input of `Approval.viewed`: an approval page was opened with this link (re-verified there)."""

    token: str = Field(min_length=10, max_length=400)
    client: str = Field(default="", max_length=300)


_FORM_TEXT = 64 * 1024
"""The longest text a page's form field can carry (the pages read at most 64 KiB of form)."""


class PageSubmission(Strict):
    """Input of `Approval.submit`: an approval page's POST as its form said it, after the page's own
    checks (same origin, CSRF, form size). The decision rules are `decide`'s: `edits` that the record
    does not let be edited are refused, as are a missing verdict or reason and a wrong confirmation."""

    token: str = Field(min_length=10, max_length=400)
    verdict: str = Field(default="", max_length=20, description="the form's value; approve or reject decide")
    reason: str = Field(default="", max_length=_FORM_TEXT)
    edits: dict[str, str] = Field(default_factory=dict, max_length=60, description="`edit.<field>` values")
    confirm: str = Field(default="", max_length=200)
    client: str = Field(default="", max_length=300)
    reviewed: str = Field(default="", max_length=100, description="the review form's marker of the edits it showed")
    grant: str = Field(default="", max_length=20, description="the form's standing approval's seconds, if any")


class PageNotice(BaseModel):
    """A refusal page: its HTTP status, title and text, exactly as the page shows it."""

    status: int
    title: str
    text: str


class Submitted(BaseModel):
    """Output of `Approval.submit`: the approval's record (None when the link did not name it) and
    what became of the POST. `receipt`: it decided (or learnt who did first, `accepted` false).
    Otherwise `refused` says why nothing was decided, or `takeover` what the page does itself:
    `unknown` (the workflow has not saved its record yet: the page waits for it), `batch` (the batch
    page reads its items afresh and decides each), `review` (a long text was edited: the page shows
    the diff of `edits` for review first). Restate keeps this answer under the POST's idempotency
    key for a day: nothing authorises on it later."""

    record: ApprovalRecord | None = None
    receipt: DecisionReceipt | None = None
    refused: PageNotice | None = None
    takeover: Literal["unknown", "batch", "review"] | None = None
    verdict: Literal["approve", "reject"] | None = None
    reason: str = ""
    edits: dict[str, str] = Field(default_factory=dict, description="the edits it read: those of editable fields")
    confirm: str = ""
    grant: str = Field(default="", description="the standing approval's seconds it read (carried through a review)")


class ReassignReceipt(BaseModel):
    approval_id: str
    accepted: bool
    replaced: str | None = None
    to: str
    by: str | None = None


class CancelReceipt(BaseModel):
    run_id: str
    accepted: bool
    cancelled_approvals: list[str]

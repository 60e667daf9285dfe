"""Asking a person a question with a typed answer: the caller's step and the answer it gets back.

`countersign.approval.calls.ask_person` is the public call built on these.

Guarantee: the caller's side is one journaled step (open the first round: nonce and time) and one
durable call to the same `Approval` workflow that decides actions and plans (act `report`: a
question runs nothing), so a question is emailed, reminded, escalated, expires (to its default
answer, if one was declared), can be cancelled or reassigned, survives a crash and is audited
exactly as an approval. What the person typed decides only if it validates against the form frozen
into the record (`countersign.approval.question`), and the caller gets it back as its own model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Generic, Literal, TypeVar

import restate
from pydantic import BaseModel, Field, ValidationError, create_model
from restate import RunOptions, TerminalError

from countersign.approval.edits import EditRejected
from countersign.approval.gate import freeze_asked
from countersign.approval.handover import asked_alone
from countersign.approval.question import (
    MAX_TEXT,
    QUESTION_TOOL,
    QuestionField,
    form_of,
    form_values,
    parse_answer,
)
from countersign.approval.rounds import Opening, open_round
from countersign.approval.run_state import RunBook, RunFacts
from countersign.approval.workflow import ApprovalRequest
from countersign.channels import missing_slack_setting, uses_slack
from countersign.contract import ActionRecord, ApprovalRecord, DecisionSource, Outcome, clipped
from countersign.settings import get_settings
from countersign.tools.asking import ASK_A_PERSON, AskAPerson
from countersign.tools.policy import PolicyVerdict, ToolPolicy, errors_text

M = TypeVar("M", bound=BaseModel)

_OPEN_STEP = RunOptions[Opening](max_attempts=3, initial_retry_interval=timedelta(milliseconds=100))

AnswerOutcome = Literal["answered", "defaulted", "declined", "expired", "cancelled", "undeliverable", "failed"]
_OUTCOMES: dict[Outcome, AnswerOutcome] = {
    Outcome.APPROVED: "answered",
    Outcome.APPROVED_WITH_EDITS: "answered",
    Outcome.REJECTED: "declined",
    Outcome.EXPIRED: "expired",
    Outcome.CANCELLED: "cancelled",
    Outcome.UNDELIVERABLE: "undeliverable",
}


def ended_as(outcome: Outcome, source: str | None) -> AnswerOutcome:
    """How a question whose action ended in `outcome` ended, in `ask_person`'s words: answered, or
    defaulted when the deadline (its decision `source`) approved it."""
    answered = _OUTCOMES.get(outcome, "failed")
    return "defaulted" if answered == "answered" and source == "deadline_default" else answered


def answer_outcome(state: str, source: str | None = None) -> str:
    """`ended_as` for a question's record in `state`; a state no question ends in (pending, say) as it is."""
    try:
        return ended_as(Outcome(state), source)
    except ValueError:
        return state


class PersonAnswer(BaseModel, Generic[M]):
    """What `ask_person` returns: the typed answer (when there is one) and how the question ended."""

    outcome: AnswerOutcome
    """answered; defaulted (the deadline passed and the declared default stands); declined (with a
    reason); expired (no default); cancelled; undeliverable; failed (see `reason`)."""
    answer: M | None = None
    """The person's answer (or the default), validated as the answer model; None otherwise."""
    answered_by: str | None = None
    reason: str | None = None
    decision_source: DecisionSource | None = None
    approval_id: str
    run_id: str
    index: int

    @property
    def answered(self) -> bool:
        return self.answer is not None


def question_policy(
    to: Sequence[str] | str,
    *,
    deadline_seconds: int,
    reminders_seconds: tuple[int, ...],
    escalate_after_seconds: int | None,
    escalate_to: Sequence[str] | str,
    has_default: bool,
    channels: Sequence[str] | str = ("email",),
    approver_channels: Mapping[str, Sequence[str] | str] | None = None,
    slack_channel: str | None = None,
) -> ToolPolicy:
    """The question's waiting rules and channels as a policy; a terminal 400 when they are not valid.
    A list of people or channels may be given as one text (`"ops@example.com"`, `"slack"`)."""
    try:
        # Validated as a policy is, values and all: what is not a channel is refused here.
        policy = ToolPolicy.model_validate(
            {
                "gated": True,
                "approvers": _listed(to),
                "deadline_seconds": deadline_seconds,
                "reminders_seconds": reminders_seconds,
                "escalate_after_seconds": escalate_after_seconds,
                "escalate_to": _listed(escalate_to),
                # A default answer is what the deadline decides; without one, the question expires.
                "timeout_outcome": "allow" if has_default else "deny",
                "low_risk": has_default,
                "channels": _listed(channels),
                "approver_channels": {person: _listed(c) for person, c in (approver_channels or {}).items()},
                "slack_channel": slack_channel,
            }
        )
    except ValidationError as exc:
        raise TerminalError(
            f"the question's people, times or channels are not valid: {errors_text(exc)}", 400
        ) from None
    # As a policy that names Slack stops the start without these, a question that names it is refused.
    if uses_slack(policy) and (setting := missing_slack_setting(get_settings())) is not None:
        raise TerminalError(f"{setting} is not set: the question names Slack among its channels", 400)
    return policy


def _listed(names: Sequence[str] | str) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else tuple(names)


@dataclass(frozen=True)
class Question:
    """What is asked: the text, the form, the default answer's JSON and the waiting rules."""

    text: str
    fields: list[QuestionField]
    default: dict[str, Any] | None
    policy: ToolPolicy
    why: str


def freeze_question(facts: RunFacts, index: int, question: Question, opening: Opening) -> ApprovalRecord:
    """The approval record of a question: its text, form and default frozen as its `args`."""
    fields = [f.model_dump(mode="json") for f in question.fields]
    asker = "agent" if facts.asked_by == "agent" else "workflow"
    return freeze_asked(
        facts,
        index,
        tool=QUESTION_TOOL,
        kind="question",
        args={"question": question.text, "fields": fields, "default": question.default},
        summary=clipped(f"Question: {question.text}", 200),
        why=question.why,
        verdict=PolicyVerdict(gated=True, rule=f"a question from {facts.requester}'s {asker}", policy=question.policy),
        opening=opening,
        editable={f.name: "your answer" for f in question.fields},
    )


async def ask_question(
    ctx: restate.Context, facts: RunFacts, answer_model: type[M], index: int, question: Question
) -> PersonAnswer[M]:
    """The question's approval at `<run_id>-a<index>`, awaited, and its answer as `answer_model`."""
    opening = await ctx.run_typed(f"ask person #{index}", open_round, _OPEN_STEP)
    return await _asked(ctx, facts, answer_model, index, question, opening)


async def _asked(
    ctx: restate.Context,
    facts: RunFacts,
    answer_model: type[M],
    index: int,
    question: Question,
    opening: Opening,
    book: RunBook | None = None,
) -> PersonAnswer[M]:
    """The question frozen with its first round `opening`, asked and awaited; with `book` (an agent
    run), the run's status lists it while it waits, a cancel of the run cancels it, and the run keeps
    its final record (as for a plan's approval)."""
    record = freeze_question(facts, index, question, opening)
    verdict = PolicyVerdict(gated=True, rule=record.policy, policy=question.policy)
    request = ApprovalRequest(record=record, policy=verdict, goal=facts.goal, model=facts.model, act="report")
    try:
        result = await asked_alone(ctx, request, book)
    except TerminalError as exc:
        if exc.status_code != 409:
            raise
        raise TerminalError(
            f"question {record.approval_id} was already asked (run_id {record.run_id!r}, index {index}): "
            "a run_id and index place one question, once; pass a new run_id or index to ask again",
            409,
        ) from None
    action = result.action
    outcome = ended_as(action.outcome, action.decision_source)
    answer: M | None = None
    answered_by = result.record.decided_by
    if outcome in ("answered", "defaulted") and action.args is not None:
        answered_by = None if outcome == "defaulted" else ", ".join(action.approved_by) or None
        try:
            answer = answer_model.model_validate(action.args)
        except ValidationError as exc:  # only if the model changed since it was asked
            outcome, action.reason = "failed", f"the answer no longer fits {answer_model.__name__}: {errors_text(exc)}"
    return PersonAnswer[M](
        outcome=outcome,
        answer=answer,
        answered_by=answered_by,
        reason=action.reason,
        decision_source=action.decision_source,
        approval_id=record.approval_id,
        run_id=facts.run_id,
        index=index,
    )


def _tool_answer_model(asked: AskAPerson) -> type[BaseModel]:
    """The form of a question the model asked: one field, a choice among `choices` or else text."""
    if asked.choices:
        kind: Any = Literal.__getitem__(tuple(asked.choices))
    else:
        kind = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    model: type[BaseModel] = create_model("Answer", answer=(kind, Field(title="Your answer")))
    return model


# How a question the model asked ended, as the outcome of its `ask_a_person` call.
_TOOL_OUTCOMES: dict[AnswerOutcome, Outcome] = {
    "answered": Outcome.APPROVED,
    "defaulted": Outcome.APPROVED,
    "declined": Outcome.REJECTED,
    "expired": Outcome.EXPIRED,
    "cancelled": Outcome.CANCELLED,
    "undeliverable": Outcome.UNDELIVERABLE,
    "failed": Outcome.FAILED,
}


async def ask_with_tool(
    ctx: restate.Context,
    facts: RunFacts,
    index: int,
    args: dict[str, Any],
    verdict: PolicyVerdict,
    opening: Opening,
    why: str,
    book: RunBook | None = None,
) -> ActionRecord:
    """A gated `ask_a_person` call (`countersign.tools.asking`), asked as a question with its first
    round `opening` (from the gate's answer) and the waiting rules of the tool's policy; its record
    carries the person's answer as the call's result. Only the first to answer decides, and the
    deadline has no default answer: a question nobody answered expires."""
    asked = AskAPerson.model_validate(args)
    answer_model = _tool_answer_model(asked)
    rules = {"quorum": 1, "timeout_outcome": "deny", "low_risk": False, "high_stakes": False, "grants": None}
    policy = verdict.policy.model_copy(update={**rules, "high_stakes_when": None})
    question = Question(asked.question, form_of(answer_model), None, policy, why)
    answered = await _asked(ctx, facts, answer_model, index, question, opening, book)
    result = None
    if answered.answer is not None:
        result = {"answer": answered.answer.model_dump(mode="json")["answer"], "answered_by": answered.answered_by}
    return ActionRecord(
        index=index,
        tool=ASK_A_PERSON,
        proposed_args=args,
        args=args if answered.answer is not None else None,  # None: not answered, as for a call not run
        outcome=_TOOL_OUTCOMES[answered.outcome],
        decision_source=answered.decision_source,
        approval_id=answered.approval_id,
        approved_by=[answered.answered_by] if answered.answered_by and answered.answer is not None else [],
        reason=answered.reason,
        result=result,
    )


def default_answer(answer_model: type[BaseModel], fields: list[QuestionField], default: BaseModel | None) -> Any:
    """The default answer's JSON, checked to be an answer the form could give; a terminal 400 otherwise."""
    if default is None:
        return None
    if not isinstance(default, answer_model):
        raise TerminalError(f"default must be a {answer_model.__name__}, not {type(default).__name__}", 400)
    plain = default.model_dump(mode="json")
    try:
        return parse_answer(fields, form_values(plain))
    except EditRejected as exc:
        raise TerminalError(f"the default answer does not fit the form: {exc}", 400) from None

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

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

import restate
from pydantic import BaseModel, ValidationError
from restate import RunOptions, TerminalError

from countersign.approval.edits import EditRejected
from countersign.approval.gate import freeze_asked
from countersign.approval.question import QUESTION_TOOL, QuestionField, form_values, parse_answer
from countersign.approval.rounds import Opening, open_round
from countersign.approval.run_state import RunFacts
from countersign.approval.workflow import ApprovalRequest
from countersign.approval.workflow import run as approval_run
from countersign.contract import ApprovalRecord, DecisionSource, Outcome, clipped
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
    to: tuple[str, ...],
    *,
    deadline_seconds: int,
    reminders_seconds: tuple[int, ...],
    escalate_after_seconds: int | None,
    escalate_to: tuple[str, ...],
    has_default: bool,
) -> ToolPolicy:
    """The question's waiting rules as a policy; a terminal 400 when they are not valid."""
    try:
        return ToolPolicy(
            gated=True,
            approvers=to,
            deadline_seconds=deadline_seconds,
            reminders_seconds=reminders_seconds,
            escalate_after_seconds=escalate_after_seconds,
            escalate_to=escalate_to,
            # A default answer is what the deadline decides; without one, the question expires.
            timeout_outcome="allow" if has_default else "deny",
            low_risk=has_default,
        )
    except ValidationError as exc:
        raise TerminalError(f"the question's people or times are not valid: {errors_text(exc)}", 400) from None


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
    record = freeze_question(facts, index, question, opening)
    verdict = PolicyVerdict(gated=True, rule=record.policy, policy=question.policy)
    request = ApprovalRequest(record=record, policy=verdict, goal=facts.goal, model=facts.model, act="report")
    try:
        result = await ctx.workflow_call(approval_run, key=record.approval_id, arg=request)
    except TerminalError as exc:
        if exc.status_code != 409:
            raise
        raise TerminalError(
            f"question {record.approval_id} was already asked (run_id {record.run_id!r}, index {index}): "
            "a run_id and index place one question, once; pass a new run_id or index to ask again",
            409,
        ) from None
    action = result.action
    outcome = _OUTCOMES.get(action.outcome, "failed")
    answer: M | None = None
    answered_by = result.record.decided_by
    if outcome == "answered" and action.args is not None:
        answered_by = ", ".join(action.approved_by) or None
        if action.decision_source == "deadline_default":
            outcome, answered_by = "defaulted", None
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

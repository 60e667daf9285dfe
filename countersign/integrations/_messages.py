"""What a framework's model is told of a gated call that did not run: the same words from every adapter
that hands the model the gate's record as text (Pydantic AI, LangChain, Google ADK).

Guarantee: a pure function of the gate's journaled record, so a replay tells the model the same thing.
"""

from __future__ import annotations

from countersign.contract import ActionRecord, Outcome

RAN = frozenset({Outcome.APPROVED, Outcome.APPROVED_WITH_EDITS, Outcome.AUTONOMOUS})
"""The outcomes of a call whose effect ran and succeeded."""


def denial_message(record: ActionRecord) -> str:
    """What the model reads when a call did not run, or ran and failed (the gate's record of it)."""
    reason = record.reason or (record.result or {}).get("error") or "no reason given"
    match record.outcome:
        case Outcome.REJECTED if record.decision_source == "system":  # e.g. a call outside the plan, refused
            return f"Rejected: {reason}. Do not propose this exact call again."
        case Outcome.REJECTED:
            return f"Rejected by the approver: {reason}. Do not propose this exact call again."
        case Outcome.EXPIRED:
            return f"Not run: the approval expired before anyone decided ({reason})."
        case Outcome.CANCELLED:
            return f"Not run: the approval was cancelled ({reason})."
        case Outcome.UNDELIVERABLE:
            return f"Not run: the approval request could not be delivered to the approvers ({reason})."
        case _:
            return f"Not run ({record.outcome.value}): {reason}"

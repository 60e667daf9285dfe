"""A model that retired (its provider answers 404) in the middle of a run: what follows.

Guarantee: the choice (the run's `on_model_retired`, else the policy of the tool the run last
gated, else "end") is journaled with the model turn that met the retirement, so a replay takes the
same branch; a run that goes on with a successor records the switch in its state and audit trail,
and one that ends says that what was approved or run has run from its frozen arguments.
"""

from __future__ import annotations

from pydantic import BaseModel

from countersign.approval import ledger
from countersign.approval.run_state import RunBook
from countersign.contract import (
    ModelRetiredChoice,
    ModelSwitch,
    Successor,
)
from countersign.objects.audit import AuditEntry
from countersign.security import links
from countersign.tools import default_registry


class Retired(BaseModel):
    """The model was gone on this turn (provider 404), and what the run's (or policy's) choice says."""

    detail: str
    choice: ModelRetiredChoice
    successor_problem: str | None = None
    """Why the named successor cannot be used (not a known model id, no key for its provider)."""


def retired_choice(run_choice: ModelRetiredChoice | None, tool: str | None) -> ModelRetiredChoice:
    """What follows a retired model: the run's own choice, else the policy of the tool whose approval
    the run last asked for, else "end". For a user's own loop too (pass the tool it last gated)."""
    if run_choice is not None:
        return run_choice
    found = default_registry().get(tool) if tool else None
    return (found.policy.on_model_retired if found else None) or "end"


def last_gated(book: RunBook) -> str | None:
    """The tool of the run's latest approval (whose policy may say what follows a retired model)."""
    latest = max(book.state.approvals.values(), key=lambda r: r.index, default=None)
    return latest.tool if latest else None


def after_retirement(book: RunBook, turn: int, model: str, retired: Retired) -> str | None:
    """Record the retirement (run state and audit trail); the successor to go on with, or None to end."""
    choice = retired.choice
    go_on = isinstance(choice, Successor) and retired.successor_problem is None and choice.successor != model
    successor = choice.successor if isinstance(choice, Successor) else None
    detail = retired.detail
    if retired.successor_problem:
        detail += f"; successor {successor}: {retired.successor_problem}"
    switch = ModelSwitch(retired=model, successor=successor if go_on else None, turn=turn, detail=detail)
    book.state.model_switches.append(switch)
    if go_on:
        book.state.model = successor or model
    book.save()
    latest = max(book.state.approvals.values(), key=lambda r: r.index, default=None)
    approval_id = latest.approval_id if latest else links.approval_id(book.state.run_id, len(book.state.actions))
    ledger.note(
        book,
        AuditEntry(
            entry_id=f"model_retired/t{turn}",
            approval_id=approval_id,
            run_id=book.state.run_id,
            tenant=book.state.tenant,
            kind="model_retired",
            at=(latest.decided_at or latest.requested_at) if latest else 0.0,
            details={**switch.model_dump(), "outcome": "successor" if go_on else "ended: a fresh plan is needed"},
        ),
    )
    return successor if go_on else None


def retired_answer(book: RunBook) -> str:
    switch = book.state.model_switches[-1]
    ran = sum(1 for a in book.state.actions if a.args is not None)
    return (
        f"The model {switch.retired} is no longer available ({switch.detail}). The {ran} action(s) already "
        "approved or run have run from their frozen arguments; nothing further was planned. A fresh plan "
        "is needed: start a new run (or set on_model_retired to a successor model)."
    )

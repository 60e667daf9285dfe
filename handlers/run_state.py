"""The workflow state of one run: what `status` shows and what `decide` verifies against.

Guarantee: only `AgentRun.run` writes it (shared handlers can only read), always as one whole value
under one key, so a reader never sees half an update.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from restate import WorkflowContext

from handlers.contract import ActionRecord, ApprovalRecord, Phase

STATE_KEY = "run"


class RunState(BaseModel):
    run_id: str
    tenant: str
    goal: str
    requester: str
    model: str
    phase: Phase = "planning"
    approvals: dict[str, ApprovalRecord] = Field(default_factory=dict)
    actions: list[ActionRecord] = Field(default_factory=list)
    answer: str | None = None


class RunBook:
    """The run's state plus the context that persists it; `save` after every transition."""

    def __init__(self, ctx: WorkflowContext, state: RunState) -> None:
        self.ctx = ctx
        self.state = state

    def save(self) -> None:
        self.ctx.set(STATE_KEY, self.state)

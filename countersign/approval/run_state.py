"""The workflow state of one run: what `status` shows and what `decide` verifies against.

Guarantee: only `AgentRun.run` writes it (shared handlers can only read). Each approval and each
action is stored under its own key (default values left out) and written only when it changed, so a
step costs the journal what it changed, not the size of the run. Items are written before the header
that lists them, so a reader that finds an id in the header finds its record: here, or, once the run
has handed a pending approval over to its own workflow, there (`RunBook.hand_over`, `pending_ids`).
A run stored whole under `run` by an earlier release still reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, Field
from restate import WorkflowContext, WorkflowSharedContext
from restate.serde import BytesSerde

from countersign.contract import ActionRecord, ApprovalRecord, AskedBy, ModelSwitch, Phase
from countersign.objects.bookkeeping import Notices

HEADER_KEY = "run"
_RAW = BytesSerde()


def approval_key(approval_id: str) -> str:
    return f"approval:{approval_id}"


def action_key(position: int) -> str:
    return f"action:{position}"


class RunFacts(BaseModel):
    """What a run is and where it stands, apart from its approvals and actions."""

    run_id: str
    tenant: str
    goal: str
    requester: str
    model: str
    phase: Phase = "planning"
    answer: str | None = None
    model_switches: list[ModelSwitch] = Field(default_factory=list)
    """Each time the pinned model was gone (provider 404) and what the run did."""
    webhooks: bool = True
    """Whether the run's end goes to the tenant's webhooks (from its last journaled model turn)."""
    asked_by: AskedBy = "agent"
    """Who asks for its approvals: the agent (AgentRun), or, for the gate's calls, what the caller says."""


_FACTS = set(RunFacts.model_fields)


class RunState(RunFacts):
    approvals: dict[str, ApprovalRecord] = Field(default_factory=dict)
    actions: list[ActionRecord] = Field(default_factory=list)


class RunHeader(RunFacts):
    """The stored head of a run; `approvals`/`actions` are only present in the whole-run layout."""

    approval_ids: list[str] = Field(default_factory=list)
    action_count: int = 0
    approvals: dict[str, ApprovalRecord] | None = None
    actions: list[ActionRecord] | None = None


def _header_of(state: RunState) -> RunHeader:
    facts = state.model_dump(include=_FACTS)
    return RunHeader(**facts, approval_ids=list(state.approvals), action_count=len(state.actions))


class RunBook:
    """The run's state plus the context that persists it; `save` after every transition.
    Actions are append-only; approvals may change in place and are compared with what was saved.
    `unsent` holds, per approval, what its bookkeeping learns until `countersign.approval.ledger.flush`
    sends it (one call for them all, to the run's shard).

    An approval `hand_over` was called for (its own workflow has been started) is, while pending,
    listed in the header only: its record lives in that workflow, which readers ask (`pending_ids`),
    and is stored here again once it returns decided. Until then (the request email may be retried
    for hours) the frozen record is stored here, so a reader finds it in one of the two."""

    def __init__(self, ctx: WorkflowContext, state: RunState) -> None:
        self.ctx = ctx
        self.state = state
        self._handed_over: set[str] = set()
        self.unsent: dict[str, Notices] = {}
        self._saved_header = b""
        self._saved_approvals: dict[str, bytes] = {}
        self._saved_actions = 0

    def save(self) -> None:
        for approval_id, record in self.state.approvals.items():
            if approval_id in self._handed_over and record.state == "pending":
                continue
            raw = record.model_dump_json(exclude_defaults=True).encode()
            if self._saved_approvals.get(approval_id) != raw:
                self.ctx.set(approval_key(approval_id), raw, serde=_RAW)
                self._saved_approvals[approval_id] = raw
        for position in range(self._saved_actions, len(self.state.actions)):
            action = self.state.actions[position].model_dump_json(exclude_defaults=True).encode()
            self.ctx.set(action_key(position), action, serde=_RAW)
        self._saved_actions = len(self.state.actions)
        header = _header_of(self.state).model_dump_json(exclude_defaults=True).encode()
        if header != self._saved_header:
            self.ctx.set(HEADER_KEY, header, serde=_RAW)
            self._saved_header = header

    def hand_over(self, approval_ids: Iterable[str]) -> None:
        """These approvals' workflows have been called: while pending, each record lives there only,
        and the copy this run stored until now is cleared (a waiting run keeps one, not two)."""
        for approval_id in approval_ids:
            if self._saved_approvals.pop(approval_id, None) is not None:
                self.ctx.clear(approval_key(approval_id))
            self._handed_over.add(approval_id)


async def load_header(ctx: WorkflowSharedContext) -> RunHeader | None:
    return await ctx.get(HEADER_KEY, type_hint=RunHeader)


async def load_approval(ctx: WorkflowSharedContext, header: RunHeader, approval_id: str) -> ApprovalRecord | None:
    if header.approvals is not None:
        return header.approvals.get(approval_id)
    if approval_id not in header.approval_ids:
        return None
    return await ctx.get(approval_key(approval_id), type_hint=ApprovalRecord)


async def load_run(ctx: WorkflowSharedContext, *, with_actions: bool = True) -> RunState | None:
    """The whole run as the workflow last saved it; None before it started."""
    header = await load_header(ctx)
    if header is None:
        return None
    approvals: dict[str, ApprovalRecord] = {}
    for approval_id in header.approval_ids if header.approvals is None else header.approvals:
        if (record := await load_approval(ctx, header, approval_id)) is not None:
            approvals[approval_id] = record
    actions = header.actions or []
    if header.actions is None and with_actions:
        for position in range(header.action_count):
            if (action := await ctx.get(action_key(position), type_hint=ActionRecord)) is not None:
                actions.append(action)
    return _assembled(header, approvals, actions)


def pending_ids(header: RunHeader | None, stored: dict[str, ApprovalRecord]) -> list[str]:
    """The approvals of a run that may still be pending: listed in its header, and stored pending
    or not stored at all (see `RunBook.hand_over`); their live record is their workflow's."""
    if header is None:
        return []
    listed = header.approval_ids if header.approvals is None else list(header.approvals)
    return [i for i in listed if i not in stored or stored[i].state == "pending"]


def assemble(values: dict[str, bytes]) -> RunState | None:
    """A run from its stored values by key (e.g. rows of Restate's `state` table), already opened."""
    if HEADER_KEY not in values:
        return None
    header = RunHeader.model_validate_json(values[HEADER_KEY])
    if header.approvals is not None:
        return _assembled(header, header.approvals, header.actions or [])
    approvals = {
        i: ApprovalRecord.model_validate_json(values[approval_key(i)])
        for i in header.approval_ids
        if approval_key(i) in values
    }
    actions = [
        ActionRecord.model_validate_json(values[action_key(p)])
        for p in range(header.action_count)
        if action_key(p) in values
    ]
    return _assembled(header, approvals, actions)


def _assembled(header: RunHeader, approvals: dict[str, ApprovalRecord], actions: Iterable[ActionRecord]) -> RunState:
    facts: dict[str, Any] = header.model_dump(include=_FACTS)
    return RunState(**facts, approvals=approvals, actions=list(actions))


RUN_STATES_QUERY = (
    "SELECT service_name, service_key, key, value_utf8 FROM state"
    " WHERE service_name IN ('AgentRun', 'Approval') AND (key = 'run' OR key LIKE 'approval:%')"
)
"""The admin SQL query whose rows `runs_of` reads: every run's and every approval's stored state."""


def runs_of(rows: Iterable[dict[str, Any]], opened: Callable[[bytes], bytes]) -> list[RunState]:
    """Every run with its approvals, from the rows of RUN_STATES_QUERY (values opened with `opened`,
    which undoes journal encryption). An approval's own workflow (`Approval`) holds its live record;
    a run made by `AgentRun` holds the frozen one until it has called that workflow and the decided
    one once it returns, so the approval's copy wins. ValueError for state this version cannot read."""
    values: dict[tuple[str, str], dict[str, bytes]] = {}
    for row in rows:
        if row.get("value_utf8"):
            where = (row["service_name"], row["service_key"])
            values.setdefault(where, {})[row["key"]] = opened(row["value_utf8"].encode())
    runs: dict[str, RunState] = {}
    for (service, _), stored in sorted(values.items(), key=lambda item: item[0][0] == "Approval"):
        found = assemble(stored)
        if found is None:
            continue
        if found.run_id in runs and service == "Approval":
            runs[found.run_id].approvals.update(found.approvals)
        else:
            runs.setdefault(found.run_id, found)
    return list(runs.values())

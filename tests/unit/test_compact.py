"""The compact journal serde: values read back equal, smaller, and a full value of an earlier release reads the same."""

from __future__ import annotations

import json
import typing

from pydantic import BaseModel
from support.processes import REPO
from support.records import approval_record

from countersign.agent.model_turn import Turn
from countersign.approval.calls import _Asked
from countersign.approval.gate import GateResult
from countersign.approval.verdict import Verdict
from countersign.approval.workflow import ApprovalRequest
from countersign.compact import Compact
from countersign.contract import ActionRecord, Outcome
from countersign.llm.base import AssistantTurn, ToolCall
from countersign.tools import default_registry
from countersign.tools.policy import PolicyVerdict, evaluate


def _verdict() -> PolicyVerdict:
    tool = default_registry().get("issue_refund")
    assert tool is not None
    args = tool.validate({"order_id": 1042, "amount_usd": "800.00", "reason": "late"})
    return evaluate(tool.name, tool.policy, args, requester="alice@example.com", tenant="acme")


DEFAULTS: dict[str, dict[str, str]] = json.loads((REPO / "tests" / "data" / "compact_defaults.json").read_text())


def test_an_approval_request_reads_back_equal_and_smaller_than_in_full() -> None:
    request = ApprovalRequest(record=approval_record(), policy=_verdict(), goal="refund", model="scripted", delivered=1)
    serde = Compact(ApprovalRequest)
    written = serde.serialize(request)
    assert serde.deserialize(written) == request
    full = request.model_dump_json().encode()
    assert len(written) < 0.85 * len(full)
    # What an earlier release journaled (every field) replays into the same value.
    assert serde.deserialize(full) == request


def test_a_gate_result_and_a_model_turn_read_back_equal() -> None:
    record = approval_record(state="approved", approved_by=["finance@example.com"])
    action = ActionRecord(index=0, tool="issue_refund", proposed_args={"order_id": 1042}, outcome=Outcome.APPROVED)
    final = Verdict(kind="approve", slot=0, round=1, digest=record.digest, at=1.0, by="finance@example.com")
    result = GateResult(record=record, action=action, final=final)
    assert Compact(GateResult).deserialize(Compact(GateResult).serialize(result)) == result
    reply = AssistantTurn(text="", tool_calls=[ToolCall(id="c1", name="issue_refund", args={"order_id": 1042})])
    turn = Turn(model="scripted", reply=reply, policies=[None])
    assert Compact(Turn).deserialize(Compact(Turn).serialize(turn)) == turn


def test_nothing_is_none_and_none_is_nothing() -> None:
    serde = Compact(Turn)
    assert serde.serialize(None) == b""
    assert serde.deserialize(b"") is None


def _defaults(model: type[BaseModel], seen: dict[str, dict[str, str]]) -> None:
    """Every field default of `model` and of the models its fields hold, by model name."""
    if model.__name__ in seen:
        return
    fields = seen[model.__name__] = {}
    for name, field in model.model_fields.items():
        fields[name] = "<required>" if field.is_required() else repr(field.get_default(call_default_factory=True))
        for inner in _models_in(field.annotation):
            _defaults(inner, seen)


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def test_the_defaults_of_compactly_journaled_models_do_not_change() -> None:
    """A default changed under a compact value would change what an older journal means (see
    countersign.compact): add a field instead. Regenerate DEFAULTS only for a new field."""
    seen: dict[str, dict[str, str]] = {}
    for model in (ApprovalRequest, GateResult, Turn, _Asked):
        _defaults(model, seen)
    changed = {
        f"{model}.{name}": (DEFAULTS[model][name], now)
        for model, fields in seen.items()
        for name, now in fields.items()
        if model in DEFAULTS and name in DEFAULTS[model] and DEFAULTS[model][name] != now
    }
    assert not changed, f"defaults changed (old, new): {changed}"
    new = {m: sorted(set(fields) - set(DEFAULTS.get(m, {}))) for m, fields in seen.items()}
    missing = {m: names for m, names in new.items() if names}
    assert not missing, f"new fields or models: add them to DEFAULTS: {missing}"

"""The compact journal serde: values read back equal, smaller, and a full value of an earlier release reads the same."""

from __future__ import annotations

from support.records import approval_record

from handlers.agent.run import Turn
from handlers.approval.gate import GateResult
from handlers.approval.verdict import Verdict
from handlers.approval.workflow import ApprovalRequest
from handlers.compact import Compact
from handlers.contract import ActionRecord, Outcome
from handlers.llm.base import AssistantTurn, ToolCall
from handlers.tools import default_registry
from handlers.tools.policy import PolicyVerdict, evaluate


def _verdict() -> PolicyVerdict:
    tool = default_registry().get("issue_refund")
    assert tool is not None
    args = tool.validate({"order_id": 1042, "amount_usd": "800.00", "reason": "late"})
    return evaluate(tool.name, tool.policy, args, requester="alice@example.com", tenant="acme")


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

"""Run state is stored per item: a step costs the journal what it changed, not the size of the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.business import new_order
from support.processes import AppServer, Ingress, RestateServer, wait_until
from support.records import approval_record

from countersign.approval.run_state import HEADER_KEY, RunState, action_key, approval_key, assemble
from countersign.contract import ActionRecord, ApprovalRecord, Outcome


def lookups_then_a_gated_refund(order: int, steps: int) -> dict[str, Any]:
    """`steps` autonomous look-ups, then a refund over the gate: the run waits for a person there,
    with the journal of every step still in Restate (a finished run keeps none, see countersign.retention)."""
    step = {"tool": "lookup_order", "args": {"order_id": order}}
    refund = {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "800.00", "reason": "late"}}
    return {"goal": f"Look at order {order}", "requester": "alice@example.com", "script": [step] * steps + [refund]}


def state_bytes_written(restate_server: RestateServer, run_id: str) -> int:
    ids = f"select id from sys_invocation where target_service_key = '{run_id}' and target_handler_name = 'run'"
    rows = restate_server.sql(f"select entry_type, raw from sys_journal where id in ({ids})")
    writes = [len(row["raw"]) // 2 for row in rows if "SetState" in row["entry_type"]]
    assert writes, "the run saved its state"
    return sum(writes)


def journaled_steps(restate_server: RestateServer, run_id: str) -> list[str | None]:
    """The entry names (None for unnamed entries) of the run's `run` invocation's journal."""
    [run] = [r for r in restate_server.invocation_statuses("AgentRun", run_id) if r["target_handler_name"] == "run"]
    return [row.get("name") for row in restate_server.sql(f"select name from sys_journal where id = '{run['id']}'")]


def waiting(ingress: Ingress, run_id: str) -> dict[str, Any]:
    def pending() -> dict[str, Any] | None:
        status = ingress.status(run_id)
        return status if status["pending"] else None

    return wait_until(pending, 30, f"{run_id} to wait for its approval")


def test_state_written_per_step_does_not_grow_with_the_run(
    app_server: AppServer,
    ingress: Ingress,
    restate_server: RestateServer,
    demo_db: Path,
    run_id: str,
) -> None:
    order = new_order(demo_db, 5000)
    written = {}
    for steps in (2, 10, 18):
        key = f"{run_id}-{steps}"
        ingress.start_run(key, lookups_then_a_gated_refund(order, steps))
        status = waiting(ingress, key)
        assert [a["outcome"] for a in status["history"]] == ["autonomous"] * steps
        written[steps] = state_bytes_written(restate_server, key)
        ingress.call("AgentRun", key, "cancel", {"reason": "measured"})
    # The gate's own writes are the same in every run and cancel out of the differences. Saving the
    # whole run each step writes ~k action records at step k, so the later steps would cost ~2.3x
    # the earlier ones (quadratic in all); saved per item, each step costs about the same.
    early = (written[10] - written[2]) / 8
    late = (written[18] - written[10]) / 8
    assert 0 < late < early * 1.5, written


def _approval(run_id: str) -> ApprovalRecord:
    return approval_record(approval_id=f"{run_id}-a0", run_id=run_id, tenant="acme", index=0)


def _state() -> RunState:
    return RunState(
        run_id="r1",
        tenant="acme",
        goal="g",
        requester="alice@example.com",
        model="scripted",
        phase="completed",
        approvals={"r1-a0": _approval("r1")},
        actions=[ActionRecord(index=0, tool="issue_refund", proposed_args={}, outcome=Outcome.APPROVED)],
        answer="done",
    )


def test_assemble_reads_the_per_item_layout() -> None:
    state = _state()
    header = {
        "run_id": "r1",
        "tenant": "acme",
        "goal": "g",
        "requester": "alice@example.com",
        "model": "scripted",
        "phase": "completed",
        "answer": "done",
        "approval_ids": ["r1-a0"],
        "action_count": 1,
    }
    values = {
        HEADER_KEY: json.dumps(header).encode(),
        approval_key("r1-a0"): state.approvals["r1-a0"].model_dump_json().encode(),
        action_key(0): state.actions[0].model_dump_json().encode(),
    }
    assert assemble(values) == state
    assert assemble({}) is None


def test_assemble_reads_a_run_stored_whole_by_an_earlier_release() -> None:
    state = _state()
    assert assemble({HEADER_KEY: state.model_dump_json().encode()}) == state


def test_a_waiting_run_keeps_its_approval_once_in_the_approvals_workflow(
    app_server: AppServer,
    ingress: Ingress,
    restate_server: RestateServer,
    demo_db: Path,
    run_id: str,
) -> None:
    """While the run waits, the frozen record is stored by the approval's workflow only (the run's
    header lists it); the run's status reads it live, cancel reaches it, and once it returns the
    run stores the decided record for its history."""
    order = new_order(demo_db, 5000)
    ingress.start_run(run_id, lookups_then_a_gated_refund(order, 1))
    status = waiting(ingress, run_id)
    approval = f"{run_id}-a1"
    assert [p["approval_id"] for p in status["pending"]] == [approval]
    assert [(a["approval_id"], a["state"]) for a in status["approvals"]] == [(approval, "pending")]

    def stored(service: str, key: str) -> set[str]:
        rows = restate_server.sql(f"select key from state where service_name = '{service}' and service_key = '{key}'")
        return {row["key"] for row in rows}

    assert approval_key(approval) not in stored("AgentRun", run_id)
    assert approval_key(approval) in stored("Approval", approval)

    receipt = ingress.call("AgentRun", run_id, "cancel", {"reason": "no longer needed"}).json()
    assert receipt["accepted"] and receipt["cancelled_approvals"] == [approval]
    done = ingress.attach(run_id).json()
    assert done["status"] == "cancelled"
    wait_until(lambda: approval_key(approval) in stored("AgentRun", run_id), 20, "the decided record in the run")
    [kept] = [a for a in ingress.status(run_id)["approvals"] if a["approval_id"] == approval]
    assert kept["state"] == "cancelled"


def test_a_gated_calls_facts_are_read_in_the_model_turns_own_step(
    app_server: AppServer,
    ingress: Ingress,
    restate_server: RestateServer,
    demo_db: Path,
    run_id: str,
) -> None:
    """The refund's facts for the approver are on its record, and the run's journal has no step (no
    round trip before the email) of their own."""
    order = new_order(demo_db, 5000)
    ingress.start_run(run_id, lookups_then_a_gated_refund(order, 1))
    status = waiting(ingress, run_id)
    [record] = status["approvals"]
    assert {"label": "Order total", "value": "$50.00"} in record["context"]
    steps = journaled_steps(restate_server, run_id)
    assert "model turn 1" in steps and not [s for s in steps if s and s.startswith("context")]
    ingress.call("AgentRun", run_id, "cancel", {"reason": "done looking"})
    assert ingress.attach(run_id).json()["status"] == "cancelled"


def test_facts_are_read_after_the_calls_of_the_turn_that_ran_alone(
    app_server: AppServer,
    ingress: Ingress,
    restate_server: RestateServer,
    demo_db: Path,
    run_id: str,
) -> None:
    """One turn: a small refund that runs alone, then a large one that is gated. The approver's facts
    are read after the small one ran (in a step of their own), so they show it."""
    order = new_order(demo_db, 90000)
    small = {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "100.00", "reason": "late"}}
    large = {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "700.00", "reason": "late"}}
    task = {"goal": f"Refund order {order}", "requester": "alice@example.com", "script": [{**small, "also": [large]}]}
    ingress.start_run(run_id, task)
    status = waiting(ingress, run_id)
    [record] = [a for a in status["approvals"] if a["state"] == "pending"]
    assert {"label": "Already refunded", "value": "$100.00"} in record["context"]
    steps = journaled_steps(restate_server, run_id)
    assert "context issue_refund #1" in steps
    ingress.call("AgentRun", run_id, "cancel", {"reason": "done"})
    assert ingress.attach(run_id).json()["status"] == "cancelled"

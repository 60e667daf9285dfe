"""The gate from a user's own Restate handlers: a Virtual Object and a Service of the test's own call
`gated_call` / `request_approval`, served beside Countersign by COUNTERSIGN_SERVICES, and decided by
approvers through the real emails and pages."""

from __future__ import annotations

import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support.approver import approval_emails, form_after_restart, form_csrf, open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.operator import cli
from support.processes import IsolatedStack, user_services, wait_until
from support.runs import refund

from countersign.contract import MAX_GOAL, MAX_WHY
from countersign.objects.audit import AuditLog, verify
from countersign.security import links


@pytest.fixture(scope="module")
def module_stack_app_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The app's settings (conftest's `module_stack`, and `own_stack`): the user's handlers (`myshop.agents`
    in tests/support/user_code) and policy."""
    policy = tmp_path_factory.mktemp("project") / "policy.toml"
    policy.write_text("[tools.email_customer]\ndeadline_seconds = 2\n")
    return {**user_services("myshop.agents:served"), "APPROVALS_POLICY_FILE": str(policy)}


@pytest.fixture()
def stack(module_stack: IsolatedStack) -> IsolatedStack:
    """The module's stack: each test asks under run ids, object keys and orders of its own."""
    return module_stack


def raw_call(call: str, run_id: str, index: int | None = None, **rest: Any) -> dict[str, Any]:
    """The input of `RawGate.call`: `call` is request_approval, gated_call or plan."""
    return {"call": call, "run_id": run_id, "index": index, **rest}


def test_a_virtual_object_gates_a_refund_and_the_approved_one_runs_once(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    ask = {"run_id": "desk-1", "tool": "issue_refund", "args": refund(order, "800.00")}
    invocation = stack.ingress.send("RefundDesk", "customer-17", "act", ask)
    [mail] = wait_for_email(stack.outbox_dir, "desk-1")
    assert "Refund $800.00 to order" in mail.text and "asked by the desk" in mail.text
    # The refund's facts were read in the caller's policy step, not in a step (a round trip) of their own.
    assert "Order total: $900.00" in mail.text
    [caller] = stack.restate.invocation_statuses("RefundDesk", "customer-17")
    steps = [row.get("name") for row in stack.restate.sql(f"select name from sys_journal where id = '{caller['id']}'")]
    assert "ask policy issue_refund #0" in steps and not [s for s in steps if s and s.startswith("context")]
    assert submit(mail.link, "approve").status_code == 200
    record = stack.ingress.wait_invocation(invocation).json()
    assert record["outcome"] == "approved" and record["approved_by"] == ["finance@example.com"]
    assert record["idempotency_key"] == "desk-1/0" and record["result"]["amount_usd"] == "800.00"
    assert refunds_for(stack.db_path, "desk-1") == [("desk-1/0", order, 80000)]
    # The approval's own trail, as for an agent's approval.
    status = stack.ingress.call("Approval", "desk-1-a0", "status", None).json()
    assert status["approvals"][0]["state"] == "approved" and status["history"][0]["outcome"] == "approved"


def test_kill9_of_the_handler_while_a_virtual_objects_approval_waits_then_approve(own_stack: IsolatedStack) -> None:
    stack = own_stack
    order = new_order(stack.db_path, 90000)
    ask = {"run_id": "desk-9", "tool": "issue_refund", "args": refund(order, "700.00")}
    invocation = stack.ingress.send("RefundDesk", "customer-9", "act", ask)
    [mail] = wait_for_email(stack.outbox_dir, "desk-9")
    stack.app.kill9()
    stack.app.restart()
    assert submit(mail.link, "approve", csrf=form_after_restart(mail.link)).status_code == 200
    record = stack.ingress.wait_invocation(invocation, timeout=60).json()
    assert record["outcome"] == "approved"
    assert refunds_for(stack.db_path, "desk-9") == [("desk-9/0", order, 70000)], "exactly one refund"


def test_a_virtual_object_gets_the_edited_amount_executed(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = stack.ingress.send(
        "RefundDesk",
        "customer-18",
        "act",
        {"run_id": "desk-2", "tool": "issue_refund", "args": refund(order, "800.00")},
    )
    [mail] = wait_for_email(stack.outbox_dir, "desk-2")
    assert submit(mail.link, "approve", edits={"amount_usd": "650.00"}).status_code == 200
    record = stack.ingress.wait_invocation(invocation).json()
    assert record["outcome"] == "approved_with_edits" and record["args"]["amount_usd"] == "650.00"
    assert record["proposed_args"]["amount_usd"] == "800.00"
    assert refunds_for(stack.db_path, "desk-2") == [("desk-2/0", order, 65000)]


def test_a_service_hears_a_rejection_with_its_reason_and_nothing_runs(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = stack.ingress.send(
        "RefundCheck", None, "ask", {"run_id": "check-1", "tool": "issue_refund", "args": refund(order, "700.00")}
    )
    [mail] = wait_for_email(stack.outbox_dir, "check-1")
    assert submit(mail.link, "reject", reason="already refunded by phone").status_code == 200
    outcome = stack.ingress.wait_invocation(invocation).json()
    assert outcome["verdict"] == "rejected" and outcome["reason"] == "already refunded by phone"
    assert outcome["args"] is None and outcome["decision_source"] == "human"
    assert refunds_for(stack.db_path, "check-1") == []
    [notice] = wait_for_email(stack.outbox_dir, "check-1", kind="outcome")  # the requester hears of it
    assert notice.message["To"] == "alice@example.com" and "already refunded by phone" in notice.text


def test_a_service_sees_the_deadline_pass(stack: IsolatedStack) -> None:
    args = {"customer_id": "c_17", "subject": "Sorry", "body": "We are sorry."}
    invocation = stack.ingress.send(
        "RefundCheck", None, "ask", {"run_id": "check-2", "tool": "email_customer", "args": args}
    )
    [mail] = wait_for_email(stack.outbox_dir, "check-2")
    csrf = form_csrf(mail.link)
    outcome = stack.ingress.wait_invocation(invocation, timeout=30).json()
    assert outcome["verdict"] == "expired" and "deadline passed" in outcome["reason"]
    assert outcome["decision_source"] == "deadline_default"
    late = submit(mail.link, "approve", csrf=csrf)
    assert late.status_code == 409 and "expired" in late.text


def test_a_service_gets_a_quorum_approval_and_the_approved_arguments(stack: IsolatedStack) -> None:
    new_order(stack.db_path, 100, customer_id="c_23")  # the business database exists, with c_23
    args = {"customer_id": "c_23", "reason": "asked to be forgotten"}
    invocation = stack.ingress.send(
        "RefundCheck", None, "ask", {"run_id": "check-3", "tool": "delete_customer", "args": args}
    )
    mails = wait_for_email(stack.outbox_dir, "check-3", count=2)
    assert {m.message["To"] for m in mails} == {"ops@example.com", "security@example.com"}
    assert submit(mails[0].link, "approve", confirm="c_23").status_code == 200

    def one_counted() -> dict[str, Any] | None:  # the approval's workflow counts the vote after the POST
        [pending] = stack.ingress.call("Approval", "check-3-a0", "status", None).json()["pending"]
        return pending if pending["approvals"] == 1 else None

    counted = wait_until(one_counted, 20, "the first approval to be counted")
    assert counted["quorum"] == 2, "one of two approvals is not enough: still pending"
    assert submit(mails[1].link, "approve", confirm="c_23").status_code == 200
    outcome = stack.ingress.wait_invocation(invocation).json()
    assert outcome["verdict"] == "approved" and outcome["args"] == args
    assert sorted(outcome["approved_by"]) == ["ops@example.com", "security@example.com"]
    with sqlite3.connect(stack.db_path) as db:  # request_approval decides; it runs nothing itself
        assert db.execute("SELECT deleted_at FROM customers WHERE id = 'c_23'").fetchone() == (None,)
    # ... so nobody is told it ran: no outcome notice for an approval that is only reported.
    assert approval_emails(stack.outbox_dir, "check-3", kind="outcome") == []


def test_an_autonomous_call_and_default_placement(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    small = stack.ingress.send(
        "RefundDesk", "customer-19", "act", {"run_id": "desk-3", "tool": "issue_refund", "args": refund(order, "20.00")}
    )
    record = stack.ingress.wait_invocation(small).json()
    assert record["outcome"] == "autonomous" and record["approval_id"] is None
    assert refunds_for(stack.db_path, "desk-3") == [("desk-3/0", order, 2000)]

    invocation = stack.ingress.send(
        "RefundCheck", None, "twice", {"run_id": "unused", "tool": "issue_refund", "args": refund(order, "600.00")}
    )
    [first] = wait_for_email(stack.outbox_dir, invocation)
    assert submit(first.link, "approve").status_code == 200
    [_, second] = wait_for_email(stack.outbox_dir, invocation, count=2)
    assert submit(second.link, "reject", reason="one is enough").status_code == 200
    outcomes = stack.ingress.wait_invocation(invocation).json()
    assert [(o["run_id"], o["index"], o["verdict"]) for o in outcomes] == [
        (invocation, 0, "approved"),
        (invocation, 1, "rejected"),
    ]
    assert [o["approval_id"] for o in outcomes] == [f"{invocation}-a0", f"{invocation}-a1"]


def test_bad_input_to_the_gate_is_a_clear_answer_not_a_stuck_invocation(stack: IsolatedStack) -> None:
    invalid = stack.ingress.send("RefundCheck", None, "ask", {"run_id": "check-4", "tool": "issue_refund", "args": {}})
    outcome = stack.ingress.wait_invocation(invalid).json()
    assert outcome["verdict"] == "invalid" and "order_id" in outcome["reason"]
    unknown = stack.ingress.send("RefundCheck", None, "ask", {"run_id": "check-5", "tool": "nope", "args": {}})
    outcome = stack.ingress.wait_invocation(unknown).json()
    assert outcome["verdict"] == "invalid" and "unknown tool 'nope'" in outcome["reason"]
    bad_run = stack.ingress.send("RefundCheck", None, "ask", {"run_id": "no spaces", "tool": "nope", "args": {}})
    failed = stack.ingress.wait_invocation(bad_run)
    assert failed.status_code == 400 and "run_id" in failed.json()["message"]


def test_a_tool_object_is_gated_as_the_loaded_tool_and_one_not_loaded_is_a_400(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    looked_up = raw_call("gated_call", "object-1", tool="lookup_order", args={"order_id": order}, as_object=True)
    sent = [stack.ingress.send("RawGate", None, "call", looked_up)]
    record = stack.ingress.wait_invocation(sent[-1])
    assert record.status_code == 200 and record.json()["outcome"] == "autonomous", record.text
    assert record.json()["result"]["order_id"] == order
    for call in ("gated_call", "request_approval"):
        stray = raw_call(call, f"object-{call}", tool="stray", args={}, as_object=True)
        sent.append(stack.ingress.send("RawGate", None, "call", stray))
        refused = stack.ingress.wait_invocation(sent[-1])
        assert refused.status_code == 400, refused.text
        assert refused.json()["message"].startswith("tool 'stray' is not loaded (loaded: delete_customer, ")
    assert raw_statuses(stack, sent) == {"completed"}, "each ended at once, none backing off"


def test_a_placement_no_link_can_carry_is_a_400_before_anything_is_sent(stack: IsolatedStack) -> None:
    """An approval link carries an index of at most 12 digits (and the run id's pattern): an approval
    placed beyond them would email a link that the page and the ingress refuse as malformed, so it
    could only expire. Every call that places one, the plan's too, refuses it first."""
    args = refund(new_order(stack.db_path, 90000), "700.00")
    plan = {"steps": [{"tool": "issue_refund", "at_most": {"amount_usd": "700.00"}}]}
    refund_at: dict[str, Any] = {"tool": "issue_refund", "args": args}
    beyond = [
        (raw_call("request_approval", "far-1", 10**20, **refund_at), "index"),
        (raw_call("gated_call", "far-2", links.MAX_INDEX + 1, **refund_at), "index"),
        (raw_call("plan", "far-3", 10**20, plan=plan), "index"),
        (raw_call("request_approval", "f" * (links.MAX_RUN_ID + 1), **refund_at), "run_id"),
        (raw_call("plan", "far 5", plan=plan), "run_id"),
    ]
    said, sent = [], []
    for ask, named in beyond:
        sent.append(stack.ingress.send("RawGate", None, "call", ask))
        refused = stack.ingress.wait_invocation(sent[-1])
        assert refused.status_code == 400, (ask, refused.text)
        said.append(refused.json()["message"])
        assert said[-1].startswith(named), said[-1]
    assert f"index must be from 0 to {links.MAX_INDEX}" in said[0]
    assert raw_statuses(stack, sent) == {"completed"}, "each ended at once, none backing off"
    assert not list(stack.outbox_dir.glob("*_far*")), "nobody was asked"
    assert stack.ingress.call("Approval", "far-1-a100000000000000000000", "status", None).json()["phase"] == "unknown"
    # The highest index a link carries is asked, and its link opens the page.
    top = raw_call("request_approval", "far-6", links.MAX_INDEX, **refund_at)
    invocation = stack.ingress.send("RawGate", None, "call", top)
    [mail] = wait_for_email(stack.outbox_dir, "far-6")
    assert open_page(mail.link).status_code == 200
    stack.ingress.call("Approval", f"far-6-a{links.MAX_INDEX}", "cancel", {"reason": "done"})
    assert stack.ingress.wait_invocation(invocation).json()["verdict"] == "cancelled"


def test_a_long_why_and_goal_are_cut_to_the_contracts_bounds(stack: IsolatedStack) -> None:
    """An agent's task bounds its goal at 4,000 characters and a step's why at 2,000: a library
    caller's are cut to the same, marked, so 1 MB of each is not stored, shown and audited whole."""
    args = refund(new_order(stack.db_path, 90000), "700.00")
    plan = {"steps": [{"tool": "issue_refund", "at_most": {"amount_usd": "700.00"}}]}
    long: dict[str, Any] = {
        "why": "because ",
        "goal": "refund it ",
        "repeat": 2**17,
    }  # each about 1 MB, made by the handler
    asks = {
        "long-1": raw_call("request_approval", "long-1", tool="issue_refund", args=args, **long),
        "long-2": raw_call("gated_call", "long-2", tool="issue_refund", args=args, **long),
        "long-3": raw_call("plan", "long-3", plan=plan, **long),
    }
    for run, ask in asks.items():
        invocation = stack.ingress.send("RawGate", None, "call", ask)
        wait_for_email(stack.outbox_dir, run)
        status = saved_status(stack, f"{run}-a0")
        [record] = status["approvals"]
        assert len(record["why"]) == MAX_WHY and record["why"].endswith("because…"), run
        assert len(status["goal"]) == MAX_GOAL and status["goal"].startswith("refund it refund it"), run
        [requested] = [e for e in audit_log(stack, f"{run}-a0").entries if e.kind == "requested"]
        assert requested.details["why"] == record["why"]
        stack.ingress.call("Approval", f"{run}-a0", "cancel", {"reason": "done"})
        assert stack.ingress.wait_invocation(invocation).status_code == 200
    not_text = raw_call("request_approval", "long-4", tool="issue_refund", args=args, why=["a", "list"])
    refused = stack.ingress.wait_invocation(stack.ingress.send("RawGate", None, "call", not_text))
    assert refused.status_code == 400 and refused.json()["message"] == "why must be text, not list"


def test_arguments_of_the_wrong_shape_are_an_invalid_outcome_a_handler_can_return(stack: IsolatedStack) -> None:
    """A list where the arguments go, or arguments nested deeper than pydantic writes (~255 levels),
    are an `invalid` outcome like other bad arguments, which the handler returns as the README does
    (`model_dump(mode="json")`): not a 500, nor a result that fails to serialise and is retried
    forever. What did not validate comes back in `proposed_args` only if it can be written."""
    order = new_order(stack.db_path, 90000)
    nested: Any = 1
    for _ in range(300):
        nested = {"a": nested}
    pairs = [["order_id", order], ["amount_usd", "20.00"], ["reason", "r"]]  # dict() would take these
    asks = {
        "shape-1": raw_call("request_approval", "shape-1", tool="issue_refund", args=[1, 2]),
        "shape-2": raw_call("gated_call", "shape-2", tool="issue_refund", args=pairs),
        "shape-3": raw_call("request_approval", "shape-3", tool="issue_refund", args={"order_id": nested}),
        "shape-4": raw_call("gated_call", "shape-4", tool="issue_refund", args={"order_id": nested}),
        "shape-5": raw_call("request_approval", "shape-5", tool="issue_refund", args={"order_id": "x"}),
    }
    answers, sent = {}, []
    for run, ask in asks.items():
        sent.append(stack.ingress.send("RawGate", None, "call", ask))
        answer = stack.ingress.wait_invocation(sent[-1], timeout=20)
        assert answer.status_code == 200, (run, answer.text)
        answers[run] = answer.json()
    for run in ("shape-1", "shape-3", "shape-5"):
        assert answers[run]["verdict"] == "invalid" and answers[run]["run_id"] == run, answers[run]
    for run in ("shape-2", "shape-4"):
        assert answers[run]["outcome"] == "invalid" and answers[run]["args"] is None, answers[run]
    assert "not list" in answers["shape-1"]["reason"] and "not list" in answers["shape-2"]["result"]["error"]
    assert "order_id" in answers["shape-3"]["reason"] and "order_id" in answers["shape-4"]["result"]["error"]
    assert [answers[run]["proposed_args"] for run in asks] == [{}, {}, {}, {}, {"order_id": "x"}]
    assert raw_statuses(stack, sent) == {"completed"}
    assert refunds_for(stack.db_path, "shape-2") == [] and not list(stack.outbox_dir.glob("*_shape*"))


def raw_statuses(stack: IsolatedStack, invocations: list[str]) -> set[str]:
    """The statuses of these invocations of `RawGate` (the module's stack holds other tests' too)."""
    rows = {row["id"]: row["status"] for row in stack.restate.invocation_statuses("RawGate")}
    assert set(invocations) <= rows.keys(), "each invocation is listed"
    return {rows[invocation] for invocation in invocations}


def saved_status(stack: IsolatedStack, approval_id: str) -> dict[str, Any]:
    """The approval's status once its workflow has saved the record (the email may come first)."""

    def saved() -> dict[str, Any] | None:
        status: dict[str, Any] = stack.ingress.call("Approval", approval_id, "status", None).json()
        return status if status["approvals"] else None

    return wait_until(saved, 20, f"{approval_id}'s record")


def test_a_cancel_for_an_id_nobody_asked_holds_nothing(stack: IsolatedStack) -> None:
    """Approval ids are predictable (`<run>-a<index>`): a cancel under one that nobody asked waits,
    bounded, for a request on its way, then cancels nothing, and a later request there waits for a
    person as any other does."""
    early = stack.ingress.call("Approval", "desk-5-a0", "cancel", {"reason": "withdrawn", "by": "mallory"}).json()
    assert early == {"run_id": "", "accepted": False, "cancelled_approvals": []}
    order = new_order(stack.db_path, 90000)
    ask = {"run_id": "desk-5", "tool": "issue_refund", "args": refund(order, "700.00")}
    asked = stack.ingress.send("RefundDesk", "customer-5", "act", ask)
    wait_for_email(stack.outbox_dir, "desk-5")
    status = wait_until(
        lambda: stack.ingress.call("Approval", "desk-5-a0", "status", None).json()["pending"] or None,
        timeout=30,
        what="desk-5-a0 to wait for a person",
    )
    assert [p["approval_id"] for p in status] == ["desk-5-a0"]
    receipt = stack.ingress.call("Approval", "desk-5-a0", "cancel", {"reason": "done", "by": "ops-lead"}).json()
    assert receipt["accepted"] is True
    record = stack.ingress.wait_invocation(asked).json()
    assert record["outcome"] == "cancelled" and record["reason"] == "done"
    assert refunds_for(stack.db_path, "desk-5") == []


def test_a_cancel_that_races_the_request_cancels_it_and_names_who_asked(stack: IsolatedStack) -> None:
    """The window between a caller emailing its request and the approval's workflow saving it: a
    cancel in it is not lost (it waits for the record, bounded) and nothing runs. The trail says who
    cancelled."""
    order = new_order(stack.db_path, 90000)
    ask = {"run_id": "desk-8", "tool": "issue_refund", "args": refund(order, "700.00")}
    with ThreadPoolExecutor(1) as pool:
        cancel = {"reason": "withdrawn", "by": "ops-lead"}
        cancelling = pool.submit(stack.ingress.call, "Approval", "desk-8-a0", "cancel", cancel)
        wait_until(
            lambda: stack.restate.sql(
                "SELECT id FROM sys_invocation WHERE target_service_key = 'desk-8-a0' "
                "AND target_handler_name = 'cancel'"
            ),
            timeout=10,
            what="the cancel to be under way",
        )
        asked = stack.ingress.send("RefundDesk", "customer-8", "act", ask)
        receipt = cancelling.result(timeout=30).json()
    assert receipt == {"run_id": "desk-8", "accepted": True, "cancelled_approvals": ["desk-8-a0"]}
    record = stack.ingress.wait_invocation(asked).json()
    assert record["outcome"] == "cancelled" and record["reason"] == "withdrawn"
    assert refunds_for(stack.db_path, "desk-8") == []
    wait_until(lambda: "outcome" in audit_kinds(stack, "desk-8-a0"), timeout=30, what="desk-8-a0's outcome entry")
    ends = [(e.actor, e.details["outcome"]) for e in audit_log(stack, "desk-8-a0").entries if e.kind == "outcome"]
    assert ends == [("ops-lead", "cancelled")]


def test_an_operator_shows_and_cancels_the_approvals_a_users_handler_asked(own_stack: IsolatedStack) -> None:
    """`pending` lists them by approval id; `show` and `cancel` take that id (no run of AgentRun holds
    them), and `cancel --older-than` reaches them too. The user's handler hears `cancelled`."""
    # Its own stack: `cancel --older-than` cancels, and `pending` lists, every approval waiting there.
    stack = own_stack
    asked = {}
    for run in ("ops-1", "ops-2"):
        order = new_order(stack.db_path, 90000)
        ask = {"run_id": run, "tool": "issue_refund", "args": refund(order, "700.00")}
        asked[run] = stack.ingress.send("RefundCheck", None, "ask", ask)
        wait_for_email(stack.outbox_dir, run)
    shown = cli(stack.restate, "show", "ops-1-a0", "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["run_id"] == "ops-1" and [p["approval_id"] for p in status["pending"]] == ["ops-1-a0"]
    assert [e["kind"] for e in status["audit"]["ops-1-a0"]][:1] == ["requested"]
    text = cli(stack.restate, "show", "ops-1-a0")  # for people: the same facts, in plain lines
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "run ops-1  awaiting_approval  requester alice@example.com"
    assert "  ops-1-a0  issue_refund  pending" in lines
    assert any(line.startswith("    waiting on finance@example.com (round 1, 0 of 1 approvals)") for line in lines)
    assert any(line.startswith("    audit: requested") for line in lines), lines
    by_run = cli(stack.restate, "show", "ops-1")
    assert by_run.returncode == 1, "the caller's run id is no run of AgentRun"
    assert "ops-1 is not a run of AgentRun; its approvals (show one by its id): ops-1-a0" in by_run.stderr

    one = cli(stack.restate, "cancel", "ops-1-a0", "--reason", "withdrawn", "--by", "ops-lead", "--json")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout) == {"run_id": "ops-1", "accepted": True, "cancelled_approvals": ["ops-1-a0"]}
    outcome = stack.ingress.wait_invocation(asked["ops-1"]).json()
    assert outcome["verdict"] == "cancelled" and outcome["reason"] == "withdrawn"
    wait_until(lambda: "outcome" in audit_kinds(stack, "ops-1-a0"), timeout=30, what="ops-1-a0's outcome entry")
    assert [e.actor for e in audit_log(stack, "ops-1-a0").entries if e.kind == "outcome"] == ["ops-lead"]

    # 0s: every one waiting now (an age of zero is an age, not a missing option).
    stale = cli(stack.restate, "cancel", "--older-than", "0s", "--reason", "stale", "--json")
    assert stale.returncode == 0, stale.stderr
    assert [(r["run_id"], r["accepted"], r["cancelled_approvals"]) for r in json.loads(stale.stdout)] == [
        ("ops-2", True, ["ops-2-a0"])
    ]
    assert stack.ingress.wait_invocation(asked["ops-2"]).json()["verdict"] == "cancelled"
    assert json.loads(cli(stack.restate, "pending", "--json").stdout) == []
    # An id that is neither a run nor an approval cancels nothing ahead: a later approval under it waits.
    assert json.loads(cli(stack.restate, "cancel", "ops-3-a0", "--reason", "x", "--json").stdout)["accepted"] is False
    assert stack.ingress.call("Approval", "ops-3-a0", "status", None).json()["phase"] == "unknown"


def test_a_run_id_and_index_place_one_approval_once(stack: IsolatedStack) -> None:
    """Asking again at a placement that was already asked is refused with a message that says why, not
    Restate's bare 'already invoked'; the first approval keeps its outcome and nothing runs twice."""
    order = new_order(stack.db_path, 90000)
    ask = {"run_id": "desk-6", "tool": "issue_refund", "args": refund(order, "700.00")}
    asking = stack.ingress.send("RefundDesk", "customer-6", "act", ask)
    wait_for_email(stack.outbox_dir, "desk-6")
    assert stack.ingress.call("Approval", "desk-6-a0", "cancel", {"reason": "withdrawn"}).json()["accepted"] is True
    first = stack.ingress.wait_invocation(asking).json()
    assert first["outcome"] == "cancelled"
    again = stack.ingress.wait_invocation(stack.ingress.send("RefundDesk", "customer-6b", "act", ask))
    assert again.status_code == 409
    assert "desk-6-a0 was already asked" in again.text
    assert refunds_for(stack.db_path, "desk-6") == []
    # The refused caller's notices (sent before it was refused) tell of nothing that happened: the
    # trail keeps one request and stays intact. The run's next approval goes to the same shard after them.
    second = stack.ingress.send("RefundDesk", "customer-6c", "act", {**ask, "index": 1})
    wait_until(
        lambda: stack.ingress.call("Approval", "desk-6-a1", "status", None).json()["pending"],
        timeout=30,
        what="desk-6-a1 to wait for a person",
    )
    stack.ingress.call("Approval", "desk-6-a1", "cancel", {"reason": "withdrawn"})
    stack.ingress.wait_invocation(second)
    wait_until(lambda: "outcome" in audit_kinds(stack, "desk-6-a1"), timeout=30, what="desk-6-a1's outcome entry")
    assert audit_kinds(stack, "desk-6-a0").count("requested") == 1
    assert verify(audit_log(stack, "desk-6-a0").entries) == []

    # The same while the first approval still waits: the second caller is refused, the first is not.
    ask = {"run_id": "desk-7", "tool": "issue_refund", "args": refund(new_order(stack.db_path, 90000), "700.00")}
    waiting = stack.ingress.send("RefundDesk", "customer-7", "act", ask)
    [first] = wait_for_email(stack.outbox_dir, "desk-7")
    twice = stack.ingress.wait_invocation(stack.ingress.send("RefundDesk", "customer-7b", "act", ask))
    assert twice.status_code == 409 and "desk-7-a0 was already asked" in twice.text
    # Its request email went out under the first one's idempotency key: the approver has one email,
    # the first, whose link still works (a second write would have put a link that answers 403).
    [kept] = approval_emails(stack.outbox_dir, "desk-7", "request")
    assert kept.link == first.link and kept.message["Date"] == first.message["Date"]
    assert open_page(first.link).status_code == 200
    assert submit(first.link, "reject", "asked twice").status_code == 200
    assert stack.ingress.wait_invocation(waiting).json()["outcome"] == "rejected"
    wait_until(lambda: "outcome" in audit_kinds(stack, "desk-7-a0"), timeout=30, what="desk-7-a0's outcome entry")
    assert audit_kinds(stack, "desk-7-a0").count("requested") == 1
    assert verify(audit_log(stack, "desk-7-a0").entries) == []


def audit_log(stack: IsolatedStack, approval_id: str) -> AuditLog:
    return AuditLog.model_validate(stack.ingress.call("ApprovalAudit", approval_id, "entries", None).json())


def audit_kinds(stack: IsolatedStack, approval_id: str) -> list[str]:
    return [entry.kind for entry in audit_log(stack, approval_id).entries]

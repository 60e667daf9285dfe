"""Confidence-gated checkpoints against a real restate-server and app: a refund the policy lets run alone
(≤ $500) is stopped when the model reports low confidence in it, or when it disagrees with the order the
run looked up; the page and the email say why; the trust figures count each trigger and how it ended;
a high-stakes refund stays gated however sure the model is. Both for `AgentRun` (scripted model) and
a user's own handler calling `gated_call` with `confidence=` and `results=`."""

from __future__ import annotations

import html
import subprocess
import sys
import tomllib
from decimal import Decimal
from typing import Any

import pytest
from support.approver import form_after_restart, open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import REPO, IsolatedStack, user_services, wait_until

ORDER_CHECK = "args.order_id == results.lookup_order.order_id"
CHECK = "args.amount_usd == double(results.lookup_order.amount_usd)"
POLICY = f"""
[tools.issue_refund]
gate_below_confidence = 0.7
checks = ["{ORDER_CHECK}", "{CHECK}"]
"""


@pytest.fixture(scope="module")
def module_stack_app_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The app's settings (conftest's `module_stack`, and `own_stack`): the checkpoint policy and the
    user's handler (`mydesk.agents` in tests/support/user_code)."""
    root = tmp_path_factory.mktemp("project")
    (root / "policy.toml").write_text(POLICY)
    return {"APPROVALS_POLICY_FILE": str(root / "policy.toml"), **user_services("mydesk.agents:served")}


@pytest.fixture()
def stack(module_stack: IsolatedStack) -> IsolatedStack:
    """The module's stack: each test runs under run ids and orders of its own."""
    return module_stack


def refund_task(order: int, amount: str, confidence: float | None) -> dict[str, Any]:
    step: dict[str, Any] = {
        "tool": "issue_refund",
        "args": {"order_id": order, "amount_usd": amount, "reason": "damaged in transit"},
        "why": "The customer sent photos.",
    }
    if confidence is not None:
        step["confidence"] = confidence
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "lookup_order", "args": {"order_id": order}}, step],
    }


def figures(stack: IsolatedStack) -> dict[str, Any]:
    found: dict[str, Any] = stack.ingress.call("ToolStats", "issue_refund", "stats", None).json()
    return found


def counted(stack: IsolatedStack, kind: str, total: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        found = figures(stack)["triggers"].get(kind)
        return found if found and found["gated"] >= total else None

    return wait_until(ready, 20, f"the trust figures to count {total} {kind} trigger(s)")


def test_low_confidence_stops_a_refund_the_policy_lets_run_alone(own_stack: IsolatedStack, run_id: str) -> None:
    # Its own stack: it checks the tool's trust figures, which count every checkpoint on the stack.
    stack = own_stack
    order = new_order(stack.db_path, 12000)
    assert stack.ingress.start_run(run_id, refund_task(order, "120.00", 0.42)).status_code == 202
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    reason = "Stopped because the model's confidence was 0.42 < 0.70"
    assert reason in mail.text and "the model's confidence was 0.42 < 0.70" in html.unescape(mail.html)
    page = open_page(mail.link)
    assert page.status_code == 200 and reason in html.unescape(page.text)
    [pending] = stack.ingress.status(run_id)["approvals"]
    assert pending["confidence"] == 0.42 and pending["stopped_because"][0]["kind"] == "confidence"
    assert pending["args"] == {"order_id": order, "amount_usd": "120.00", "reason": "damaged in transit"}
    assert submit(mail.link, "reject", reason="not what was asked").status_code == 200
    result = stack.ingress.wait_output(run_id).json()
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "rejected"]
    assert refunds_for(stack.db_path, run_id) == []
    trigger = counted(stack, "confidence", 1)
    assert (trigger["gated"], trigger["rejected"], trigger["approved"]) == (1, 1, 0)
    assert figures(stack)["trigger_rejection_rates"]["confidence"] == 1.0
    report = stack.ingress.call("TrustRamp", None, "report", None).json()
    assert "issue_refund" in [t["tool"] for t in report["tools"]]
    env = {
        "RESTATE_INGRESS_URL": stack.restate.ingress_url,
        "RESTATE_ADMIN_URL": stack.restate.admin_url,
        "COUNTERSIGN_JOURNAL_KEYS": stack.restate.journal_keys,
        "PATH": "/usr/bin:/bin",
    }
    stats = subprocess.run(
        [sys.executable, "-m", "countersign", "stats"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert stats.returncode == 0, stats.stderr
    [row] = [line.split() for line in stats.stdout.splitlines() if line.startswith("issue_refund  confidence")]
    assert row[2:5] == ["1", "0", "1"], "gated 1, approved 0, rejected 1"


def test_a_failed_check_stops_a_refund_that_disagrees_with_the_order(own_stack: IsolatedStack, run_id: str) -> None:
    # Its own stack: it checks the tool's trust figures, which count every checkpoint on the stack.
    stack = own_stack
    order = new_order(stack.db_path, 45000)
    assert stack.ingress.start_run(run_id, refund_task(order, "300.00", 0.95)).status_code == 202
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    reason = f"Stopped because check `{CHECK}` failed: args.amount_usd is 300.0, "
    assert reason in mail.text and "is 450.0" in mail.text
    assert "confidence" not in mail.text.split("Asked by:")[0], "a sure model is not the reason"
    assert reason in html.unescape(open_page(mail.link).text)
    assert submit(mail.link, "approve").status_code == 200
    result = stack.ingress.wait_output(run_id).json()
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "approved"]
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/1", order, 30000)]
    trigger = counted(stack, "check", 1)
    assert (trigger["gated"], trigger["approved"], trigger["rejected"]) == (1, 1, 0)
    assert "confidence" not in figures(stack)["triggers"]


def test_a_sure_consistent_call_runs_alone_and_high_stakes_stay_gated(stack: IsolatedStack, run_id: str) -> None:
    small = new_order(stack.db_path, 20000)
    assert stack.ingress.start_run(run_id, refund_task(small, "200.00", 0.9)).status_code == 202
    result = stack.ingress.wait_output(run_id).json()
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "autonomous"], "no checkpoint tripped"

    big = new_order(stack.db_path, 150000)
    high = f"{run_id}-high"
    assert stack.ingress.start_run(high, refund_task(big, "1500.00", 0.99)).status_code == 202
    [mail] = wait_for_email(stack.outbox_dir, high)
    assert "Stopped because" not in mail.text, "gated by its policy, not by a checkpoint"
    [record] = stack.ingress.status(high)["approvals"]
    assert record["confirm_field"] == "amount_usd" and record["stopped_because"] == []
    assert submit(mail.link, "approve", confirm="1500.00").status_code == 200
    assert [a["outcome"] for a in stack.ingress.wait_output(high).json()["actions"]] == ["autonomous", "approved"]


def test_a_users_own_handler_passes_confidence_and_earlier_results(own_stack: IsolatedStack) -> None:
    # Its own stack: it checks the tool's trust figures, which count every checkpoint on the stack.
    stack = own_stack
    order = new_order(stack.db_path, 8000)
    sure = stack.ingress.send(
        "CheckedDesk", None, "refund", {"run_id": "own-1", "order_id": order, "amount_usd": "80.00", "confidence": 0.9}
    )
    assert stack.ingress.wait_invocation(sure).json()["outcome"] == "autonomous"

    other = new_order(stack.db_path, 8000)
    ask = {"run_id": "own-2", "order_id": other, "amount_usd": "60.00"}
    invocation = stack.ingress.send("CheckedDesk", None, "refund", ask)
    [mail] = wait_for_email(stack.outbox_dir, "own-2")
    assert "Stopped because the model reported no confidence (needs 0.70)" in mail.text
    assert f"Stopped because check `{CHECK}` failed" in mail.text
    assert submit(mail.link, "reject", reason="partial refunds need a note").status_code == 200
    record = stack.ingress.wait_invocation(invocation).json()
    assert record["outcome"] == "rejected" and refunds_for(stack.db_path, "own-2") == []
    assert counted(stack, "check", 1)["rejected"] == 1 and counted(stack, "confidence", 1)["rejected"] == 1


def test_a_refund_of_one_order_on_the_lookup_of_another_is_stopped(stack: IsolatedStack) -> None:
    """The README's pair of checks through `gated_call`: the lookup of one order does not let a
    refund of another of the same total run alone, however sure the model; the email says which check."""
    looked, other = new_order(stack.db_path, 9000), new_order(stack.db_path, 9000)
    ask = {"run_id": "own-3", "order_id": other, "looked_up": looked, "amount_usd": "90.00", "confidence": 0.95}
    invocation = stack.ingress.send("CheckedDesk", None, "refund", ask)
    [mail] = wait_for_email(stack.outbox_dir, "own-3")
    assert (
        f"Stopped because check `{ORDER_CHECK}` failed: args.order_id is {other}, "
        f"results.lookup_order.order_id is {looked}"
    ) in mail.text
    assert f"Stopped because check `{CHECK}`" not in mail.text and "confidence" not in mail.text.split("Asked by:")[0]
    assert submit(mail.link, "reject", reason="wrong order").status_code == 200
    assert stack.ingress.wait_invocation(invocation).json()["outcome"] == "rejected"
    assert refunds_for(stack.db_path, "own-3") == []


def test_kill9_while_a_confidence_stop_waits_then_approve_runs_once(own_stack: IsolatedStack, run_id: str) -> None:
    stack = own_stack
    order = new_order(stack.db_path, 12000)
    assert stack.ingress.start_run(run_id, refund_task(order, "120.00", 0.3)).status_code == 202
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    stack.app.kill9()
    stack.app.restart()
    assert "confidence was 0.30 < 0.70" in mail.text
    assert submit(mail.link, "approve", csrf=form_after_restart(mail.link)).status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "approved"]
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/1", order, 12000)], "exactly one refund"


# --- the pure parts: no server --------------------------------------------------------------------------


def test_checkpoints_fail_closed_and_never_ungate() -> None:
    from countersign.tools.policy import ToolPolicy, evaluate

    policy = ToolPolicy(
        gated=True,
        when="amount_usd > 500",
        approvers=("finance@example.com",),
        high_stakes=True,
        high_stakes_when="amount_usd > 1000",
        gate_below_confidence=0.7,
        checks=(CHECK,),
    )
    order = {"lookup_order": {"amount_usd": "1500.00"}}
    sure = evaluate("issue_refund", policy, {"amount_usd": 1500}, confidence=0.99, results=order)
    assert sure.gated and sure.high_stakes and sure.stopped_because == [], "a sure model does not un-gate"
    at_threshold = evaluate("issue_refund", policy, {"amount_usd": 100}, confidence=0.7, results=order)
    assert [s.kind for s in at_threshold.stopped_because] == ["check"]
    for unusable in (None, 1.5, -0.1, True):
        verdict = evaluate("issue_refund", policy, {"amount_usd": 100}, confidence=unusable, results={})
        assert verdict.gated and [s.text for s in verdict.stopped_because] == [
            "the model reported no confidence (needs 0.70)",
            f"check `{CHECK}` could not be evaluated: no lookup_order (no such earlier result or field in this run)",
        ]
    alone = evaluate(
        "issue_refund", policy, {"amount_usd": 100}, confidence=0.8, results={"lookup_order": {"amount_usd": "100"}}
    )
    assert not alone.gated and alone.stopped_because == []


def test_the_docs_checks_refuse_a_refund_of_another_order_than_the_one_looked_up() -> None:
    """The docs' example policy, read from the docs page: a lookup of order 1043 does not let a
    refund of order 1042 of the same total run alone, and `results.lookup_order` is the latest
    lookup, so an earlier lookup of 1042 does not count once another order was looked up."""
    from countersign.contract import ActionRecord, Outcome
    from countersign.tools.checkpoints import results_of
    from countersign.tools.policy import evaluate
    from countersign.tools.policy_file import merge
    from handlers.demo.tools import DEMO_TOOLS, IssueRefundArgs

    page = REPO / "docs" / "how-to" / "plans-and-checkpoints.md"
    readme = page.read_text().split("## Confidence-gated checkpoints", 1)[1]
    table = tomllib.loads(readme.split("```toml\n", 1)[1].split("```", 1)[0])["tools"]["issue_refund"]
    assert ORDER_CHECK in table["checks"] and CHECK in table["checks"]
    [tool] = [t for t in DEMO_TOOLS if t.name == "issue_refund"]
    policy = merge(tool.policy, table, source=str(page))

    def lookup(order: int) -> ActionRecord:  # what the demo's lookup_order returns
        result = {"order_id": order, "customer_id": "c_1", "amount_usd": "120.00", "refunded_usd": "0.00"}
        return ActionRecord(
            index=0, tool="lookup_order", proposed_args={"order_id": order}, outcome=Outcome.AUTONOMOUS, result=result
        )

    refund = IssueRefundArgs(order_id=1042, amount_usd=Decimal("120.00"), reason="damaged")

    def stopped(*lookups: int) -> list[str]:
        verdict = evaluate(
            "issue_refund", policy, refund, confidence=0.95, results=results_of(list(map(lookup, lookups)))
        )
        assert verdict.gated == bool(verdict.stopped_because)
        return [s.text for s in verdict.stopped_because]

    mismatch = f"check `{ORDER_CHECK}` failed: args.order_id is 1042, results.lookup_order.order_id is 1043"
    assert stopped(1043) == [mismatch]
    assert stopped(1042) == []
    assert stopped(1042, 1043) == [mismatch], "the latest lookup counts"
    assert stopped(1043, 1042) == []


def test_bad_checkpoint_policies_stop_at_load_with_the_setting_named() -> None:
    from countersign.tools.policy import PolicyError, ToolPolicy
    from countersign.tools.policy_file import merge

    base = ToolPolicy(gated=False)
    with pytest.raises(PolicyError, match=r"checks.*reads order.*only args and results"):
        merge(base, {"checks": ["order.amount == 1"], "approvers": ["a@example.com"]}, source="policy.toml")
    with pytest.raises(PolicyError, match=r"checks.*not a valid CEL expression"):
        merge(base, {"checks": ["args.amount =="], "approvers": ["a@example.com"]}, source="policy.toml")
    with pytest.raises(PolicyError, match="need at least one approver"):
        merge(base, {"gate_below_confidence": 0.7}, source="policy.toml")
    with pytest.raises(PolicyError, match="gate_below_confidence"):
        merge(base, {"gate_below_confidence": 7, "approvers": ["a@example.com"]}, source="policy.toml")
    with pytest.raises(PolicyError, match="on_model_retired"):
        merge(base, {"on_model_retired": "later"}, source="policy.toml")
    kept = merge(base, {"on_model_retired": {"successor": "openai:gpt-x"}}, source="policy.toml")
    assert kept.on_model_retired is not None and kept.on_model_retired != "end"


def test_a_failed_comparison_shows_both_sides_only_when_it_is_one_comparison() -> None:
    from countersign.tools.checkpoints import stops

    args, results = {"customer_id": "c_1", "amount_usd": 5.0}, {"lookup_order": {"customer_id": "c_2"}}
    [one] = stops(
        below=None,
        checks=["args.customer_id == results.lookup_order.customer_id"],
        args=args,
        results=results,
        confidence=None,
    )
    assert one.text.endswith("failed: args.customer_id is 'c_1', results.lookup_order.customer_id is 'c_2'")
    [both] = stops(
        below=None,
        checks=['args.amount_usd > 1.0 && args.customer_id == "c_9"'],
        args=args,
        results=results,
        confidence=None,
    )
    assert both.text == 'check `args.amount_usd > 1.0 && args.customer_id == "c_9"` failed'
    [quoted] = stops(below=None, checks=['args.customer_id == "a==b"'], args=args, results=results, confidence=None)
    assert quoted.text.endswith("""failed: args.customer_id is 'c_1', "a==b" is 'a==b'""")


def test_the_confidence_argument_is_taken_out_of_asked_tools_only() -> None:
    from countersign.llm import confidence
    from countersign.llm.base import AssistantTurn, ToolCall, ToolSpec

    schema = {"type": "object", "properties": {"amount": {"type": "number"}}}
    asked = confidence.asking(schema)
    assert asked is not None and "confidence" in asked["properties"] and "confidence" not in schema["properties"]
    assert confidence.asking({"properties": {"confidence": {"type": "string"}}}) is None, "a tool's own field wins"
    tools = [
        ToolSpec(name="pay", description="", parameters=asked, approval="", confidence=True),
        ToolSpec(name="look", description="", parameters=schema, approval=""),
    ]
    turn = AssistantTurn(
        tool_calls=[
            ToolCall(id="1", name="pay", args={"amount": 1, "confidence": 0.4}),
            ToolCall(id="2", name="pay", args={"amount": 1, "confidence": "high"}),
            ToolCall(id="3", name="look", args={"amount": 1, "confidence": 0.4}),
        ]
    )
    first, second, third = confidence.take(turn, tools).tool_calls
    assert (first.args, first.confidence) == ({"amount": 1}, 0.4)
    assert (second.args, second.confidence) == ({"amount": 1}, None)
    assert (third.args, third.confidence) == ({"amount": 1, "confidence": 0.4}, None)


def test_a_404_model_not_found_is_a_retirement_and_other_404s_are_not() -> None:
    from countersign.llm.base import ModelRetired
    from countersign.llm.provider_errors import classify, is_model_retired

    openai_gone = {
        "error": {"message": "The model `x` does not exist", "type": "invalid_request_error", "code": "model_not_found"}
    }
    anthropic_gone = {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-x"}}
    assert is_model_retired(404, openai_gone) and is_model_retired(404, anthropic_gone)
    assert not is_model_retired(400, openai_gone)
    assert not is_model_retired(404, {"error": {"type": "not_found_error", "message": "no such route"}})
    assert isinstance(classify("Anthropic", 404, anthropic_gone, {}), ModelRetired)

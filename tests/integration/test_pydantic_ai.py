"""A Pydantic AI agent wrapped in RestateAgent and served beside Countersign gates its tools through the
gate: the call is emailed, the run suspends, the approver decides on the page, and the agent hears the
answer as Pydantic AI's own ToolApproved / ToolDenied. The model is Pydantic AI's FunctionModel,
scripted by the test's prompt (no network); the tools are the demo's, with their policies."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import openai_server as oai
from fakes.fixtures import running
from fakes.provider import JsonObject, Reply
from support.approver import form_csrf, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import REPO, IsolatedStack, StackFactory, parked, user_services, wait_until

from examples.billing.fake_payments import FakePayments


@pytest.fixture(scope="module")
def module_stack_app_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The app's settings (conftest's `module_stack`, and `own_stack`): the project's agent (`helpdesk.agent`
    in tests/support/user_code) and policy."""
    policy = tmp_path_factory.mktemp("pydantic-project") / "policy.toml"
    policy.write_text("[tools.email_customer]\ndeadline_seconds = 2\n")
    return {**user_services("helpdesk.agent:served"), "APPROVALS_POLICY_FILE": str(policy)}


@pytest.fixture()
def stack(module_stack: IsolatedStack) -> IsolatedStack:
    """The module's stack: each test runs under run ids (and orders) of its own."""
    return module_stack


def refund(order: int, amount: str) -> dict[str, Any]:
    return {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "damaged"}}


def start(stack: IsolatedStack, run_id: str, calls: list[dict[str, Any]]) -> None:
    started = stack.ingress.post_json(f"/PydanticSupport/{run_id}/run/send", {"calls": calls})
    assert started.status_code == 202, started.text


def finish(stack: IsolatedStack, run_id: str, timeout: float = 60) -> dict[str, Any]:
    answer = stack.ingress.wait_output_of("PydanticSupport", run_id, timeout=timeout)
    assert answer.status_code == 200, answer.text
    output: dict[str, Any] = answer.json()
    return output


def test_an_approved_refund_runs_once_with_the_approved_arguments(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    lookup = {"tool": "lookup_order", "args": {"order_id": order}}
    # A plain tool after the gated one in the same turn waits its turn (RestateAgent's turnstile) and runs.
    note = {"tool": "note", "args": {"text": "refund asked"}}
    start(stack, "pyd-approve", [lookup, refund(order, "800.00"), note])
    [mail] = wait_for_email(stack.outbox_dir, "pyd-approve")
    assert "Refund $800.00 to order" in mail.text and "the parcel arrived broken" in mail.text
    assert "An agent working for" in mail.text and "Why (the agent's words):" in mail.text  # the adapter asks
    assert refunds_for(stack.db_path, "pyd-approve") == [], "nothing runs before the approval"
    assert submit(mail.link, "approve").status_code == 200

    output = finish(stack, "pyd-approve")
    # The lookup's policy does not gate it: it ran without an email, in the caller's journal (index 0).
    assert [(o["outcome"], o["index"]) for o in output["actions"]] == [("autonomous", 0), ("approved", 1)]
    assert refunds_for(stack.db_path, "pyd-approve") == [("pyd-approve/1", order, 80000)]
    by_tool = {seen["tool"]: seen["content"] for seen in output["seen"]}
    assert by_tool["lookup_order"]["order_id"] == order
    assert by_tool["issue_refund"]["amount_usd"] == "800.00"
    assert by_tool["note"] == {"noted": "refund asked"}
    assert len(list(stack.outbox_dir.glob("approval-request_pyd-approve-*.eml"))) == 1


def test_an_edited_amount_is_what_runs_and_what_the_model_sees(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    start(stack, "pyd-edit", [refund(order, "800.00")])
    [mail] = wait_for_email(stack.outbox_dir, "pyd-edit")
    assert submit(mail.link, "approve", edits={"amount_usd": "650.00"}).status_code == 200

    output = finish(stack, "pyd-edit")
    [outcome] = output["actions"]
    assert outcome["outcome"] == "approved_with_edits" and outcome["args"]["amount_usd"] == "650.00"
    assert refunds_for(stack.db_path, "pyd-edit") == [("pyd-edit/0", order, 65000)]
    [seen] = output["seen"]
    assert seen["content"]["amount_usd"] == "650.00"


def test_a_rejection_reaches_the_model_with_the_approvers_reason(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    start(stack, "pyd-reject", [refund(order, "700.00")])
    [mail] = wait_for_email(stack.outbox_dir, "pyd-reject")
    assert submit(mail.link, "reject", reason="already refunded by phone").status_code == 200

    output = finish(stack, "pyd-reject")
    [seen] = output["seen"]
    assert seen["tool"] == "issue_refund"
    assert (
        seen["content"] == "Rejected by the approver: already refunded by phone. Do not propose this exact call again."
    )
    assert refunds_for(stack.db_path, "pyd-reject") == []


def test_a_passed_deadline_is_a_denial_that_says_so(stack: IsolatedStack) -> None:
    new_order(stack.db_path, 100)  # the business database exists
    email = {"tool": "email_customer", "args": {"customer_id": "c_17", "subject": "Sorry", "body": "We are sorry."}}
    start(stack, "pyd-expire", [email])
    [mail] = wait_for_email(stack.outbox_dir, "pyd-expire")
    csrf = form_csrf(mail.link)

    output = finish(stack, "pyd-expire")
    [seen] = output["seen"]
    assert seen["content"].startswith("Not run: the approval expired before anyone decided (")
    assert "deadline passed" in seen["content"]
    assert output["actions"][0]["decision_source"] == "deadline_default"
    late = submit(mail.link, "approve", csrf=csrf)
    assert late.status_code == 409 and "expired" in late.text


def test_a_cancelled_approval_is_a_denial_that_says_so(stack: IsolatedStack) -> None:
    order = new_order(stack.db_path, 90000)
    start(stack, "pyd-cancel", [refund(order, "900.00")])
    wait_for_email(stack.outbox_dir, "pyd-cancel")
    receipt = stack.ingress.call("Approval", "pyd-cancel-a0", "cancel", {"reason": "the customer withdrew"})
    assert receipt.status_code == 200 and receipt.json()["accepted"], receipt.text

    output = finish(stack, "pyd-cancel")
    [seen] = output["seen"]
    assert seen["content"].startswith("Not run: the approval was cancelled (") and "withdrew" in seen["content"]
    assert refunds_for(stack.db_path, "pyd-cancel") == []


def test_a_call_approved_outside_countersign_does_not_run(own_stack: IsolatedStack) -> None:
    # Its own stack: the call has no run id of Countersign's, so "nobody was asked" is the whole outbox.
    stack = own_stack
    order = new_order(stack.db_path, 90000)
    invocation = stack.ingress.send("PydanticByHand", None, "approve_all", {"calls": [refund(order, "800.00")]})
    failed = stack.ingress.wait_invocation(invocation, timeout=60)
    assert failed.status_code == 400 and "approved outside Countersign" in failed.json()["message"], failed.text
    with sqlite3.connect(stack.db_path) as db:
        assert db.execute("SELECT count(*) FROM refunds WHERE order_id = ?", (order,)).fetchone() == (0,)
    assert list(stack.outbox_dir.glob("*.eml")) == [], "nobody was asked"


def statuses(stack: IsolatedStack, key: str) -> set[str]:
    rows = stack.restate.invocation_statuses(service="PydanticSupport", key=key)
    return {row["status"] for row in rows if row["target_handler_name"] == "run"}


@pytest.mark.slow
def test_kill9_of_the_handler_while_pending_then_approve_runs_the_effect_once(own_stack: IsolatedStack) -> None:
    stack = own_stack
    order = new_order(stack.db_path, 100000)
    start(stack, "pyd-kill", [refund(order, "800.00")])
    [mail] = wait_for_email(stack.outbox_dir, "pyd-kill")
    csrf = form_csrf(mail.link)

    stack.app.kill9()
    wait_until(lambda: parked(statuses(stack, "pyd-kill")), 30, "the run to park")
    stack.app.restart()
    assert submit(mail.link, "approve", csrf=csrf).status_code == 200

    output = finish(stack, "pyd-kill")
    assert output["actions"][0]["outcome"] == "approved"
    assert output["seen"][0]["content"]["amount_usd"] == "800.00"
    assert refunds_for(stack.db_path, "pyd-kill") == [("pyd-kill/0", order, 80000)]
    assert len(list(stack.outbox_dir.glob("approval-request_*.eml"))) == 1, "asked once, across the crash"


def test_parallel_gated_calls_are_asked_one_after_the_other_each_with_its_own_answer(stack: IsolatedStack) -> None:
    first, second = new_order(stack.db_path, 90000), new_order(stack.db_path, 90000)
    start(stack, "pyd-two", [refund(first, "800.00"), refund(second, "600.00")])
    [mail] = wait_for_email(stack.outbox_dir, "pyd-two")
    assert f"to order {first}" in mail.text, "the model's first call is asked first"
    assert submit(mail.link, "approve").status_code == 200
    [_, later] = wait_for_email(stack.outbox_dir, "pyd-two", count=2)
    assert f"to order {second}" in later.text
    # The second approver sees what the run asked before: the first call, approved, with its arguments.
    assert "What this run did before asking:" in later.text and "#0 issue_refund: approved" in later.text
    assert f'"order_id": {first}' in later.text
    assert "What this run did before asking:" not in mail.text, "the first call had nothing before it"
    assert submit(later.link, "reject", reason="one refund is enough").status_code == 200

    output = finish(stack, "pyd-two")
    assert [(o["outcome"], o["index"]) for o in output["actions"]] == [("approved", 0), ("rejected", 1)]
    assert refunds_for(stack.db_path, "pyd-two") == [("pyd-two/0", first, 80000)]
    assert [s["content"] if isinstance(s["content"], str) else "ran" for s in output["seen"]] == [
        "ran",
        "Rejected by the approver: one refund is enough. Do not propose this exact call again.",
    ]


def test_the_adapter_without_the_extra_names_the_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['pydantic_ai'] = None\n"
        "import countersign, countersign.integrations\n"
        "try:\n    import countersign.integrations.pydantic_ai\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "pip install -c requirements.lock 'countersign_approvals-0.1.0-py3-none-any.whl[pydantic-ai]'" in done.stdout


@pytest.fixture()
def payments() -> Iterator[FakePayments]:
    server = FakePayments()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def billing_env(payments: FakePayments, **extra: str) -> dict[str, str]:
    """The example's settings, as its README gives them."""
    return {
        "COUNTERSIGN_TOOLS": "examples.billing.tools:TOOLS",
        "COUNTERSIGN_SERVICES": "examples.pydantic_agent.agent:services",
        "APPROVALS_POLICY_FILE": str(REPO / "examples/billing/policy.toml"),
        "ACME_PAYMENTS_URL": payments.url,
        "PYTHONPATH": str(REPO),
        **extra,
    }


def test_the_example_agent_collects_an_invoice_after_the_account_manager_lowers_the_charge(
    isolated_stack: StackFactory, payments: FakePayments
) -> None:
    billing = isolated_stack(app_env=billing_env(payments, ACME_AGENT_MODEL="scripted"))
    started = billing.ingress.post_json("/AgentCollection/inv_1001/run/send", {"requester": "alice@acme.example"})
    assert started.status_code == 202, started.text
    [mail] = wait_for_email(billing.outbox_dir, "agent-inv_1001", timeout=60)
    assert mail.message["To"] == "ops@acme.example", "the billing example's policy, unchanged"
    assert "Charge $420.00 to card_visa42 for inv_1001" in mail.text and "12 days overdue" in mail.text
    assert [r for r in payments.requests if r[0] == "POST"] == []
    assert submit(mail.link, "approve", edits={"amount_usd": "400.00"}).status_code == 200

    output = billing.ingress.wait_output_of("AgentCollection", "inv_1001", timeout=60).json()
    assert [o["outcome"] for o in output["actions"]] == ["autonomous", "approved_with_edits"]
    assert [(r[1], r[2]) for r in payments.requests if r[0] == "POST"] == [("/charges", "agent-inv_1001/1")]
    assert payments.charges["agent-inv_1001/1"]["amount_usd"] == "400.00"
    assert output["summary"].startswith("charge_card: ") and '"approved_by": ["ops@acme.example"]' in output["summary"]


def test_the_example_agent_on_a_local_openai_compatible_server_is_asked_once_per_turn(
    isolated_stack: StackFactory, payments: FakePayments
) -> None:
    charge = {"invoice_id": "inv_1003", "amount_usd": "15.00", "card": "card_test1"}

    def report(body: JsonObject) -> Reply:
        [_, charged] = oai.tool_messages(body)
        return oai.answer("local-llama", f"Reported: {charged['content']}")

    with running(oai.OpenAIFake()) as fake:
        fake.script(
            "local-llama",
            oai.tool_calls("local-llama", ("lookup_invoice", {"invoice_id": "inv_1003"})),
            oai.tool_calls("local-llama", ("charge_card", charge), text="A test card: it needs a person."),
            report,
        )
        env = billing_env(
            payments,
            ACME_AGENT_MODEL="openai-chat:local-llama",
            OPENAI_BASE_URL=fake.base_url,
            OPENAI_API_KEY=oai.API_KEY,
        )
        billing = isolated_stack(app_env=env)
        billing.ingress.post_json("/AgentCollection/inv_1003/run/send", {"requester": "alice@acme.example"})
        [mail] = wait_for_email(billing.outbox_dir, "agent-inv_1003", timeout=60)
        assert "A test card: it needs a person." in mail.text
        assert submit(mail.link, "reject", reason="never charge a test card").status_code == 200

        output = billing.ingress.wait_output_of("AgentCollection", "inv_1003", timeout=60).json()
        assert [o["outcome"] for o in output["actions"]] == ["autonomous", "rejected"]
        assert output["summary"] == (
            "Reported: Rejected by the approver: never charge a test card. Do not propose this exact call again."
        )
        assert len(fake.seen("local-llama")) == 3, "each model turn asked once: the journal answers replays"
        tools = [t["function"]["name"] for t in fake.seen("local-llama")[0].body["tools"]]
        assert sorted(tools) == ["charge_card", "lookup_invoice"]
    assert payments.charges == {}

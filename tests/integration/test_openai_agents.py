"""The OpenAI Agents SDK under the gate: examples/openai_agents's `RefundAgent`, served by a real stack,
its model the SDK's own OpenAI provider pointed at the local Chat Completions fake. Every tool call
interrupts the run; the approver decides through the real email and page; the test checks what the
tool did (the business database) and what the model was told (the requests the fake received)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import openai_server as oai
from fakes.fixtures import running
from fakes.provider import JsonObject, Reply
from support.approver import form_csrf, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import REPO, IsolatedStack, parked, wait_until


@pytest.fixture(scope="module")
def fake() -> Iterator[oai.OpenAIFake]:
    """One fake for the module: each test's model is named after its run, so each has its own script
    and `fake.seen(run_id)` is that test's traffic only."""
    with running(oai.OpenAIFake()) as server:
        yield server


@pytest.fixture(scope="module")
def module_stack_app_env(fake: oai.OpenAIFake, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The app's settings (conftest's `module_stack`, and `own_stack`): the example, its model at the fake."""
    policy = tmp_path_factory.mktemp("openai-agents") / "policy.toml"
    # Refunds over $10 need a person (the code says $500); the example's SDK callable asks over $100.
    policy.write_text(
        '[tools.email_customer]\ndeadline_seconds = 2\n\n[tools.issue_refund]\nwhen = "amount_usd > 10.0"\n'
    )
    return {
        "COUNTERSIGN_SERVICES": "examples.openai_agents.agent:services",
        "PYTHONPATH": str(REPO),
        "APPROVALS_POLICY_FILE": str(policy),
        "OPENAI_API_KEY": oai.API_KEY,
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }


@pytest.fixture()
def stack(module_stack: IsolatedStack) -> IsolatedStack:
    """The module's stack: each test runs under a run id (and orders) of its own."""
    return module_stack


def echo_tool_result(model: str) -> Any:
    """The model's last reply: it repeats what the tool call returned, so the answer shows it too."""

    def reply(body: JsonObject) -> Reply:
        return oai.answer(model, "The tool said: " + str(oai.tool_messages(body)[-1]["content"]))

    return reply


def start(stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str, *calls: tuple[str, dict[str, Any]]) -> str:
    """Script one turn of tool calls then the answer, and start the agent on `run_id` (its model is
    named after the run, so each test has its own script)."""
    fake.script(run_id, oai.tool_calls(run_id, *calls), echo_tool_result(run_id))
    task = {"run_id": run_id, "task": "Refund the late order.", "requester": "alice@example.com", "model": run_id}
    return stack.ingress.send("RefundAgent", None, "run", task)


def told(fake: oai.OpenAIFake, model: str) -> list[str]:
    """The tool results the model was sent, in order (from the last request, which carries them all)."""
    return [str(m["content"]) for m in oai.tool_messages(fake.seen(model)[-1].body)]


def refund_args(order: int, amount: str) -> dict[str, Any]:
    return {"order_id": order, "amount_usd": amount, "reason": "arrived late"}


def test_an_approved_call_runs_once_with_the_approved_arguments(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "800.00")))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert "Refund $800.00 to order" in mail.text and "asked of the refund desk" in mail.text
    assert "An agent working for" in mail.text and "Why (the agent's words):" in mail.text  # the adapter asks
    assert refunds_for(stack.db_path, run_id) == [], "nothing runs before the approval"
    assert submit(mail.link, "approve").status_code == 200

    output = stack.ingress.wait_invocation(invocation, timeout=60).json()
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    [result] = told(fake, run_id)
    assert json.loads(result)["outcome"] == "approved" and json.loads(result)["result"]["amount_usd"] == "800.00"
    assert output["answer"] == f"The tool said: {result}"
    assert len(fake.seen(run_id)) == 2, "one model call before the approval, one after"


def test_an_edit_reaches_the_tool_and_the_model_is_told(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "800.00")))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert submit(mail.link, "approve", edits={"amount_usd": "650.00"}).status_code == 200

    stack.ingress.wait_invocation(invocation, timeout=60).raise_for_status()
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 65000)]
    [result] = told(fake, run_id)
    report = json.loads(result)
    assert report["outcome"] == "approved_with_edits" and report["args"]["amount_usd"] == "650.00"
    assert report["edits"] == {"amount_usd": "650.00"}


def test_a_rejection_reaches_the_model_with_the_reason_and_nothing_runs(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "800.00")))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert submit(mail.link, "reject", reason="already refunded by phone").status_code == 200

    output = stack.ingress.wait_invocation(invocation, timeout=60).json()
    assert refunds_for(stack.db_path, run_id) == []
    assert told(fake, run_id) == ["Rejected by the approver: already refunded by phone"]
    assert output["answer"] == "The tool said: Rejected by the approver: already refunded by phone"


def test_an_expired_approval_is_a_denial_that_says_so(stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str) -> None:
    args = {"customer_id": "c_17", "subject": "Your refund", "body": "It is on its way."}
    invocation = start(stack, fake, run_id, ("email_customer", args))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    csrf = form_csrf(mail.link)

    stack.ingress.wait_invocation(invocation, timeout=60).raise_for_status()
    [result] = told(fake, run_id)
    assert result.startswith("Not run: the approval expired without a decision") and "deadline passed" in result
    late = submit(mail.link, "approve", csrf=csrf)
    assert late.status_code == 409 and "expired" in late.text


def test_a_cancelled_approval_is_a_denial_that_says_so(stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "800.00")))
    wait_for_email(stack.outbox_dir, run_id)
    receipt = stack.ingress.call("Approval", f"{run_id}-a0", "cancel", {"reason": "customer withdrew the claim"})
    assert receipt.json()["accepted"] is True

    stack.ingress.wait_invocation(invocation, timeout=60).raise_for_status()
    assert refunds_for(stack.db_path, run_id) == []
    [result] = told(fake, run_id)
    assert result.startswith("Not run: the approval was cancelled") and "customer withdrew the claim" in result


def test_a_call_the_sdks_callable_lets_through_is_still_gated_by_the_policy(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "40.00")))
    [mail] = wait_for_email(stack.outbox_dir, run_id)  # no interruption: the gate asks inside the tool call
    assert "Refund $40.00 to order" in mail.text
    assert refunds_for(stack.db_path, run_id) == []
    assert submit(mail.link, "approve").status_code == 200

    stack.ingress.wait_invocation(invocation, timeout=60).raise_for_status()
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 4000)]
    assert json.loads(told(fake, run_id)[0])["outcome"] == "approved"


def test_a_call_neither_the_sdk_nor_the_policy_gates_runs_alone(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "5.00")))
    stack.ingress.wait_invocation(invocation, timeout=60).raise_for_status()
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 500)]
    assert json.loads(told(fake, run_id)[0])["outcome"] == "autonomous"
    assert list(stack.outbox_dir.glob(f"approval-request_{run_id}-*")) == []


def test_two_calls_of_one_turn_are_asked_one_after_another(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    first, second = new_order(stack.db_path, 90000), new_order(stack.db_path, 90000)
    invocation = start(
        stack,
        fake,
        run_id,
        ("issue_refund", refund_args(first, "800.00")),
        ("issue_refund", refund_args(second, "700.00")),
    )
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert "Refund $800.00 to order" in mail.text
    assert submit(mail.link, "approve").status_code == 200
    [_, later] = wait_for_email(stack.outbox_dir, run_id, count=2)
    assert "Refund $700.00 to order" in later.text and f"{run_id}-a1" in later.path.name
    # The second approver sees the first call as the run's earlier step: approved, and what it did.
    assert "What this run did before asking:" in later.text and "#0 issue_refund: approved" in later.text
    assert f'"order_id": {first}' in later.text and "What this run did before asking:" not in mail.text
    assert submit(later.link, "reject", reason="one refund is enough").status_code == 200

    stack.ingress.wait_invocation(invocation, timeout=60).raise_for_status()
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", first, 80000)]
    approved, rejected = told(fake, run_id)
    assert json.loads(approved)["outcome"] == "approved"
    assert rejected == "Rejected by the approver: one refund is enough"


def agent_statuses(stack: IsolatedStack) -> set[str]:
    return {row["status"] for row in stack.restate.invocation_statuses(service="RefundAgent")}


@pytest.mark.slow
def test_kill9_of_the_handler_while_pending_then_approve_runs_the_tool_once(
    own_stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    stack = own_stack
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "800.00")))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    csrf = form_csrf(mail.link)

    stack.app.kill9()
    wait_until(lambda: parked(agent_statuses(stack)), 30, "the agent's run to park")
    stack.app.restart()
    assert submit(mail.link, "approve", csrf=csrf).status_code == 200

    output = stack.ingress.wait_invocation(invocation, timeout=60).json()
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    [result] = told(fake, run_id)
    assert json.loads(result)["outcome"] == "approved" and output["answer"] == f"The tool said: {result}"
    assert len(fake.seen(run_id)) == 2, "the journaled model call is not asked again after the crash"
    assert len(wait_for_email(stack.outbox_dir, run_id)) == 1, "one approval email, not one per attempt"


def test_the_adapter_without_the_extra_fails_with_a_message_naming_it() -> None:
    # `agents` blocked as if not installed; countersign.integrations itself still imports.
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "import countersign.integrations\n"
        "try:\n    import countersign.integrations.openai_agents\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    wheel = "countersign_approvals-0.1.0-py3-none-any.whl"
    assert f"pip install -c requirements.lock '{wheel}[openai-agents]'" in done.stdout

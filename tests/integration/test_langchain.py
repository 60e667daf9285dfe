"""LangChain under the gate: examples/langchain_agent's `LangChainRefunds`, served by a real stack, a
`create_agent` agent with RestateMiddleware then CountersignMiddleware, its model langchain-openai's
ChatOpenAI pointed at the local Chat Completions fake. The approver decides through the real email
and page; the test checks what the tool did (the business database) and what the model was told
(the requests the fake received)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import openai_server as oai
from fakes.fixtures import running
from support import refund_desk as desk
from support.approver import form_csrf, requests_about, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import REPO, IsolatedStack, parked, wait_until
from support.refund_desk import WHY, desk_env, finish, misordered_for_one_call, refund_args, told

from countersign.contract import ActionRecord, Outcome
from countersign.integrations.langchain import (
    EDIT_NOTICE,
    CountersignMiddleware,
    countersign_actions,
    countersign_tools,
)

SERVICES = "examples.langchain_agent.agent:services,tests.support.langchain_wiring:served"
"""The example, and the miswired agents beside it."""


@pytest.fixture(scope="module")
def fake() -> Iterator[oai.OpenAIFake]:
    """One fake for the module: each test's model is named after its run, so each has its own script
    and `fake.seen(run_id)` is that test's traffic only."""
    with running(oai.OpenAIFake()) as server:
        yield server


@pytest.fixture(scope="module")
def module_stack_app_env(fake: oai.OpenAIFake, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The app's settings (conftest's `module_stack`, and `own_stack`): the desk's, its model at the fake."""
    return desk_env(fake, tmp_path_factory.mktemp("langchain-desk"), SERVICES)


@pytest.fixture()
def stack(module_stack: IsolatedStack) -> IsolatedStack:
    """The module's stack: each test runs under a run id (and orders) of its own."""
    return module_stack


def start(stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str, *calls: tuple[str, dict[str, Any]]) -> str:
    return desk.start(stack, fake, "LangChainRefunds", None, run_id, *calls)


def test_an_approved_refund_runs_once_and_the_model_hears_its_result(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    # A plain LangChain tool after the gated call in the same reply waits its turn and runs untouched.
    invocation = start(
        stack, fake, run_id, ("issue_refund", refund_args(order, "800.00")), ("refund_rules", {"order_id": order})
    )
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert "Refund $800.00 to order" in mail.text and WHY in mail.text, "the model's words are the why"
    assert "An agent working for" in mail.text and "Why (the agent's words):" in mail.text  # the adapter asks
    assert refunds_for(stack.db_path, run_id) == [], "nothing runs before the approval"
    assert submit(mail.link, "approve").status_code == 200

    output = finish(stack, invocation)
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    refund, rules = told(fake, run_id)
    assert json.loads(refund)["amount_usd"] == "800.00" and json.loads(refund)["order_id"] == order
    assert rules == f"Order {order}: damaged or late parcels are refunded in full."
    [action] = output["actions"]
    assert (action["outcome"], action["approved_by"]) == ("approved", ["finance@example.com"])
    assert output["answer"] == f"{refund} | {rules}"
    assert len(fake.seen(run_id)) == 2, "one model call before the approval, one after"


def test_an_edit_is_what_runs_and_the_model_is_told_what_ran(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "800.00")))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert submit(mail.link, "approve", edits={"amount_usd": "650.00"}).status_code == 200

    output = finish(stack, invocation)
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 65000)]
    [result] = told(fake, run_id)
    notice, response = result.split("\n\nTool response:\n")
    assert notice.startswith(EDIT_NOTICE) and '"amount_usd": "650.00"' in notice
    assert json.loads(response)["amount_usd"] == "650.00"
    [action] = output["actions"]
    assert action["outcome"] == "approved_with_edits" and action["edits"] == {"amount_usd": "650.00"}


def test_a_rejection_reaches_the_model_with_the_reason_and_nothing_runs(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "800.00")))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert submit(mail.link, "reject", reason="already refunded by phone").status_code == 200

    output = finish(stack, invocation)
    assert refunds_for(stack.db_path, run_id) == []
    denial = "Rejected by the approver: already refunded by phone. Do not propose this exact call again."
    assert told(fake, run_id) == [denial]
    assert output["answer"] == denial and output["actions"][0]["outcome"] == "rejected"


def test_a_passed_deadline_is_a_denial_that_says_so(stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str) -> None:
    args = {"customer_id": "c_17", "subject": "Your refund", "body": "It is on its way."}
    invocation = start(stack, fake, run_id, ("email_customer", args))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert "The refund desk writes to the customer." in mail.text, "interrupt_on's description is the why"
    csrf = form_csrf(mail.link)

    output = finish(stack, invocation)
    [result] = told(fake, run_id)
    assert result.startswith("Not run: the approval expired before anyone decided (") and "deadline passed" in result
    assert output["actions"][0]["decision_source"] == "deadline_default"
    late = submit(mail.link, "approve", csrf=csrf)
    assert late.status_code == 409 and "expired" in late.text


def test_a_refund_the_policy_does_not_gate_runs_alone(stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str) -> None:
    order = new_order(stack.db_path, 90000)
    invocation = start(stack, fake, run_id, ("issue_refund", refund_args(order, "5.00")))
    output = finish(stack, invocation)
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 500)]
    assert output["actions"][0]["outcome"] == "autonomous"
    assert json.loads(told(fake, run_id)[0])["amount_usd"] == "5.00"
    assert list(stack.outbox_dir.glob(f"approval-request_{run_id}-*")) == []


def test_two_calls_of_one_reply_are_asked_one_after_another(
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
    # The second approver sees the first call as the run's earlier step.
    assert "What this run did before asking:" in later.text and "#0 issue_refund: approved" in later.text
    assert submit(later.link, "reject", reason="one refund is enough").status_code == 200

    output = finish(stack, invocation)
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", first, 80000)]
    approved, rejected = told(fake, run_id)
    assert json.loads(approved)["order_id"] == first
    assert rejected.startswith("Rejected by the approver: one refund is enough")
    assert [a["outcome"] for a in output["actions"]] == ["approved", "rejected"]


@pytest.mark.parametrize(
    ("order", "error"),
    [
        (["countersign", "restate"], "CountersignMiddleware must come after RestateMiddleware()"),
        (["countersign"], "CountersignMiddleware needs RestateMiddleware() before it"),
        (["restate"], "'issue_refund' is a Countersign tool: give the agent CountersignMiddleware()"),
    ],
    ids=["gate-first", "no-restate", "no-gate"],
)
def test_a_miswired_agent_fails_its_run_and_runs_nothing(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str, order: list[str], error: str
) -> None:
    first, second = new_order(stack.db_path, 90000), new_order(stack.db_path, 90000)
    calls = [("issue_refund", refund_args(first, "800.00")), ("issue_refund", refund_args(second, "700.00"))]
    fake.script(run_id, oai.tool_calls(run_id, *calls), oai.answer(run_id, "Done."))
    invocation = stack.ingress.send("LangChainWiring", None, "run", {"model": f"openai:{run_id}", "order": order})
    failed = stack.ingress.wait_invocation(invocation, timeout=60)
    assert failed.status_code == 500 and error in failed.json()["message"], failed.text
    # Not even the reply's first call, whose turn is open from the start, is put to a person.
    assert requests_about(stack.outbox_dir, f"order {first}") == [], "nobody was asked"
    with sqlite3.connect(stack.db_path) as db:
        assert db.execute("SELECT count(*) FROM refunds WHERE order_id IN (?, ?)", (first, second)).fetchone() == (0,)


def test_a_gate_placed_before_restate_is_refused_before_a_reply_of_one_call_is_asked(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str
) -> None:
    misordered_for_one_call(stack, fake, run_id, ("LangChainWiring", None), "must come after RestateMiddleware()")


def agent_statuses(stack: IsolatedStack) -> set[str]:
    return {row["status"] for row in stack.restate.invocation_statuses(service="LangChainRefunds")}


@pytest.mark.slow
def test_kill9_of_the_handler_while_pending_then_approve_runs_the_refund_once(
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

    output = finish(stack, invocation)
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    assert output["actions"][0]["outcome"] == "approved"
    assert len(fake.seen(run_id)) == 2, "the journaled model call is not asked again after the crash"
    assert len(wait_for_email(stack.outbox_dir, run_id)) == 1, "one approval email, not one per attempt"


def test_interrupt_on_takes_langchains_vocabulary_where_countersign_can_honour_it() -> None:
    CountersignMiddleware(interrupt_on={"issue_refund": True, "refund_rules": False})
    CountersignMiddleware(interrupt_on={"email_customer": {"description": "Writes to a customer."}})
    with pytest.raises(ValueError, match="is a Countersign tool: its policy says when"):
        CountersignMiddleware(interrupt_on={"issue_refund": False})
    with pytest.raises(ValueError, match="not among the loaded Countersign tools"):
        CountersignMiddleware(interrupt_on={"delete_file": True})
    with pytest.raises(ValueError, match="allowed_decisions: the decisions a person may take"):
        CountersignMiddleware(interrupt_on={"issue_refund": {"allowed_decisions": ["approve", "reject"]}})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="launch_rocket not among the loaded tools"):
        countersign_tools(["launch_rocket"])
    [refund] = countersign_tools(["issue_refund"])
    assert refund.name == "issue_refund" and "amount_usd" in refund.args


def test_the_record_travels_as_the_tool_messages_artifact() -> None:
    record = ActionRecord(index=0, tool="issue_refund", proposed_args={}, outcome=Outcome.EXPIRED, reason="late")
    message = CountersignMiddleware()._message({"name": "issue_refund", "args": {}, "id": "c1"}, record)
    assert message.status == "error" and message.tool_call_id == "c1"
    assert message.content == "Not run: the approval expired before anyone decided (late)."
    assert countersign_actions([message]) == [record]


def test_the_adapter_without_the_extra_names_the_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['langchain'] = None\n"
        "import countersign.integrations\n"
        "try:\n    import countersign.integrations.langchain\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install -c requirements.lock 'countersign_approvals-0.1.0-py3-none-any.whl[langchain]'" in done.stdout

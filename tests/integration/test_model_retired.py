"""The pinned model is retired while a run waits for an approval: after the approval, the provider
answers 404 model-not-found (the real SDKs against the fakes). The approved refund still runs from its
frozen arguments; then the policy's choice (a successor model) or the run's own (`end`) decides what
follows: the run goes on with the successor (recorded in the run state, `show` and the audit trail), or
ends with the explicit status `model_retired`, never a generic model failure. And the real adapters ask
for the model's confidence in a tool whose policy gates on it, and take it out of the arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import anthropic_server as anth
from fakes import openai_server as oai
from fakes.fixtures import model_stack, provider_env, running
from fakes.provider import FakeProvider, Reply
from support.approver import form_after_restart, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import REPO, IsolatedStack, wait_until

SUCCESSOR = "policy-successor"
POLICY = f"""[tools.issue_refund]
on_model_retired = {{ successor = "openai:{SUCCESSOR}" }}
gate_below_confidence = 0.7
"""


@pytest.fixture(scope="module")
def openai_fake() -> Iterator[oai.OpenAIFake]:
    with running(oai.OpenAIFake()) as fake:
        yield fake


@pytest.fixture(scope="module")
def anthropic_fake() -> Iterator[anth.AnthropicFake]:
    with running(anth.AnthropicFake()) as fake:
        yield fake


@pytest.fixture(scope="module")
def stack(
    openai_fake: oai.OpenAIFake, anthropic_fake: anth.AnthropicFake, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IsolatedStack]:
    root = tmp_path_factory.mktemp("retired")
    (root / "policy.toml").write_text(POLICY)
    env = {**provider_env(openai_fake, anthropic_fake), "APPROVALS_POLICY_FILE": str(root / "policy.toml")}
    with model_stack(root, env) as started:
        yield started


@pytest.fixture(params=["openai", "anthropic"])
def provider(request: pytest.FixtureRequest, openai_fake: oai.OpenAIFake, anthropic_fake: anth.AnthropicFake) -> str:
    return str(request.param)


def fake_of(prefix: str, openai_fake: oai.OpenAIFake, anthropic_fake: anth.AnthropicFake) -> FakeProvider:
    return openai_fake if prefix == "openai" else anthropic_fake


def calls(prefix: str, model: str, name: str, args: dict[str, Any]) -> Reply:
    return oai.tool_calls(model, (name, args)) if prefix == "openai" else anth.tool_use(model, (name, args))


def start_refund(stack: IsolatedStack, fake: FakeProvider, prefix: str, model: str, run_id: str, **task: Any) -> int:
    order = new_order(stack.db_path, 125000)
    fake.script(
        model,
        calls(prefix, model, "lookup_order", {"order_id": order}),
        calls(prefix, model, "issue_refund", {"order_id": order, "amount_usd": "700.00", "reason": "damaged"}),
    )
    body = {"goal": f"Refund order {order}", "requester": "alice@example.com", "model": f"{prefix}:{model}", **task}
    assert stack.ingress.start_run(run_id, body).status_code == 202
    return order


def show(stack: IsolatedStack, run_id: str) -> dict[str, Any]:
    env = {
        "RESTATE_INGRESS_URL": stack.restate.ingress_url,
        "RESTATE_ADMIN_URL": stack.restate.admin_url,
        "COUNTERSIGN_JOURNAL_KEYS": stack.restate.journal_keys,
        "PATH": "/usr/bin:/bin",
    }
    shown = subprocess.run(
        [sys.executable, "-m", "countersign", "show", run_id, "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    found: dict[str, Any] = json.loads(shown.stdout)
    return found


def test_retired_after_the_approval_goes_on_with_the_policys_successor(
    stack: IsolatedStack,
    provider: str,
    openai_fake: oai.OpenAIFake,
    anthropic_fake: anth.AnthropicFake,
    run_id: str,
) -> None:
    fake, model = fake_of(provider, openai_fake, anthropic_fake), f"fake-{run_id}"
    order = start_refund(stack, fake, provider, model, run_id)
    openai_fake.script(SUCCESSOR, oai.answer(SUCCESSOR, "Refunded $700.00 (on the successor)."))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    fake.retire(model)
    assert submit(mail.link, "approve", csrf=form_after_restart(mail.link)).status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()

    assert result["status"] == "completed", result
    assert result["answer"] == "Refunded $700.00 (on the successor)."
    assert result["model"] == f"openai:{SUCCESSOR}"
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "approved"]
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/1", order, 70000)], "the approved refund ran once"
    assert len(fake.seen(model)) == 3, "two turns, then one 404 (a retired model is not retried)"
    told = oai.tool_messages(openai_fake.seen(SUCCESSOR)[-1].body)
    assert '"outcome": "approved"' in told[-1]["content"], "the successor reads the approved refund's outcome"

    shown = show(stack, run_id)
    [switch] = shown["model_switches"]
    assert switch["retired"] == f"{provider}:{model}" and switch["successor"] == f"openai:{SUCCESSOR}"
    assert shown["model"] == f"openai:{SUCCESSOR}"
    retired = wait_until(
        lambda: [e for e in show(stack, run_id)["audit"][f"{run_id}-a1"] if e["kind"] == "model_retired"] or None,
        20,
        "the audit trail to record the retirement",
    )
    assert retired[0]["details"]["successor"] == f"openai:{SUCCESSOR}"


def test_retired_after_the_approval_ends_the_run_when_it_asks_to_even_after_a_kill9(
    stack: IsolatedStack,
    provider: str,
    openai_fake: oai.OpenAIFake,
    anthropic_fake: anth.AnthropicFake,
    run_id: str,
) -> None:
    fake, model = fake_of(provider, openai_fake, anthropic_fake), f"fake-{run_id}"
    successor_requests = len(openai_fake.seen(SUCCESSOR))
    order = start_refund(stack, fake, provider, model, run_id, on_model_retired="end")
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    stack.app.kill9()
    stack.app.restart()
    fake.retire(model)
    assert submit(mail.link, "approve", csrf=form_after_restart(mail.link)).status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()

    assert result["status"] == "model_retired", result
    assert "no longer available" in result["answer"] and "fresh plan is needed" in result["answer"]
    assert "The model call failed" not in result["answer"]
    assert result["model"] == f"{provider}:{model}"
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "approved"]
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/1", order, 70000)], "the approved refund ran once"
    status = stack.ingress.status(run_id)
    assert status["phase"] == "model_retired"
    [switch] = status["model_switches"]
    assert switch["retired"] == f"{provider}:{model}" and switch["successor"] is None
    assert "404" in switch["detail"]
    assert len(openai_fake.seen(SUCCESSOR)) == successor_requests, (
        "the run's own `end` wins over the policy's successor"
    )


def schemas(prefix: str, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The argument schema of each tool the model was offered, by name."""
    if prefix == "openai":
        return {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    return {t["name"]: t["input_schema"] for t in body["tools"]}


def test_the_adapters_ask_for_confidence_and_a_low_one_stops_a_small_refund(
    stack: IsolatedStack,
    provider: str,
    openai_fake: oai.OpenAIFake,
    anthropic_fake: anth.AnthropicFake,
    run_id: str,
) -> None:
    fake, model = fake_of(provider, openai_fake, anthropic_fake), f"fake-{run_id}"
    order = new_order(stack.db_path, 10000)
    refund = {"order_id": order, "amount_usd": "100.00", "reason": "damaged", "confidence": 0.35}
    fake.script(
        model,
        calls(provider, model, "lookup_order", {"order_id": order}),
        calls(provider, model, "issue_refund", refund),
        oai.answer(model, "Not refunded.") if provider == "openai" else anth.answer(model, "Not refunded."),
    )
    body = {"goal": f"Refund order {order}", "requester": "alice@example.com", "model": f"{provider}:{model}"}
    assert stack.ingress.start_run(run_id, body).status_code == 202
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert "Stopped because the model's confidence was 0.35 < 0.70" in mail.text
    [record] = stack.ingress.status(run_id)["approvals"]
    assert record["args"] == {"order_id": order, "amount_usd": "100.00", "reason": "damaged"}, "not an argument"
    assert record["confidence"] == 0.35
    offered = schemas(provider, fake.seen(model)[0].body)
    assert offered["issue_refund"]["properties"]["confidence"]["maximum"] == 1
    assert "confidence" not in offered["lookup_order"]["properties"], "only a tool whose policy asks"
    first = fake.seen(model)[0].body
    system = first["messages"][0]["content"] if provider == "openai" else first["system"]
    assert "When you call issue_refund, give `confidence`" in system
    assert submit(mail.link, "reject", reason="the amount looks wrong").status_code == 200
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "rejected"]
    assert refunds_for(stack.db_path, run_id) == []

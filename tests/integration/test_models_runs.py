"""Agent runs with real model adapters: the app talks through the real SDKs to local fake providers.

One private stack (restate-server + app) serves the module; each test scripts its own model name
at the fakes, so requests are counted per test. What a fake saw is what the provider would have seen.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes import anthropic_server as anth
from fakes import openai_server as oai
from fakes.fixtures import model_stack, provider_env, running
from fakes.provider import FakeProvider, JsonObject, Reply, Step
from support.approver import approval_emails, form_csrf, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import IsolatedStack, wait_until


@dataclass(frozen=True)
class Provider:
    """One fake provider and its wire format, so a test can run against either."""

    prefix: str
    fake: FakeProvider

    def calls(self, model: str, *calls: tuple[str, Any], text: str | None = None) -> Reply:
        if self.prefix == "openai":
            return oai.tool_calls(model, *calls, text=text)
        return anth.tool_use(model, *calls, text=text)

    def answer(self, model: str, text: str) -> Reply:
        return oai.answer(model, text) if self.prefix == "openai" else anth.answer(model, text)

    @staticmethod
    def call_ids(reply: Reply) -> list[str]:
        if "choices" in reply.body:
            return [c["id"] for c in reply.body["choices"][0]["message"]["tool_calls"]]
        return [b["id"] for b in reply.body["content"] if b["type"] == "tool_use"]

    def results(self, body: JsonObject) -> dict[str, str]:
        """Tool results in a request: call id -> the text the model reads."""
        if self.prefix == "openai":
            return {m["tool_call_id"]: m["content"] for m in oai.tool_messages(body)}
        return {r["tool_use_id"]: r["content"] for r in anth.tool_results(body)}

    def user_texts(self, body: JsonObject) -> list[str]:
        texts = []
        for m in body["messages"]:
            if m["role"] != "user":
                continue
            if isinstance(m["content"], str):
                texts.append(m["content"])
            else:
                texts += [b["text"] for b in m["content"] if b.get("type") == "text"]
        return texts


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
    with model_stack(tmp_path_factory.mktemp("models"), provider_env(openai_fake, anthropic_fake)) as started:
        yield started


@pytest.fixture(params=["openai", "anthropic"])
def provider(
    request: pytest.FixtureRequest, openai_fake: oai.OpenAIFake, anthropic_fake: anth.AnthropicFake
) -> Provider:
    return Provider(request.param, openai_fake if request.param == "openai" else anthropic_fake)


@pytest.fixture()
def model(run_id: str) -> str:
    return f"fake-{run_id}"


def task(provider: Provider, model: str, goal: str) -> dict[str, Any]:
    return {"goal": goal, "requester": "alice@example.com", "model": f"{provider.prefix}:{model}"}


def finish(stack: IsolatedStack, run_id: str) -> dict[str, Any]:
    response = stack.ingress.wait_output(run_id, timeout=60)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def reacting(check: Callable[[JsonObject], Reply]) -> Step:
    return check


# --- approvals ---------------------------------------------------------------------------------------


def test_gated_call_approved_over_several_turns(
    stack: IsolatedStack, provider: Provider, model: str, run_id: str
) -> None:
    order = new_order(stack.db_path, 125000)
    lookup = provider.calls(model, ("lookup_order", {"order_id": order}), text="Let me check the order first.")
    refund = provider.calls(
        model,
        ("issue_refund", {"order_id": order, "amount_usd": "700.00", "reason": "damaged in transit"}),
        text="The customer sent photos of the damage.",
    )
    [lookup_id], [refund_id] = provider.call_ids(lookup), provider.call_ids(refund)

    def after_approval(body: JsonObject) -> Reply:
        told = provider.results(body)[refund_id]
        return provider.answer(model, "Refunded $700.00." if '"outcome": "approved"' in told else f"Unexpected: {told}")

    provider.fake.script(model, lookup, refund, reacting(after_approval))
    assert stack.ingress.start_run(run_id, task(provider, model, f"Refund order {order} for $700")).status_code == 202

    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert "The customer sent photos of the damage." in mail.text, "the model's reason is shown to the approver"
    assert submit(mail.link, "approve").status_code == 200
    result = finish(stack, run_id)

    assert result["status"] == "completed" and result["answer"] == "Refunded $700.00."
    assert result["model"] == f"{provider.prefix}:{model}"
    assert [(a["tool"], a["outcome"]) for a in result["actions"]] == [
        ("lookup_order", "autonomous"),
        ("issue_refund", "approved"),
    ]
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/1", order, 70000)]
    first, second, third = (seen.body for seen in provider.fake.seen(model))
    assert provider.results(first) == {}
    assert '"customer_id": "c_17"' in provider.results(second)[lookup_id]
    approved = provider.results(third)[refund_id]
    assert '"outcome": "approved"' in approved and '"refund_id"' in approved


def test_a_cancel_during_the_model_turn_that_proposes_a_gated_call_executes_nothing(
    stack: IsolatedStack, provider: Provider, model: str, run_id: str
) -> None:
    """The cancel comes while the model is still answering (its turn had already checked for one):
    the run asks its approvers, then finds the cancel, closes its approval and runs nothing."""
    order = new_order(stack.db_path, 125000)
    lookup = provider.calls(model, ("lookup_order", {"order_id": order}))
    refund = provider.calls(model, ("issue_refund", {"order_id": order, "amount_usd": "700.00", "reason": "late"}))
    provider.fake.script(model, lookup, Reply(refund.status, refund.body, delay=1.0))
    assert stack.ingress.start_run(run_id, task(provider, model, f"Refund order {order} for $700")).status_code == 202
    wait_until(lambda: len(provider.fake.seen(model)) == 2, 30, "the model's second turn to be asked")
    receipt = stack.ingress.call("AgentRun", run_id, "cancel", {"reason": "changed our mind"}).json()
    assert receipt["accepted"], receipt
    assert len(provider.fake.seen(model)) == 2 and not refunds_for(stack.db_path, run_id)
    result = finish(stack, run_id)
    assert result["status"] == "cancelled", result
    assert [(a["tool"], a["outcome"]) for a in result["actions"]] == [
        ("lookup_order", "autonomous"),
        ("issue_refund", "cancelled"),
    ]
    assert refunds_for(stack.db_path, run_id) == []


def test_a_cancel_that_read_the_run_before_its_approval_existed_still_cancels_it(
    openai_fake: oai.OpenAIFake, anthropic_fake: anth.AnthropicFake, tmp_path: Path, run_id: str
) -> None:
    """The cancel reads the run while the model is still answering (no approval to close yet) and,
    held by the `slow-cancel` fault point, completes the run's promise only after the run has frozen
    its approval and emailed it: the waiting run hears the cancel and passes it on; nothing runs."""
    provider, model = Provider("openai", openai_fake), f"fake-{run_id}"
    env = {**provider_env(openai_fake, anthropic_fake), "COUNTERSIGN_FAULT": "slow-cancel"}
    with model_stack(tmp_path, env) as stack:
        order = new_order(stack.db_path, 125000)
        refund = provider.calls(model, ("issue_refund", {"order_id": order, "amount_usd": "700.00", "reason": "late"}))
        provider.fake.script(model, Reply(refund.status, refund.body, delay=1.0))
        started = stack.ingress.start_run(run_id, task(provider, model, f"Refund order {order} for $700"))
        assert started.status_code == 202
        wait_until(lambda: len(provider.fake.seen(model)) == 1, 30, "the model's turn to be asked")
        receipt = stack.ingress.call("AgentRun", run_id, "cancel", {"reason": "changed our mind"}).json()
        assert receipt["accepted"] and receipt["cancelled_approvals"] == [], receipt
        # The approval was asked for before the cancel completed the run's promise: the race was run.
        assert approval_emails(stack.outbox_dir, run_id, "request"), "the request email went out first"
        result = finish(stack, run_id)
        assert result["status"] == "cancelled", result
        assert [(a["tool"], a["outcome"]) for a in result["actions"]] == [("issue_refund", "cancelled")]
        assert refunds_for(stack.db_path, run_id) == []
        assert len(provider.fake.seen(model)) == 1


def test_rejection_reason_reaches_the_model_which_reacts(
    stack: IsolatedStack, provider: Provider, model: str, run_id: str
) -> None:
    order = new_order(stack.db_path, 90000)
    reason = "Photos show no damage; offer a replacement instead."
    refund = provider.calls(model, ("issue_refund", {"order_id": order, "amount_usd": "650.00", "reason": "damaged"}))
    [refund_id] = provider.call_ids(refund)

    def after_rejection(body: JsonObject) -> Reply:
        told = provider.results(body).get(refund_id, "")
        if '"outcome": "rejected"' in told and reason in told:
            return provider.answer(model, f"I did not refund order {order}: the approver said: {reason}")
        return refund  # a model that ignored the rejection would try again

    provider.fake.script(model, refund, reacting(after_rejection))
    stack.ingress.start_run(run_id, task(provider, model, f"Refund order {order} for $650"))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert submit(mail.link, "reject", reason).status_code == 200
    result = finish(stack, run_id)

    assert result["status"] == "completed"
    assert result["answer"] == f"I did not refund order {order}: the approver said: {reason}"
    assert [(a["outcome"], a["reason"]) for a in result["actions"]] == [("rejected", reason)]
    assert refunds_for(stack.db_path, run_id) == []
    [_, second] = provider.fake.seen(model)
    told = provider.results(second.body)[refund_id]
    assert reason in told and "final" in told


def test_an_edit_by_the_approver_is_told_to_the_model(
    stack: IsolatedStack, openai_fake: oai.OpenAIFake, model: str, run_id: str
) -> None:
    provider = Provider("openai", openai_fake)
    order = new_order(stack.db_path, 125000)
    refund = provider.calls(model, ("issue_refund", {"order_id": order, "amount_usd": "700.00", "reason": "late"}))
    [refund_id] = provider.call_ids(refund)

    def after_edit(body: JsonObject) -> Reply:
        told = json.loads(provider.results(body)[refund_id])
        edit = told.get("edited_by_approver", {}).get("amount_usd", {})
        return provider.answer(model, f"Refunded ${edit.get('approved')} (I proposed ${edit.get('proposed')}).")

    provider.fake.script(model, refund, reacting(after_edit))
    stack.ingress.start_run(run_id, task(provider, model, f"Refund order {order} for $700"))
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    edited = httpx.post(
        mail.link,
        data={"csrf": form_csrf(mail.link), "verdict": "approve", "edit.amount_usd": "500"},
        headers={"Origin": stack.app.url},
        timeout=30,
    )
    assert edited.status_code == 200, edited.text
    result = finish(stack, run_id)

    assert result["answer"] == "Refunded $500.00 (I proposed $700.00)."
    assert result["actions"][0]["outcome"] == "approved_with_edits"
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 50000)]
    told = json.loads(provider.results(provider.fake.seen(model)[1].body)[refund_id])
    assert told["outcome"] == "approved_with_edits" and "changed some arguments" in told["meaning"]


# --- provider errors ------------------------------------------------------------------------------------


def test_rate_limit_is_retried_after_the_providers_delay(
    stack: IsolatedStack, openai_fake: oai.OpenAIFake, model: str, run_id: str
) -> None:
    openai_fake.script(model, oai.rate_limited("2"), oai.answer(model, "Nothing to do."))
    stack.ingress.start_run(run_id, task(Provider("openai", openai_fake), model, "Say hello"))
    result = finish(stack, run_id)
    assert (result["status"], result["answer"]) == ("completed", "Nothing to do.")
    limited, retried = openai_fake.seen(model)
    assert limited.body == retried.body
    # The step's own backoff would retry after 1 s; the provider asked for 2.
    assert retried.at - limited.at >= 1.9, "the retry waited for the provider's retry-after"


def test_overload_and_timeout_are_retried(
    stack: IsolatedStack, openai_fake: oai.OpenAIFake, anthropic_fake: anth.AnthropicFake, model: str, run_id: str
) -> None:
    anthropic_fake.script(model, anth.overloaded(), anth.answer(model, "Done after an overload."))
    slow = oai.answer(model, "never read")
    openai_fake.script(model, Reply(slow.status, slow.body, delay=6.0), oai.answer(model, "Done after a timeout."))
    stack.ingress.start_run(run_id, task(Provider("anthropic", anthropic_fake), model, "Say hello"))
    stack.ingress.start_run(f"{run_id}-t", task(Provider("openai", openai_fake), model, "Say hello"))

    assert finish(stack, run_id)["answer"] == "Done after an overload."
    assert finish(stack, f"{run_id}-t")["answer"] == "Done after a timeout."
    assert len(anthropic_fake.seen(model)) == 2
    assert len(openai_fake.seen(model)) == 2


@pytest.mark.parametrize(
    ("prefix", "reply", "expected"),
    [
        (
            "openai",
            oai.error(400, "Invalid schema for function 'issue_refund'.", "invalid_request_error"),
            "refused the request (HTTP 400): invalid_request_error: Invalid schema for function 'issue_refund'.",
        ),
        (
            "anthropic",
            anth.error(404, "not_found_error", "model: claude-nope"),
            "refused the request (HTTP 404): not_found_error: model: claude-nope",
        ),
    ],
)
def test_a_final_4xx_fails_the_run_at_once(
    stack: IsolatedStack,
    openai_fake: oai.OpenAIFake,
    anthropic_fake: anth.AnthropicFake,
    model: str,
    run_id: str,
    prefix: str,
    reply: Reply,
    expected: str,
) -> None:
    provider = Provider(prefix, openai_fake if prefix == "openai" else anthropic_fake)
    provider.fake.script(model, reply)
    stack.ingress.start_run(run_id, task(provider, model, "Say hello"))
    result = finish(stack, run_id)
    assert result["status"] == "failed"
    assert result["answer"].startswith("The model call failed: ") and expected in result["answer"]
    assert len(provider.fake.seen(model)) == 1, "a final error is not retried"
    assert stack.ingress.status(run_id)["phase"] == "failed"


def test_retries_are_bounded_then_the_run_fails(
    stack: IsolatedStack, openai_fake: oai.OpenAIFake, model: str, run_id: str
) -> None:
    openai_fake.script(model, *[oai.error(500, "The server had an error.", "server_error")] * 4)
    stack.ingress.start_run(run_id, task(Provider("openai", openai_fake), model, "Say hello"))
    result = finish(stack, run_id)
    assert result["status"] == "failed"
    assert result["answer"] == (
        "The model call failed (gave up after 3 attempts): "
        "OpenAI-compatible endpoint answered HTTP 500: server_error: The server had an error."
    )
    assert len(openai_fake.seen(model)) == 3, "MODEL_MAX_ATTEMPTS=3"


# --- malformed output ---------------------------------------------------------------------------------


def test_malformed_output_goes_back_to_the_model(
    stack: IsolatedStack, openai_fake: oai.OpenAIFake, model: str, run_id: str
) -> None:
    order = new_order(stack.db_path, 5000)
    provider = Provider("openai", openai_fake)
    bad_json = oai.tool_calls(model, ("lookup_order", '{"order_id": ' + str(order)))
    unknown = oai.tool_calls(model, ("refund_everything", {}))
    bad_args = oai.tool_calls(model, ("lookup_order", {"order_id": "soon"}))
    lookup = oai.tool_calls(model, ("lookup_order", {"order_id": order}))
    empty = oai.completion(model, {"role": "assistant", "content": None, "refusal": None}, "stop")
    told: list[str] = []

    def after(previous: Reply, then: Reply) -> Step:
        def step(body: JsonObject) -> Reply:
            told.append(provider.results(body)[provider.call_ids(previous)[0]])
            return then

        return step

    def after_empty(body: JsonObject) -> Reply:
        told.append(provider.user_texts(body)[-1])
        return oai.answer(model, "Order looked up.")

    openai_fake.script(
        model,
        bad_json,
        after(bad_json, unknown),
        after(unknown, lookup),
        after(lookup, bad_args),
        after(bad_args, empty),
        after_empty,
    )
    stack.ingress.start_run(run_id, task(provider, model, f"Look up order {order}"))
    result = finish(stack, run_id)

    assert (result["status"], result["answer"]) == ("completed", "Order looked up.")
    assert [a["outcome"] for a in result["actions"]] == ["invalid", "invalid", "autonomous", "invalid"]
    bad_json_told, unknown_told, lookup_told, bad_args_told, empty_told = told
    assert "not valid JSON" in bad_json_told and '"outcome": "invalid"' in bad_json_told
    assert "unknown tool 'refund_everything'" in unknown_told and "lookup_order" in unknown_told
    assert '"outcome": "autonomous"' in lookup_told
    assert "order_id" in bad_args_told and "invalid arguments" in bad_args_told
    assert "Your last reply was empty" in empty_told


def test_malformed_output_is_bounded_then_the_run_fails(
    stack: IsolatedStack, anthropic_fake: anth.AnthropicFake, model: str, run_id: str
) -> None:
    order = new_order(stack.db_path, 5000)
    bad = ("issue_refund", {"order_id": order, "amount_usd": -5, "reason": "x"})
    anthropic_fake.script(model, *(anth.tool_use(model, bad) for _ in range(4)))
    stack.ingress.start_run(run_id, task(Provider("anthropic", anthropic_fake), model, "Refund something"))
    result = finish(stack, run_id)
    assert result["status"] == "failed"
    assert result["answer"].startswith("The model gave 3 malformed replies in a row (last: issue_refund: invalid")
    assert "amount_usd" in result["answer"]
    assert len(anthropic_fake.seen(model)) == 3
    assert refunds_for(stack.db_path, run_id) == []


# --- post-plan gating ----------------------------------------------------------------------------------


def test_a_real_model_plans_through_submit_plan_and_its_call_inside_the_plan_runs_unasked(
    stack: IsolatedStack, provider: Provider, model: str, run_id: str
) -> None:
    order = new_order(stack.db_path, 125000)
    plan = {"steps": [{"tool": "issue_refund", "args": {"order_id": order}, "at_most": {"amount_usd": 800}}]}
    proposed = provider.calls(model, ("submit_plan", plan), text="Here is my plan.")
    refund = provider.calls(
        model, ("issue_refund", {"order_id": order, "amount_usd": "700.00", "reason": "damaged in transit"})
    )
    [refund_id] = provider.call_ids(refund)

    def after_refund(body: JsonObject) -> Reply:
        told = provider.results(body)[refund_id]
        return provider.answer(model, "Done inside the plan." if '"inside_plan"' in told else f"Unexpected: {told}")

    provider.fake.script(model, proposed, refund, reacting(after_refund))
    goal = {**task(provider, model, f"Refund order {order} for $700"), "plan": {}}
    assert stack.ingress.start_run(run_id, goal).status_code == 202
    [mail] = wait_for_email(stack.outbox_dir, run_id, timeout=60)
    assert "Plan: issue_refund" in mail.message["Subject"]
    assert submit(mail.link, "approve").status_code == 200
    result = finish(stack, run_id)
    assert result["status"] == "completed" and result["answer"] == "Done inside the plan.", result
    outcomes = [(a["tool"], a["outcome"]) for a in result["actions"]]
    assert outcomes == [("plan", "approved"), ("issue_refund", "approved")]
    assert result["actions"][1]["plan_approval_id"] == f"{run_id}-a0"
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/1", order, 70000)]
    asked, after_plan, _ = (seen.body for seen in provider.fake.seen(model))
    names = [t.get("name") or t["function"]["name"] for t in asked["tools"]]
    assert "submit_plan" in names and "issue_refund" in names
    assert any("propose your plan" in t for t in provider.user_texts(asked))
    assert any("Your plan was approved" in t for t in provider.user_texts(after_plan)), "the model hears the outcome"

"""Replay after a crash: turns already journaled are never asked of the provider again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakes import anthropic_server as anth
from fakes import openai_server as oai
from fakes.fixtures import provider_env, running
from fakes.provider import JsonObject, Reply
from support.approver import form_csrf, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import IsolatedStack, StackFactory, wait_until

MODEL = "gpt-replay"


@pytest.fixture()
def openai_fake() -> Iterator[oai.OpenAIFake]:
    with running(oai.OpenAIFake()) as fake:
        yield fake


@pytest.fixture()
def anthropic_fake() -> Iterator[anth.AnthropicFake]:
    with running(anth.AnthropicFake()) as fake:
        yield fake


def run_statuses(stack: IsolatedStack, run_id: str) -> set[str]:
    rows = stack.restate.invocation_statuses(key=run_id)
    return {row["status"] for row in rows if row["target_handler_name"] == "run"}


@pytest.mark.slow
def test_kill9_while_pending_does_not_ask_the_model_again(
    isolated_stack: StackFactory, openai_fake: oai.OpenAIFake, anthropic_fake: anth.AnthropicFake
) -> None:
    stack = isolated_stack(app_env=provider_env(openai_fake, anthropic_fake))
    order = new_order(stack.db_path, 100000)
    lookup = oai.tool_calls(MODEL, ("lookup_order", {"order_id": order}))
    refund = oai.tool_calls(
        MODEL, ("issue_refund", {"order_id": order, "amount_usd": "800.00", "reason": "late"}), text="It was late."
    )
    refund_id = refund.body["choices"][0]["message"]["tool_calls"][0]["id"]

    def after_approval(body: JsonObject) -> Reply:
        told = {m["tool_call_id"]: m["content"] for m in oai.tool_messages(body)}
        return oai.answer(MODEL, "Refunded." if '"outcome": "approved"' in told.get(refund_id, "") else "Unexpected.")

    openai_fake.script(MODEL, lookup, refund, after_approval)
    task = {"goal": f"Refund order {order} for $800", "requester": "alice@example.com", "model": f"openai:{MODEL}"}
    stack.ingress.start_run("replay", task)
    [mail] = wait_for_email(stack.outbox_dir, "replay")
    csrf = form_csrf(mail.link)
    assert len(openai_fake.seen(MODEL)) == 2

    stack.app.kill9()
    wait_until(lambda: run_statuses(stack, "replay") & {"suspended", "backing-off"}, 30, "the run to park")
    stack.app.restart()
    # The restarted handler replays the run up to the pending approval, from the journal alone.
    wait_until(lambda: run_statuses(stack, "replay") == {"suspended"}, 60, "the replayed run to suspend again")
    assert len(openai_fake.seen(MODEL)) == 2, "a replay must not call the provider for journaled turns"

    assert submit(mail.link, "approve", csrf=csrf).status_code == 200
    result = stack.ingress.wait_output("replay", timeout=60).json()
    assert (result["status"], result["answer"]) == ("completed", "Refunded.")
    assert [a["outcome"] for a in result["actions"]] == ["autonomous", "approved"]
    assert refunds_for(stack.db_path, "replay") == [("replay/1", order, 80000)]
    seen = openai_fake.seen(MODEL)
    assert len(seen) == 3, "only the turn after the approval was new"
    assert len(seen[2].body["messages"]) == len(seen[1].body["messages"]) + 2, "the whole transcript was rebuilt"

"""What the framework adapters' tests share (tests/integration/test_langchain.py and test_adk.py):
each serves its example refund desk against the fake OpenAI server, with the same policy file, and scripts one model
reply of tool calls, then an answer that repeats what the tools returned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes import openai_server as oai
from fakes.provider import JsonObject, Reply

from support.approver import requests_about
from support.business import new_order
from support.processes import REPO, IsolatedStack

WHY = "The parcel arrived broken."
"""The model's words beside its tool calls (what the approver reads as the call's why)."""


def desk_env(fake: oai.OpenAIFake, root: Path, services: str) -> dict[str, str]:
    """The app's settings: `services` served, the model at the fake, a policy file written under `root`."""
    policy = root / "policy.toml"
    # Refunds over $10 need a person (the code says $500); an email to a customer waits 2 s at most.
    policy.write_text(
        '[tools.email_customer]\ndeadline_seconds = 2\n\n[tools.issue_refund]\nwhen = "amount_usd > 10.0"\n'
    )
    return {
        "COUNTERSIGN_SERVICES": services,
        "PYTHONPATH": str(REPO),
        "APPROVALS_POLICY_FILE": str(policy),
        "OPENAI_API_KEY": oai.API_KEY,
        "OPENAI_BASE_URL": fake.base_url,
    }


def echo_tool_results(model: str) -> Any:
    """The model's last reply: it repeats what its tool calls returned, so the answer shows it too."""

    def reply(body: JsonObject) -> Reply:
        return oai.answer(model, " | ".join(str(m["content"]) for m in oai.tool_messages(body)))

    return reply


def start(
    stack: IsolatedStack,
    fake: oai.OpenAIFake,
    service: str,
    key: str | None,
    run_id: str,
    *calls: tuple[str, dict[str, Any]],
) -> str:
    """Script one reply of tool calls then the answer, and start the desk on `run_id` (its model is
    named after the run, so each test has its own script); the invocation id."""
    fake.script(run_id, oai.tool_calls(run_id, *calls, text=WHY), echo_tool_results(run_id))
    task = {"run_id": run_id, "task": "Refund the broken order.", "requester": "alice@example.com"}
    return stack.ingress.send(service, key, "run", {**task, "model": f"openai:{run_id}"})


def told(fake: oai.OpenAIFake, model: str) -> list[str]:
    """The tool results the model was sent, in order (from the last request, which carries them all)."""
    return [str(m["content"]) for m in oai.tool_messages(fake.seen(model)[-1].body)]


def finish(stack: IsolatedStack, invocation: str) -> dict[str, Any]:
    done = stack.ingress.wait_invocation(invocation, timeout=60)
    assert done.status_code == 200, done.text
    output: dict[str, Any] = done.json()
    return output


def refund_args(order: int, amount: str) -> dict[str, Any]:
    return {"order_id": order, "amount_usd": amount, "reason": "damaged"}


def misordered_for_one_call(
    stack: IsolatedStack, fake: oai.OpenAIFake, run_id: str, wiring: tuple[str, str | None], error: str
) -> None:
    """An agent whose Countersign hook sits before Restate's (`wiring`: its service and key), its model
    replying with one gated call: the run fails with `error`, and nobody is asked. (A reply's first call
    has its turn from the start, so only the model call can tell the order.)"""
    order = new_order(stack.db_path, 90000)
    fake.script(run_id, oai.tool_calls(run_id, ("issue_refund", refund_args(order, "800.00"))), oai.answer(run_id, "."))
    task = {"model": f"openai:{run_id}", "order": ["countersign", "restate"]}
    failed = stack.ingress.wait_invocation(stack.ingress.send(*wiring, "run", task), timeout=60)
    assert failed.status_code == 500 and error in failed.json()["message"], failed.text
    assert requests_about(stack.outbox_dir, f"order {order}") == [], "nobody was asked"

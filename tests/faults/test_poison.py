"""Poison input: oversized and deeply nested tasks, huge model replies, malformed and oversized form
bodies, invalid UTF-8. Each is a clear 4xx (or, for a model's bad call, an `invalid` outcome the model
is told about); nothing is decided or executed by it, and no invocation is left running or retrying.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes import openai_server as oai
from fakes.fixtures import TEST_MODEL_SETTINGS, model_stack, running
from support.approver import form_csrf, wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress, IsolatedStack, RestateServer, wait_until

from countersign.contract import MAX_TOOL_ARGS_BYTES, MAX_WHY

FORM = "application/x-www-form-urlencoded"


def unfinished(restate: RestateServer, key: str) -> list[str]:
    """Statuses of this key's invocations that are not completed (a waiting run shows as suspended)."""
    return [row["status"] for row in restate.invocation_statuses(key=key) if row["status"] != "completed"]


def human_decisions(ingress: Ingress, approval_id: str) -> list[dict[str, Any]]:
    entries = ingress.call("ApprovalAudit", approval_id, "entries", None).json()["entries"]
    return [e for e in entries if e["kind"] == "decided"]


def test_poison_forms_are_refused_and_decide_nothing(
    app_server: AppServer,
    ingress: Ingress,
    restate_server: RestateServer,
    outbox_dir: Path,
    demo_db: Path,
    run_id: str,
) -> None:
    order = new_order(demo_db, 100000)
    script = [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "700.00", "reason": "r"}}]
    ingress.start_run(run_id, {"goal": "poison forms", "requester": "alice@example.com", "script": script})
    [mail] = wait_for_email(outbox_dir, run_id)
    csrf = form_csrf(mail.link)
    same_origin = {"Origin": app_server.url, "content-type": FORM}
    form = f"csrf={csrf}&verdict=reject&reason=".encode()
    base, token = mail.link.rsplit("/", 1)

    def chunked(total: int) -> Iterator[bytes]:
        yield form
        for _ in range(total // 65536):
            yield b"x" * 65536

    cases: dict[str, tuple[str, str, bytes | Iterator[bytes] | None, dict[str, str]]] = {
        "percent-encoded invalid UTF-8": ("POST", mail.link, form + b"%ff%fe%fd", same_origin),
        "raw invalid UTF-8": ("POST", mail.link, form + b"\xff\xfe\xfd", same_origin),
        "invalid UTF-8 verdict": ("POST", mail.link, f"csrf={csrf}&verdict=%c3%28".encode(), same_origin),
        "NUL in the verdict": ("POST", mail.link, f"csrf={csrf}&verdict=approve%00".encode(), same_origin),
        "oversized body": ("POST", mail.link, form + b"x" * 200_000, same_origin),
        "too many fields": ("POST", mail.link, form + b"&" + b"&".join(b"f%d=1" % i for i in range(5000)), same_origin),
        "deep JSON reason": ("POST", mail.link, form + b"%5B" * 3000 + b"%5D" * 3000, same_origin),
        "deep JSON edit": (
            "POST",
            mail.link,
            f"csrf={csrf}&verdict=approve&edit.amount_usd=".encode() + b"%5B" * 3000 + b"%5D" * 3000,
            same_origin,
        ),
        "a JSON body": ("POST", mail.link, b'{"verdict":' * 3000, {**same_origin, "content-type": "application/json"}),
        "multipart body": ("POST", mail.link, b"--x\r\n\r\n", {**same_origin, "content-type": "multipart/form-data"}),
        "oversized token": ("GET", f"{base}/{token}{'A' * 30000}", None, {}),
        "invalid UTF-8 token": ("GET", f"{base}/%ff%fe{token}", None, {}),
        "oversized token, POST": ("POST", f"{base}/{'A' * 30000}", form + b"x", same_origin),
    }
    for name, (method, url, body, headers) in cases.items():
        reply = httpx.request(method, url, content=body, headers=headers, timeout=30)
        assert 400 <= reply.status_code < 500, (name, reply.status_code, reply.text[-300:])
        assert "Traceback" not in reply.text and token not in reply.text, name
        assert ingress.status(run_id)["pending"], f"{name} decided something"

    # No length announced, 64 MiB sent: refused (413 by the pages' body limit, 1 MiB) without reading to the end.
    started = time.monotonic()
    try:
        reply = httpx.post(mail.link, content=chunked(64 * 2**20), headers=same_origin, timeout=30)
        assert reply.status_code == 413, reply.text[-300:]
    except httpx.TransportError:
        pass  # the server answered and closed while the client was still sending: also a refusal
    assert time.monotonic() - started < 20
    assert ingress.status(run_id)["pending"] and human_decisions(ingress, f"{run_id}-a0") == []

    approved = httpx.post(mail.link, data={"csrf": csrf, "verdict": "approve"}, headers={"Origin": app_server.url})
    assert approved.status_code == 200, "the page still works after all that"
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "approved"
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/0", order, 70000)]
    assert unfinished(restate_server, run_id) == []


def test_poison_tasks_are_a_400_and_leave_nothing_running(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, demo_db: Path, run_id: str
) -> None:
    def task(**fields: Any) -> dict[str, Any]:
        return {"goal": "poison", "requester": "alice@example.com", **fields}

    deep = '{"a":' * 5000 + "1" + "}" * 5000
    raw = {
        "deep JSON in a script step": (
            '{"goal": "g", "requester": "a@example.com", "script": [{"tool": "lookup_order", "args": ' + deep + "}]}"
        ).encode(),
        "deep JSON in metadata": ('{"goal": "g", "requester": "a@example.com", "metadata": ' + deep + "}").encode(),
        "invalid UTF-8": b'{"goal": "\xff\xfe", "requester": "a@example.com"}',
        "oversized arguments": httpx.Request(
            "POST",
            "/",
            json=task(script=[{"tool": "issue_refund", "args": {"order_id": 1, "reason": "x" * 100_000}}]),
        ).read(),
    }
    messages = {
        "deep JSON in a script step": "recursion limit",
        "deep JSON in metadata": "recursion limit",
        "invalid UTF-8": "invalid unicode",
        "oversized arguments": f"at most {MAX_TOOL_ARGS_BYTES} are accepted",
    }
    for i, (name, body) in enumerate(raw.items()):
        key = f"{run_id}-{i}"
        reply = ingress.client.post(f"/AgentRun/{key}/run", content=body, headers={"content-type": "application/json"})
        assert reply.status_code == 400, (name, reply.text[:300])
        assert messages[name] in reply.json()["message"], (name, reply.json()["message"][:300])
        assert unfinished(restate_server, key) == [], name

    too_big = ingress.client.post(f"/AgentRun/{run_id}-big/run", json=task(goal="x" * (40 * 2**20)))
    assert too_big.status_code == 413, "Restate's ingress refuses bodies over its 32 MiB limit"

    # Arguments over the tool's own limits are the model's mistake: it is told, nothing runs.
    order = new_order(demo_db, 100000)
    over_limits = {"order_id": order, "amount_usd": "-5", "reason": "r" * 501}
    key = f"{run_id}-tool"
    result = ingress.call("AgentRun", key, "run", task(script=[{"tool": "issue_refund", "args": over_limits}]))
    assert result.status_code == 200
    [action] = result.json()["actions"]
    assert action["outcome"] == "invalid" and "reason" in action["result"]["error"]
    assert refunds_for(demo_db, key) == [] and unfinished(restate_server, key) == []


@pytest.fixture(scope="module")
def openai_fake() -> Iterator[oai.OpenAIFake]:
    with running(oai.OpenAIFake()) as fake:
        yield fake


@pytest.fixture(scope="module")
def model_app(openai_fake: oai.OpenAIFake, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsolatedStack]:
    env = {"OPENAI_BASE_URL": openai_fake.base_url, "OPENAI_API_KEY": oai.API_KEY, **TEST_MODEL_SETTINGS}
    with model_stack(tmp_path_factory.mktemp("poison-models"), env) as stack:
        yield stack


@pytest.mark.slow
def test_a_huge_model_reply_fails_the_run_once_instead_of_retrying(
    model_app: IsolatedStack, openai_fake: oai.OpenAIFake, run_id: str
) -> None:
    model = f"huge-{run_id}"
    openai_fake.script(model, oai.answer(model, "y" * (40 * 2**20)))
    model_app.ingress.start_run(run_id, {"goal": "say a lot", "requester": "a@example.com", "model": f"openai:{model}"})
    result = model_app.ingress.wait_output(run_id, timeout=120).json()
    assert result["status"] == "failed"
    assert "40.0 MiB; one turn may hold at most 1 MiB" in result["answer"]
    assert len(openai_fake.seen(model)) == 1, "refused as final: the provider is not asked again"
    assert unfinished(model_app.restate, run_id) == []


@pytest.mark.slow
def test_oversized_tool_arguments_from_a_model_go_back_to_it(
    model_app: IsolatedStack, openai_fake: oai.OpenAIFake, run_id: str
) -> None:
    model = f"bulky-{run_id}"
    huge = {"order_id": 1042, "note": "z" * (MAX_TOOL_ARGS_BYTES + 1)}
    openai_fake.script(model, oai.tool_calls(model, ("lookup_order", huge)), oai.answer(model, "Understood."))
    model_app.ingress.start_run(run_id, {"goal": "look", "requester": "a@example.com", "model": f"openai:{model}"})
    result = model_app.ingress.wait_output(run_id, timeout=120).json()
    assert result["status"] == "completed" and result["answer"] == "Understood."
    [action] = result["actions"]
    assert action["outcome"] == "invalid" and action["proposed_args"] == {}
    assert f"at most {MAX_TOOL_ARGS_BYTES} are accepted" in action["result"]["error"]
    told = oai.tool_messages(openai_fake.seen(model)[1].body)
    assert f"at most {MAX_TOOL_ARGS_BYTES} are accepted" in told[0]["content"]
    assert unfinished(model_app.restate, run_id) == []


@pytest.mark.slow
def test_a_models_long_why_is_cut_to_the_contracts_bound_as_a_library_callers_is(
    model_app: IsolatedStack, openai_fake: oai.OpenAIFake, run_id: str
) -> None:
    """The model's words before a gated call become the approval's `why`: cut to MAX_WHY and marked,
    so a model that writes 100 KB is not stored, emailed and audited whole."""
    model = f"wordy-{run_id}"
    call = {"order_id": new_order(model_app.db_path, 90000), "amount_usd": "700.00", "reason": "damaged"}
    openai_fake.script(model, oai.tool_calls(model, ("issue_refund", call), text="because " * 12_500))
    model_app.ingress.start_run(run_id, {"goal": "refund", "requester": "a@example.com", "model": f"openai:{model}"})
    [mail] = wait_for_email(model_app.outbox_dir, run_id)

    def saved() -> list[dict[str, Any]] | None:  # the email may come before the workflow saves the record
        approvals = model_app.ingress.call("Approval", f"{run_id}-a0", "status", None).json()["approvals"]
        return list(approvals) or None  # wait_until waits only while it gets None (or False)

    [record] = wait_until(saved, 20, "the approval's record")
    assert len(record["why"]) == MAX_WHY and record["why"].endswith("because…"), len(record["why"])
    assert "because " * 10 in mail.text and "because " * 300 not in mail.text
    model_app.ingress.call("AgentRun", run_id, "cancel", {"reason": "done"})
    assert model_app.ingress.wait_output(run_id, timeout=60).json()["status"] == "cancelled"

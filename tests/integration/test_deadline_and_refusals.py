"""Deadlines, malformed tasks, tampered links and forged decisions: clear 4xx, nothing decided."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support.approver import form_csrf, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress, RestateServer, StackFactory, wait_until


def refund(order: int, amount: str = "900.00") -> dict[str, object]:
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "r"}}],
    }


@pytest.mark.slow
def test_deadline_passes_and_the_action_expires(isolated_stack: StackFactory, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        "[tools.issue_refund]\ndeadline_seconds = 2\nreminders_seconds = []\nescalate_to = []\n"
        'approvers = ["night-shift@example.com"]\n'
    )
    stack = isolated_stack(app_env={"APPROVALS_POLICY_FILE": str(policy)})
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run("deadline", refund(order))
    [mail] = wait_for_email(stack.outbox_dir, "deadline")
    assert mail.message["To"] == "night-shift@example.com"
    csrf = form_csrf(mail.link)

    result = stack.ingress.wait_output("deadline", timeout=30).json()
    action = result["actions"][0]
    assert action["outcome"] == "expired"
    assert action["approved_by"] == [] and action["args"] is None
    assert "deadline passed" in action["reason"]
    late = submit(mail.link, "approve", csrf=csrf)
    assert late.status_code == 409 and "expired" in late.text
    assert refunds_for(stack.db_path, "deadline") == []


def test_malformed_task_is_a_400_with_the_message_and_not_stuck(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, run_id: str
) -> None:
    reply = ingress.call("AgentRun", run_id, "run", {"goal": "x", "requester": "not-an-email", "colour": "red"})
    assert reply.status_code == 400
    message = reply.json()["message"]
    assert "requester" in message and "colour" in message and "Extra inputs are not permitted" in message
    rows = restate_server.invocation_statuses(key=run_id)
    assert [r["status"] for r in rows if r["target_handler_name"] == "run"] == ["completed"]

    empty = ingress.call("AgentRun", f"{run_id}-e", "run", None)
    assert empty.status_code == 400
    unknown_model = ingress.call(
        "AgentRun", f"{run_id}-m", "run", {"goal": "x", "requester": "a@example.com", "model": "gpt-nope"}
    )
    assert unknown_model.status_code == 400 and "gpt-nope" in unknown_model.json()["message"]
    bad_key = ingress.call("AgentRun", "has space", "run", {"goal": "x", "requester": "a@example.com"})
    assert bad_key.status_code == 400 and "run id" in bad_key.json()["message"]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),
        lambda t: t.replace("v1.", "v2.", 1),
        lambda t: t.replace(".k1.", ".k9.", 1),
        lambda t: t + "x",
        lambda t: "garbage",
        lambda t: t.split(".")[0] + "." + t.split(".")[1] + ".%%%." + t.split(".")[3],
    ],
    ids=["tag", "version", "kid", "extra-char", "garbage", "bad-base64"],
)
def test_tampered_links_are_refused_and_decide_nothing(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str, mutate: object
) -> None:
    ingress.start_run(run_id, refund(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    csrf = form_csrf(mail.link)
    base, token = mail.link.rsplit("/", 1)
    bad = f"{base}/{mutate(token)}"  # type: ignore[operator]
    page = httpx.get(bad, timeout=30)
    assert page.status_code in (400, 403, 404)
    assert "Traceback" not in page.text and token not in page.text
    post = httpx.post(bad, data={"csrf": csrf, "verdict": "approve"}, headers={"Origin": app_server.url}, timeout=30)
    assert post.status_code in (400, 403, 404)
    assert ingress.status(run_id)["pending"], "nothing may be decided"
    ingress.call("AgentRun", run_id, "cancel", {"reason": "test cleanup"})


def test_post_needs_same_origin_and_the_links_csrf(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, refund(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    csrf = form_csrf(mail.link)
    assert submit(mail.link, "approve", csrf=csrf, origin="https://evil.example").status_code == 403
    assert submit(mail.link, "approve", csrf="forged" + csrf[6:]).status_code == 403
    no_origin = httpx.post(mail.link, data={"csrf": csrf, "verdict": "approve"}, timeout=30)
    assert no_origin.status_code == 403
    assert submit(mail.link, "maybe", csrf=csrf).status_code == 400
    assert ingress.status(run_id)["pending"]
    assert submit(mail.link, "approve", csrf=csrf).status_code == 200
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "approved"


def test_forged_direct_decide_is_refused_and_plants_nothing(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, refund(new_order(demo_db, 100000)))
    [mail] = wait_for_email(outbox_dir, run_id)
    token = mail.link.rsplit("/", 1)[1]
    parts = token.split(".")
    forged = ".".join([*parts[:3], "A" * 43])
    reply = ingress.call("AgentRun", run_id, "decide", {"token": forged, "verdict": "approve"})
    assert reply.status_code == 403
    early = ingress.call("AgentRun", f"{run_id}-not-started", "decide", {"token": token, "verdict": "approve"})
    assert early.status_code == 403
    planted = restate_server.sql(f"SELECT key FROM sys_promise WHERE service_key = '{run_id}-not-started'")
    assert planted == []
    assert ingress.status(run_id)["pending"]
    direct = ingress.call("AgentRun", run_id, "decide", {"token": token, "verdict": "reject"})
    assert direct.status_code == 400 and "reason is required" in direct.json()["message"]
    ok = ingress.call("AgentRun", run_id, "decide", {"token": token, "verdict": "reject", "reason": "via API"})
    assert ok.status_code == 200 and ok.json()["accepted"] is True
    assert ingress.wait_output(run_id).json()["actions"][0]["reason"] == "via API"


def test_status_of_an_unknown_run(app_server: AppServer, ingress: Ingress, run_id: str) -> None:
    assert ingress.status(run_id)["phase"] == "unknown"


def test_healthz_and_sigterm_stop(isolated_stack: StackFactory) -> None:
    stack = isolated_stack()
    assert httpx.get(f"{stack.app.url}/healthz", timeout=10).text == "ok"
    stack.ingress.start_run("sigterm", {"goal": "Look around", "requester": "a@example.com"})
    wait_until(lambda: stack.ingress.output("sigterm").status_code == 200, 20, "the run to finish")
    stack.app.stop()
    assert not stack.app.sigterm_ignored, "serve must exit on SIGTERM"

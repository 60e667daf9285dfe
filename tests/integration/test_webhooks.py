"""Signed outbound webhooks: every event reaches a receiver that was down, once, in order per
approval, verified with the Standard Webhooks library; the run never waits for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fakes.webhook_receiver import Delivery, WebhookReceiver, config, new_secret, running
from support.approver import form_csrf, submit, wait_for_email
from support.business import new_order, refunds_for
from support.operator import cli
from support.processes import REPO, IsolatedStack, StackFactory, free_port, make_app_env, user_services, wait_until

from countersign.events.delivery import WebhookEvent, _plan, event_id
from countersign.settings import Settings, parse_webhooks

APPROVAL_EVENTS = ["approval.requested", "approval.decided", "action.executed"]
T = TypeVar("T")
FAST_RETRIES = {
    "COUNTERSIGN_WEBHOOK_ATTEMPTS": "40",
    "COUNTERSIGN_WEBHOOK_BACKOFF_SECONDS": "0.2",
    "COUNTERSIGN_WEBHOOK_BACKOFF_MAX_SECONDS": "1",
}


def refund(order: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order} for $800.00",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "800.00", "reason": "late"}}],
    }


def outcomes(stack: IsolatedStack, run_id: str) -> list[dict[str, Any]]:
    response = stack.ingress.call("WebhookLog", run_id, "outcomes", None)
    response.raise_for_status()
    return list(response.json()["outcomes"])


def at_least(count: int, items: list[T]) -> list[T] | None:
    return items if len(items) >= count else None


def of_run(deliveries: list[Delivery], run_id: str) -> list[Delivery]:
    return [d for d in deliveries if d.data.get("run_id") == run_id]


def assert_once_in_order(receiver: WebhookReceiver, run_id: str) -> list[Delivery]:
    """All four events of a one-action run, once each after dedupe by webhook-id, the approval's in order."""
    events = wait_until(lambda: at_least(4, of_run(receiver.unique(), run_id)), 60, f"the four events of {run_id}")
    assert sorted(e.type for e in events) == sorted([*APPROVAL_EVENTS, "run.finished"])
    approval = [e.type for e in events if e.type != "run.finished"]
    assert approval == APPROVAL_EVENTS, "one approval's events arrive in the order they happened"
    assert receiver.rejected == [], "every delivery verifies with the receiver's secret"
    decided = next(e for e in events if e.type == "approval.decided")
    assert decided.data["verdict"] == "approved" and decided.data["decided_by"] == "finance@example.com"
    executed = next(e for e in events if e.type == "action.executed")
    assert executed.data["ok"] is True and executed.data["idempotency_key"] == f"{run_id}/0"
    assert next(e for e in events if e.type == "run.finished").data["status"] == "completed"
    return events


def approve(stack: IsolatedStack, run_id: str) -> None:
    [mail] = wait_for_email(stack.outbox_dir, run_id)
    assert submit(mail.link, "approve", csrf=form_csrf(mail.link)).status_code == 200


# ---------------------------------------------------------------------------------------------
# Settings and the event itself


def test_endpoints_setting_parses_json_and_toml_and_names_a_bad_value(tmp_path: Path) -> None:
    secret = new_secret()
    parsed = parse_webhooks(f'{{"acme": [{{"url": "https://hooks.example/x", "secret": "{secret}"}}]}}')
    [endpoint] = parsed["acme"]
    assert endpoint.events == (
        "approval.requested",
        "approval.decided",
        "action.executed",
        "run.finished",
        "grant.created",
        "grant.revoked",
    )
    toml = tmp_path / "hooks.toml"
    toml.write_text(f'[[acme]]\nurl = "https://a.example/h"\nsecret = "{secret}"\nevents = ["run.finished"]\n')
    assert parse_webhooks(str(toml))["acme"][0].events == ("run.finished",)
    everyone = parse_webhooks(f'{{"*": [{{"url": "https://all.example", "secret": "{secret}"}}]}}')
    settings = Settings(countersign_webhooks=everyone)
    assert [e.url for e in settings.webhook_endpoints("anyone")] == ["https://all.example"]
    good = {"url": "https://x.example", "secret": secret}
    bad = {
        json.dumps({"acme": [{**good, "url": "ftp://x"}]}): "url",
        json.dumps({"acme": [{**good, "secret": "nope"}]}): "whsec_",
        json.dumps({"acme": [{**good, "events": ["email.sent"]}]}): "events",
        json.dumps({"acme": [{**good, "colour": "red"}]}): "colour",
        json.dumps({"acme": [good, good]}): "same name or URL",
        json.dumps({"Not A Tenant": [good]}): "tenant",
        json.dumps({"acme": []}): "non-empty",
        json.dumps({"acme": [{"url": good["url"]}]}): "secret",
        "{not json": "JSON",
        str(tmp_path / "missing.toml"): "cannot read",
    }
    for raw, says in bad.items():
        with pytest.raises(ValueError, match=says):
            parse_webhooks(raw)


def test_event_body_and_id_are_stable_and_retries_are_bounded() -> None:
    event = WebhookEvent(
        id=event_id("acme", "approval.decided/r-a0"),
        type="approval.decided",
        tenant="acme",
        run_id="r",
        subject="r-a0",
        at=1.5,
        data={"b": 1, "a": [1, 2]},
    )
    assert event.id == event_id("acme", "approval.decided/r-a0") != event_id("other", "approval.decided/r-a0")
    assert event.body() == WebhookEvent.model_validate_json(event.model_dump_json()).body()
    plan = _plan(event.id)
    assert plan.attempts == 15 and len(plan.delays) == 14
    assert max(plan.delays) <= 14400 * 1.2
    assert 20 * 3600 < sum(plan.delays) < 30 * 3600, "the production default keeps trying for about a day"
    assert plan == _plan(event.id), "the same plan on every replay"


@pytest.mark.parametrize(
    "value",
    ['{"default": [{"url": "http://127.0.0.1:1/x", "secret": "whsec_short"}]}', "/nonexistent/hooks.toml"],
)
def test_a_bad_endpoint_setting_stops_the_process_at_start(tmp_path: Path, value: str) -> None:
    env = {
        **os.environ,
        **make_app_env(ingress_url="http://127.0.0.1:1", outbox_dir=tmp_path, db_path=tmp_path / "db"),
        "COUNTERSIGN_WEBHOOKS": value,
    }
    bind = f"127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "countersign", "serve", "--bind", bind],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("configuration error: COUNTERSIGN_WEBHOOKS:"), proc.stderr


# ---------------------------------------------------------------------------------------------
# Against the real restate-server and handlers


def test_a_down_receiver_delays_no_run_and_then_gets_every_event_once_in_order(isolated_stack: StackFactory) -> None:
    with running(start_up=False) as receiver, running() as other:
        stack = isolated_stack(
            app_env={
                **FAST_RETRIES,
                "COUNTERSIGN_WEBHOOKS": config("default", receiver, other),
            }
        )
        order = new_order(stack.db_path, 100000)
        stack.ingress.start_run("wh-down", refund(order))
        approve(stack, "wh-down")
        result = stack.ingress.wait_output("wh-down", timeout=60).json()
        # The run ended while the receiver was still down: its deliveries wait, the run does not.
        assert result["status"] == "completed"
        assert refunds_for(stack.db_path, "wh-down") == [("wh-down/0", order, 80000)]
        assert receiver.deliveries == []
        # The other endpoint, up all along, was not held back by the one that is down.
        assert_once_in_order(other, "wh-down")

        receiver.failing(3)
        receiver.up()
        events = assert_once_in_order(receiver, "wh-down")
        assert receiver.refused_503 == 3
        log = wait_until(lambda: at_least(8, outcomes(stack, "wh-down")), 30, "the delivery outcomes")
        mine = [o for o in log if o["endpoint"] == "r0"]
        assert {o["outcome"] for o in log} == {"delivered"}
        assert {o["webhook_id"] for o in mine} == {e.webhook_id for e in events}
        first_tries = {o["type"]: o["attempts"] for o in mine}
        # The first event of each subject was tried while the receiver was down; the approval's later
        # ones waited behind it (in order), so they may have needed only one attempt.
        assert first_tries["approval.requested"] > 1 and first_tries["run.finished"] > 1, first_tries
        # Nothing raced here: each event reached each receiver exactly once, not only once after dedupe.
        assert set(receiver.ids_seen().values()) == {1} and set(other.ids_seen().values()) == {1}
        # Where an operator sees it: `python -m countersign show`.
        shown = cli(stack.restate, "show", "wh-down", "--json")
        assert shown.returncode == 0, shown.stderr
        assert {(o["endpoint"], o["outcome"]) for o in json.loads(shown.stdout)["webhooks"]} == {
            ("r0", "delivered"),
            ("r1", "delivered"),
        }


def test_a_receiver_that_stays_down_is_given_up_after_bounded_attempts(private_stacks: StackFactory) -> None:
    with running() as receiver:
        receiver.failing(1000)
        stack = private_stacks(
            app_env={
                "COUNTERSIGN_WEBHOOK_ATTEMPTS": "3",
                "COUNTERSIGN_WEBHOOK_BACKOFF_SECONDS": "0.1",
                "COUNTERSIGN_WEBHOOKS": config("default", receiver, events=["approval.requested"]),
            }
        )
        stack.ingress.start_run("wh-gone", refund(new_order(stack.db_path, 100000)))
        [outcome] = wait_until(lambda: outcomes(stack, "wh-gone") or None, 30, "the delivery to be given up")
        assert outcome["outcome"] == "gave_up" and outcome["attempts"] == 3 and outcome["status"] == 503
        assert outcome["type"] == "approval.requested"
        assert receiver.refused_503 == 3, "three attempts, then it stopped"
        shown = stack.ingress.status("wh-gone")
        assert shown["phase"] == "awaiting_approval", "the run goes on waiting for its approver regardless"


def test_kill9_of_the_handler_during_a_delivery_still_delivers_each_event_once(private_stacks: StackFactory) -> None:
    with running() as receiver:
        stack = private_stacks(app_env={**FAST_RETRIES, "COUNTERSIGN_WEBHOOKS": config("default", receiver)})
        receiver.hold()
        order = new_order(stack.db_path, 100000)
        stack.ingress.start_run("wh-kill", refund(order))
        wait_until(receiver.held.is_set, 30, "the first delivery to be in flight")
        stack.app.kill9()
        receiver.release()
        stack.app.restart()
        approve(stack, "wh-kill")
        assert stack.ingress.wait_output("wh-kill", timeout=60).json()["status"] == "completed"
        events = assert_once_in_order(receiver, "wh-kill")
        counts = receiver.ids_seen()
        # The POST the kill interrupted was received, but its step never learned so and ran again: the
        # receiver saw that one id twice, which is exactly what deduplicating by webhook-id is for.
        assert counts[events[0].webhook_id] == 2 and events[0].type == "approval.requested", counts
        assert all(counts[e.webhook_id] == 1 for e in events[1:]), counts
        assert refunds_for(stack.db_path, "wh-kill") == [("wh-kill/0", order, 80000)]


def test_a_users_own_gated_call_emits_the_approval_events_and_one_stuck_approval_holds_back_no_other(
    private_stacks: StackFactory,
) -> None:
    with running() as receiver:
        receiver.refuse_runs.add("lib-stuck")
        stack = private_stacks(
            app_env={
                **FAST_RETRIES,
                **user_services("myshop.agents:served"),
                "COUNTERSIGN_WEBHOOKS": config("default", receiver),
            }
        )
        calls = {}
        for run_id, verdict in (("lib-stuck", "approve"), ("lib-no", "reject")):
            order = new_order(stack.db_path, 90000)
            args = {"order_id": order, "amount_usd": "800.00", "reason": "late"}
            ask = {"run_id": run_id, "tool": "issue_refund", "args": args}
            calls[run_id] = stack.ingress.send("RefundDesk", f"customer-{run_id}", "act", ask)
            [mail] = wait_for_email(stack.outbox_dir, run_id)
            assert submit(mail.link, verdict, reason="not this one").status_code == 200
            stack.ingress.wait_invocation(calls[run_id])
        # The endpoint is the same, the approvals are not: the one it refuses holds back only its own.
        rejected = wait_until(lambda: at_least(2, of_run(receiver.unique(), "lib-no")), 30, "lib-no's events")
        assert [e.type for e in rejected] == ["approval.requested", "approval.decided"]
        assert rejected[1].data["verdict"] == "rejected" and rejected[1].data["reason"] == "not this one"
        assert of_run(receiver.unique(), "lib-stuck") == []
        receiver.refuse_runs.clear()
        stuck = wait_until(lambda: at_least(3, of_run(receiver.unique(), "lib-stuck")), 60, "lib-stuck's events")
        assert [e.type for e in stuck] == APPROVAL_EVENTS
        assert stuck[2].data["ok"] is True and stuck[2].data["idempotency_key"] == "lib-stuck/0"

        # A call the policy lets run alone is an action too: executed, with no approval.
        order = new_order(stack.db_path, 5000)
        lookup = {"tool": "lookup_order", "args": {"order_id": order}}
        stack.ingress.start_run("lib-auto", {"goal": "look", "requester": "alice@example.com", "script": [lookup]})
        assert stack.ingress.wait_output("lib-auto").json()["status"] == "completed"
        alone = wait_until(lambda: at_least(2, of_run(receiver.unique(), "lib-auto")), 30, "lib-auto's events")
        assert sorted(e.type for e in alone) == ["action.executed", "run.finished"]
        executed = next(e for e in alone if e.type == "action.executed")
        assert executed.data["autonomous"] is True and executed.data["approval_id"] is None
        assert executed.data["tool"] == "lookup_order" and executed.data["ok"] is True
        assert receiver.rejected == []


def test_a_tenant_without_endpoints_sends_no_events(
    app_server: Any, ingress: Any, restate_server: Any, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    """The session's app has no COUNTERSIGN_WEBHOOKS: a gated run journals no event send while it waits
    (the policy's journaled answer said there was no endpoint), and none of its events is published."""
    order = new_order(demo_db, 100000)
    step = {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "700.00", "reason": "hooks"}}
    ingress.start_run(run_id, {"goal": "no webhooks", "requester": "alice@example.com", "script": [step]})
    [mail] = wait_for_email(outbox_dir, run_id)

    def journals() -> list[dict[str, Any]] | None:
        rows: list[dict[str, Any]] = restate_server.sql(
            "select i.target_service_name as service, j.entry_json from sys_journal j"
            " join sys_invocation i on i.id = j.id"
            f" where i.target_service_key in ('{run_id}', '{run_id}-a0')"
            " and i.target_service_name in ('AgentRun', 'Approval')"
        )
        # Both journals are there once the approval's workflow waits (the request was sent before it).
        return rows if {r["service"] for r in rows} == {"AgentRun", "Approval"} else None

    rows = wait_until(journals, 30, "the run's and the approval's journals")
    assert not [r for r in rows if "WebhookEvents" in r["entry_json"]]
    assert submit(mail.link, "approve").status_code == 200
    assert ingress.wait_output(run_id).json()["status"] == "completed"
    assert refunds_for(demo_db, run_id) != []
    published = restate_server.sql(
        "select count(*) as n from sys_invocation where target_service_name = 'WebhookEvents'"
        f" and target_service_key like '%{run_id}%'"
    )
    assert published == [{"n": 0}]

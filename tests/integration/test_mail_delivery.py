"""Email that arrives once: a real restate-server and app sending through the real `resend` SDK to the
fake Resend API, with provider failures, a final refusal, and a crash between send and journal."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.resend_server import Accepted, FakeResend, Fault, Received
from fakes.resend_stack import resend_env, resend_stack
from support.approver import LINK, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import IsolatedStack, RestateServer, StackFactory, wait_until

from countersign.mail.intent import tag_value
from countersign.security.codec import JournalCipher
from countersign.settings import parse_journal_keys


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeResend]:
    with FakeResend.running() as server:
        yield server


@pytest.fixture(scope="module")
def stack(fake: FakeResend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsolatedStack]:
    with resend_stack(tmp_path_factory.mktemp("resend-stack"), fake) as started:
        yield started


def refund(order: int, amount: str = "800.00") -> dict[str, Any]:
    return {
        "goal": f"Refund order {order} for ${amount}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "late"}}],
    }


def request_key(run_id: str) -> str:
    return f"approval-request/{run_id}-a0/r1/s0"


def wait_accepted(fake: FakeResend, key: str, timeout: float = 30) -> Accepted:
    def one() -> Accepted | None:
        found = fake.accepted_for(key)
        return found[0] if found else None

    return wait_until(one, timeout, f"Resend to accept {key}", interval=0.1)


def link_of(mail: Accepted) -> str:
    return str(LINK.findall(mail.params["text"])[0])


def journaled_completion(restate: RestateServer, run_id: str, step: str) -> dict[str, Any]:
    """How a `ctx.run` step ended, read back from restate-server's own journal table:
    `{"Success": <the journaled value>}` or `{"Failure": {"code": ..., "message": ...}}`. The
    invocation must still be running (a finished one keeps no journal); polled, since the step's
    result is journaled a moment after its effect is seen."""
    return wait_until(lambda: _completion(restate, run_id, step), 30, f"step {step!r} to have a journaled result")


def _completion(restate: RestateServer, run_id: str, step: str) -> dict[str, Any] | None:
    # The run sends the request email; the approval's own workflow (`<run>-a0`) sends the rest.
    for service, key in (("AgentRun", run_id), ("Approval", f"{run_id}-a0")):
        for run in [r for r in restate.invocation_statuses(service, key) if r["target_handler_name"] == "run"]:
            query = f"select index, name, entry_json from sys_journal where id = '{run['id']}' order by index"
            rows = restate.sql(query)
            commands = [json.loads(r["entry_json"])["Command"]["Run"] for r in rows if r.get("name") == step]
            if not commands:
                continue
            [command] = commands
            for row in rows:
                completion = json.loads(row["entry_json"]).get("Notification", {}).get("Completion", {}).get("Run")
                if completion and completion["completion_id"] == command["completion_id"]:
                    result = completion["result"]
                    if "Success" in result:
                        return {"Success": json.loads(opened(restate, bytes(result["Success"])))}
                    return dict(result)
    return None


def opened(restate: RestateServer, value: bytes) -> bytes:
    """A journaled value as the app wrote it: sealed when its journal is encrypted."""
    return JournalCipher(parse_journal_keys(restate.journal_keys)).open(value) if restate.journal_keys else value


def journaled_result(restate: RestateServer, run_id: str, step: str) -> dict[str, Any]:
    return dict(journaled_completion(restate, run_id, step)["Success"])


def test_the_approval_email_goes_through_resend_once_and_its_link_decides(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run(run_id, refund(order))
    mail = wait_accepted(fake, request_key(run_id))
    assert mail.to == ["finance@example.com"]
    assert mail.params["subject"] == f"Approval needed: Refund $800.00 to order {order}"
    assert mail.params["from"] == "Countersign <approvals@countersign.example>"
    assert mail.tags == {
        "approval_id": tag_value(f"{run_id}-a0"),
        "kind": "request",
        "round": "1",
        "run_id": tag_value(run_id),
        "slot": "0",
    }
    # Read while the approval waits: a finished workflow keeps its record but not its journal.
    receipt = journaled_result(stack.restate, run_id, "email request #0 round 1 slot 0")
    assert receipt == {
        "backend": "resend",
        "message_id": mail.id,
        "idempotency_key": request_key(run_id),
        "kind": "request",
    }
    assert submit(link_of(mail), "approve").status_code == 200
    result = stack.ingress.wait_output(run_id).json()
    assert result["actions"][0]["outcome"] == "approved"
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]
    assert len(fake.requests_for(request_key(run_id))) == 1


def test_a_429_storm_waits_for_retry_after_and_ends_in_one_email(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    fake.fail_next(*[Fault("rate_limit", retry_after="1")] * 3)
    stack.ingress.start_run(run_id, refund(new_order(stack.db_path, 100000)))
    mail = wait_accepted(fake, request_key(run_id))
    tries = fake.requests_for(request_key(run_id))
    assert [t.status for t in tries] == [429, 429, 429, 200]
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(tries)]
    assert all(gap >= 0.9 for gap in gaps), f"retry-after: 1 was not honoured: {gaps}"
    assert fake.accepted_for(request_key(run_id)) == [mail]
    assert submit(link_of(mail), "reject", "not now").status_code == 200
    assert stack.ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "rejected"


def test_while_its_request_email_is_retried_a_run_shows_its_approval_and_a_cancel_executes_nothing(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    """Until the request email is accepted the approval's own workflow has not started: the run still
    holds the frozen record, so `status` lists it, and a cancel then closes it ahead and stops the run
    (it is not left waiting for a person on an approval nobody can see)."""
    fake.fail_next(*[Fault("rate_limit", retry_after="2")] * 4)
    stack.ingress.start_run(run_id, refund(new_order(stack.db_path, 100000)))
    wait_until(lambda: fake.requests_for(request_key(run_id)), 30, "the first, refused, send", interval=0.05)
    pending = wait_until(lambda: stack.ingress.status(run_id)["pending"] or None, 6, "the run to list its approval")
    assert [p["approval_id"] for p in pending] == [f"{run_id}-a0"]
    receipt = stack.ingress.call("AgentRun", run_id, "cancel", {"reason": "provider down"}).json()
    assert not fake.accepted_for(request_key(run_id)), "all of it while the email was still being retried"
    assert receipt["accepted"] and receipt["cancelled_approvals"] == [f"{run_id}-a0"]
    done = stack.ingress.wait_output(run_id, 60).json()
    assert done["status"] == "cancelled", done
    assert [a["outcome"] for a in done["actions"]] == ["cancelled"]
    assert refunds_for(stack.db_path, run_id) == []
    assert len(fake.accepted_for(request_key(run_id))) == 1, "the email itself still went out once"


def test_a_slow_5xx_and_lost_connection_storm_ends_in_one_email(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    fake.fail_next(Fault("slow", seconds=4.0), Fault("drop", accept=True), Fault("server_error"))
    stack.ingress.start_run(run_id, refund(new_order(stack.db_path, 100000)))

    def answered() -> list[Received] | None:
        tries = fake.requests_for(request_key(run_id))
        return tries if tries and tries[-1].status == 200 else None

    tries = wait_until(answered, 60, "a successful send after the storm", interval=0.1)
    assert [t.status for t in tries[1:]] == [-1, 500, 200], "dropped (after accepting), 500, then the same id"
    assert tries[1].at - tries[0].at < 3.5, "the 2 s client timeout cut the 4 s answer short"
    [mail] = fake.accepted_for(request_key(run_id))
    wait_until(lambda: stack.ingress.status(run_id)["pending"], 30, "the approval to wait")
    assert submit(link_of(mail), "reject", "storm over").status_code == 200
    assert stack.ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "rejected"
    assert len(fake.accepted_for(request_key(run_id))) == 1


def test_the_deciding_receipt_and_the_outcome_go_in_one_step_after_the_refund_and_each_goes_once(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    """The approver's receipt and the requester's outcome notice are one step after the effect, each
    under its own key: when the outcome's send fails, the step's retry sends the receipt again under
    its key and the provider keeps the first; nothing is sent twice."""
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run(run_id, refund(order))
    mail = wait_accepted(fake, request_key(run_id))
    wait_until(lambda: stack.ingress.status(run_id)["pending"], 30, "the approval to wait")
    # The next two sends: the receipt goes through (a pass-through fault), the outcome gets a 500.
    fake.fail_next(Fault("slow", accept=True), Fault("server_error"))
    assert submit(link_of(mail), "approve").status_code == 200
    assert stack.ingress.wait_output(run_id, 60).json()["actions"][0]["outcome"] == "approved"
    receipt_key, outcome_key = f"approval-receipt/{run_id}-a0/r1/s0", f"approval-outcome/{run_id}-a0/r1/executed"
    assert [t.status for t in fake.requests_for(receipt_key)] == [200, 200], "sent again with the outcome's retry"
    assert [t.status for t in fake.requests_for(outcome_key)] == [500, 200]
    assert len(fake.accepted_for(receipt_key)) == len(fake.accepted_for(outcome_key)) == 1
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 80000)]


def test_a_receipt_refused_for_good_does_not_hold_back_the_outcome(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    stack.ingress.start_run(run_id, refund(new_order(stack.db_path, 100000)))
    mail = wait_accepted(fake, request_key(run_id))
    wait_until(lambda: stack.ingress.status(run_id)["pending"], 30, "the approval to wait")
    fake.fail_next(Fault("reject", status=422))  # the receipt, the first send after the decision
    assert submit(link_of(mail), "reject", "not this one").status_code == 200
    assert stack.ingress.wait_output(run_id, 60).json()["actions"][0]["outcome"] == "rejected"
    assert [t.status for t in fake.requests_for(f"approval-receipt/{run_id}-a0/r1/s0")] == [422]
    assert len(fake.accepted_for(f"approval-outcome/{run_id}-a0/r1/rejected")) == 1


def test_a_final_refusal_is_not_retried_escalates_and_ends_undeliverable(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    refused = Fault("reject", status=422, name="validation_error", message="Invalid `to` field.")
    fake.fail_next(refused, refused)
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run(run_id, refund(order))
    result = stack.ingress.wait_output(run_id, timeout=30).json()
    action = result["actions"][0]
    assert action["outcome"] == "undeliverable"
    assert "no approval email could be delivered" in action["reason"]
    escalation_key = f"approval-escalation/{run_id}-a0/r2/s1"
    assert [t.status for t in fake.requests_for(request_key(run_id))] == [422], "a refusal is never retried"
    assert [t.status for t in fake.requests_for(escalation_key)] == [422], "the demo policy escalates once"
    assert fake.accepted_for(request_key(run_id)) == fake.accepted_for(escalation_key) == []
    assert refunds_for(stack.db_path, run_id) == []


def test_a_final_refusal_is_journaled_as_a_terminal_failure_with_the_providers_reason(
    stack: IsolatedStack, fake: FakeResend, run_id: str
) -> None:
    """The refused step's journaled failure, read while the escalated approval waits (a finished
    workflow keeps no journal): the 422 and Resend's reason, not a retryable error."""
    fake.fail_next(Fault("reject", status=422, name="validation_error", message="Invalid `to` field."))
    stack.ingress.start_run(run_id, refund(new_order(stack.db_path, 100000)))
    escalation_key = f"approval-escalation/{run_id}-a0/r2/s1"
    wait_accepted(fake, escalation_key)
    wait_until(lambda: stack.ingress.status(run_id)["pending"], 30, "the escalated approval to wait")
    failure = journaled_completion(stack.restate, run_id, "email request #0 round 1 slot 0")["Failure"]
    assert failure["code"] == 422
    assert failure["message"] == "email not sent: Resend answered 422 validation_error: Invalid `to` field."
    assert [t.status for t in fake.requests_for(request_key(run_id))] == [422], "a refusal is never retried"
    stack.ingress.call("AgentRun", run_id, "cancel", {"reason": "test done"})


@pytest.mark.slow
def test_a_crash_after_resend_accepted_but_before_the_journal_sends_one_email(
    isolated_stack: StackFactory, tmp_path: Path
) -> None:
    with FakeResend.running() as fake:
        stack = isolated_stack(app_env={**resend_env(fake), "COUNTERSIGN_FAULT": "crash-after-send:request"})
        order = new_order(stack.db_path, 100000)
        stack.ingress.start_run("crash-mail", refund(order))
        first = wait_accepted(fake, request_key("crash-mail"))
        wait_until(lambda: not stack.app.alive(), 30, "the fault to kill the handler")
        assert len(fake.accepted) == 1

        stack.app.env.pop("COUNTERSIGN_FAULT")
        stack.app.restart()
        wait_until(lambda: len(fake.requests_for(request_key("crash-mail"))) >= 2, 60, "the step to run again")
        wait_until(lambda: stack.ingress.status("crash-mail")["pending"], 30, "the approval to wait")
        assert [t.status for t in fake.requests_for(request_key("crash-mail"))] == [200, 200]
        assert fake.accepted == [first], "Resend deduplicated the retry: exactly one email"

        receipt = journaled_result(stack.restate, "crash-mail", "email request #0 round 1 slot 0")
        assert receipt["message_id"] == first.id
        assert submit(link_of(first), "approve").status_code == 200
        assert stack.ingress.wait_output("crash-mail", timeout=60).json()["actions"][0]["outcome"] == "approved"
        assert refunds_for(stack.db_path, "crash-mail") == [("crash-mail/0", order, 80000)]


def test_in_production_no_approval_link_or_token_reaches_the_handlers_log(private_stacks: StackFactory) -> None:
    """The outbox backend in production mode (identity and journal keys set, as the stack does):
    the log says an email was written, never its links; the pages log no token either."""
    stack = private_stacks(app_env={"COUNTERSIGN_ENV": "production"})
    order = new_order(stack.db_path, 100000)
    stack.ingress.start_run("prod-log", refund(order))
    [mail] = wait_for_email(stack.outbox_dir, "prod-log")
    tokens = [
        url.rsplit("/", 1)[1].split("?")[0] for url in re.findall(r"https?://\S+/(?:approvals|inbox)/\S+", mail.text)
    ]
    assert len(set(tokens)) == 2, "an approval token and an inbox token"

    def logged() -> str | None:
        text = stack.app.log_path.read_text(errors="replace")
        return text if f"outbox file {mail.path.name}" in text else None

    log = wait_until(logged, 30, "the outbox write to be logged")
    assert "request email for finance@example.com: outbox file" in log
    assert submit(mail.link, "approve").status_code == 200
    assert stack.ingress.wait_output("prod-log", timeout=60).json()["actions"][0]["outcome"] == "approved"
    log = stack.app.log_path.read_text(errors="replace")
    assert [token for token in tokens if token in log] == []
    assert "/approvals/" not in log and "/inbox/" not in log and "approval link" not in log

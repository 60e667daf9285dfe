"""Journals without plaintext personal data, checked in Restate's own SQL introspection.

After a run with an approval, everything Restate holds about it (journal entries with their raw
bytes, state, promises, invocation records) is searched for marked values: the requester's email,
the goal, the refund reason, the approver's reason. With the journal cipher they appear nowhere in
plaintext, yet opening the sealed state with the app's key finds them (so the search is looking at
the right bytes); without the cipher the same search finds them (so it can fail).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
from support.approver import submit, wait_for_email
from support.business import new_order
from support.journal import everything_restate_holds
from support.processes import AppServer, Ingress, RestateServer, StackFactory, wait_until

from countersign.objects.inbox import booked_key
from countersign.objects.shards import books_key
from countersign.security.codec import ENVELOPE, ENVELOPE_V2, JournalCipher
from countersign.settings import parse_journal_keys


def markers() -> dict[str, str]:
    tag = secrets.token_hex(4)
    return {
        "requester": f"pii-{tag}@example.com",
        "goal": f"GOAL-{tag}",
        "refund reason": f"REASON-{tag}",
        "approver reason": f"APPROVER-SAYS-{tag}",
    }


def run_with_an_approval(ingress: Ingress, outbox: Path, db: Path, run_id: str, marked: dict[str, str]) -> None:
    task = {
        "goal": f"Refund the damaged order ({marked['goal']})",
        "requester": marked["requester"],
        "script": [
            {
                "tool": "issue_refund",
                "args": {"order_id": new_order(db, 100000), "amount_usd": "700.00", "reason": marked["refund reason"]},
            }
        ],
    }
    assert ingress.start_run(run_id, task).status_code == 202
    [mail] = wait_for_email(outbox, run_id)
    assert submit(mail.link, "approve", marked["approver reason"]).status_code == 200
    assert ingress.wait_output(run_id).json()["status"] == "completed"


def test_the_journal_holds_no_plaintext_of_marked_values(
    app_server: AppServer,
    app_env: dict[str, str],
    ingress: Ingress,
    restate_server: RestateServer,
    outbox_dir: Path,
    demo_db: Path,
    run_id: str,
) -> None:
    marked = markers()
    run_with_an_approval(ingress, outbox_dir, demo_db, run_id, marked)
    approval = f"{run_id}-a0"  # the approval's own workflow holds its record, promises and emails
    held = everything_restate_holds(restate_server, run_id) + everything_restate_holds(restate_server, approval)
    for what, value in marked.items():
        assert value not in held, f"the {what} is stored in plaintext"
    # A finished run keeps no journal (countersign.retention): its record is its state and promises.
    ids = f"select id from sys_invocation where target_service_key in ('{run_id}', '{approval}')"
    wait_until(
        lambda: not restate_server.sql(f"select id from sys_journal where id in ({ids})"), 20, "the journals to go"
    )
    approver = "finance@example.com"
    values = restate_server.sql(
        f"select value_utf8 as v from state where service_key in ('{run_id}', '{approval}') union all "
        f"select completion_success_value_utf8 as v from sys_promise where service_key in ('{run_id}', '{approval}')"
    )
    assert values and all(approver not in (row.get("v") or "") for row in values)

    cipher = JournalCipher(parse_journal_keys(app_env["COUNTERSIGN_JOURNAL_KEYS"]))
    states = restate_server.sql(f"select value_utf8 from state where service_key = '{run_id}'")
    assert {"run", f"approval:{run_id}-a0", "action:0"} <= {
        row["key"] for row in restate_server.sql(f"select key from state where service_key = '{run_id}'")
    }
    assert states and all(row["value_utf8"].encode().startswith(ENVELOPE) for row in states)
    # The approval record (over a kilobyte of JSON) is stored compressed before it is sealed.
    assert any(row["value_utf8"].encode().startswith(ENVELOPE_V2) for row in states)
    opened = " ".join(cipher.open(row["value_utf8"].encode()).decode() for row in states)
    assert all(value in opened for value in marked.values()), "the sealed state does hold them"
    [promise] = restate_server.sql(
        f"select completion_success_value_utf8 as v from sys_promise where service_key = '{approval}'"
        " and key like 'decision:%'"
    )
    assert marked["approver reason"] in cipher.open(promise["v"].encode()).decode()


def test_a_waiting_approval_names_its_approver_nowhere_restate_keeps_in_the_clear(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    """Keys are not sealed like values. The approval's bookkeeping shard is picked by the approval id
    and its inbox entry is kept under the approver's address hashed, so while the approval waits the
    address is in no journal entry and no key of what the approval wrote."""
    marked = markers()
    task = {
        "goal": f"Refund ({marked['goal']})",
        "requester": marked["requester"],
        "script": [
            {
                "tool": "issue_refund",
                "args": {"order_id": new_order(demo_db, 100000), "amount_usd": "700.00", "reason": "r"},
            }
        ],
    }
    assert ingress.start_run(run_id, task).status_code == 202
    wait_for_email(outbox_dir, run_id)
    approver, approval = "finance@example.com", f"{run_id}-a0"
    shard = books_key(approval)
    index = booked_key(approver)
    # The inbox entry is there, under the hashed address, in the approval's shard.
    wait_until(
        lambda: restate_server.sql(
            f"select key from state where service_name = 'Bookkeeping' and service_key = '{shard}'"
            f" and key = '{index}:{approval}'"
        ),
        20,
        "the approval's inbox entry in its bookkeeping shard",
    )
    ids = f"select id from sys_invocation where target_service_key in ('{run_id}', '{approval}', '{shard}')"
    entries = restate_server.sql(f"select entry_type, entry_json, raw from sys_journal where id in ({ids})")
    sends = [e for e in entries if e["entry_type"] == "Command: OneWayCall" and "Bookkeeping" in e["entry_json"]]
    assert sends, "the run tells the approval's bookkeeping shard"
    for entry in entries:
        raw = bytes.fromhex(entry["raw"] or "").decode("utf-8", errors="replace")
        assert approver not in raw and approver not in entry["entry_json"], entry["entry_type"]
    # (The approver's own `ApprovalInbox` key, read by the inbox page and moved by `inbox revoke`, is
    # the address: a reader asks for it by name. Nothing the approval writes is kept there.)
    keys = restate_server.sql("select service_key, key from state where service_name = 'Bookkeeping'")
    assert keys and not [row for row in keys if approver in json.dumps(row)], "no bookkeeping key names the approver"
    held = everything_restate_holds(restate_server, run_id) + everything_restate_holds(restate_server, approval)
    assert all(value not in held for value in marked.values())
    ingress.call("AgentRun", run_id, "cancel", {"reason": "cleanup"})


def test_error_text_is_scrubbed_before_restate_stores_it(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, run_id: str
) -> None:
    """Failures bypass the cipher: an input that does not parse must not leave its content behind."""
    email = f"pii-{secrets.token_hex(4)}@example.com"
    # With an idempotency key (as the pages send one), Restate keeps the failed call's answer. The
    # refusal names the fields that are wrong, never their values; a field's name is echoed.
    reply = ingress.call(
        "AgentRun",
        run_id,
        "decide",
        {"token": "v1.k1.AAAAAAAAAA.AAAA", "verdict": "approve", email: email},
        headers={"idempotency-key": f"scrub-{run_id}"},
    )
    assert reply.status_code == 400
    assert "[email]" in reply.json()["message"] and email not in reply.text
    wait_until(lambda: restate_server.invocation_statuses(key=run_id), 10, "the decide invocation to be listed")
    assert email not in everything_restate_holds(restate_server, run_id)


def test_a_failing_step_is_stored_scrubbed(isolated_stack: StackFactory) -> None:
    stack = isolated_stack(app_env={"COUNTERSIGN_FAULT": "fail-in-effect:issue_refund"})
    email = f"pii-{secrets.token_hex(4)}@example.com"
    order = new_order(stack.db_path, 100000)
    small = {"order_id": order, "amount_usd": "20.00", "reason": f"asked by {email}"}
    # Then a gated refund, so the run waits with the failed step in its journal (a finished run keeps none).
    gated = {"order_id": order, "amount_usd": "700.00", "reason": "then more"}
    task = {
        "goal": "Refund a small order",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": small}, {"tool": "issue_refund", "args": gated}],
    }
    stack.ingress.start_run("failing-step", task)
    wait_for_email(stack.outbox_dir, "failing-step")
    held = everything_restate_holds(stack.restate, "failing-step")
    assert 'RuntimeError("issue_refund failed for' in held, "the step's failure is in the journal, readable"
    assert email not in held
    stack.ingress.call("AgentRun", "failing-step", "cancel", {"reason": "done"})
    result = stack.ingress.wait_output("failing-step", timeout=60).json()
    action = result["actions"][0]
    assert action["outcome"] == "failed" and "[email]" in action["result"]["error"]
    assert email not in everything_restate_holds(stack.restate, "failing-step")


def test_without_journal_keys_the_same_search_finds_the_plaintext(isolated_stack: StackFactory) -> None:
    stack = isolated_stack(app_env={"COUNTERSIGN_JOURNAL_KEYS": ""})
    assert stack.ingress.codec is None
    marked = markers()
    run_with_an_approval(stack.ingress, stack.outbox_dir, stack.db_path, "plain", marked)
    held = everything_restate_holds(stack.restate, "plain")
    assert all(value in held for value in marked.values())


def test_a_plaintext_request_still_runs_with_the_cipher_on(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, run_id: str
) -> None:
    """What `curl` sends (plain JSON) is accepted; the answer comes back sealed, and opens."""
    body = {"goal": "Look around", "requester": "curl@example.com"}
    sent = httpx.post(f"{restate_server.ingress_url}/AgentRun/{run_id}/run", json=body, timeout=60)
    assert sent.status_code == 200 and sent.content.startswith(ENVELOPE)
    assert ingress.wait_output(run_id).json()["status"] == "completed"

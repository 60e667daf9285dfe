"""`AgentRun.decide` as its own line of defence: called straight through the Restate ingress (as
anyone who reaches it could), it refuses forged, foreign, early and unconfirmed decisions, and
completes no promise when it refuses (checked in Restate's own `sys_promise`)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
from support.approver import open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import AppServer, Ingress, RestateServer, wait_until

from countersign.approval import confirm
from countersign.contract import ApprovalRecord
from countersign.security import links
from countersign.settings import Settings


def refund(order: int, amount: str, *, tenant: str = "default", **extra: Any) -> dict[str, Any]:
    step = {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "damaged"}, **extra}
    return {"goal": "security test", "requester": "alice@example.com", "tenant": tenant, "script": [step]}


def promises(restate: RestateServer, key: str) -> list[dict[str, Any]]:
    """The promises of the run's approvals (each approval is its own workflow, key `<run>-a<n>`)."""
    return restate.sql(
        f"select key, completed from sys_promise where service_name = 'Approval' and service_key like '{key}-a%'"
    )


def decided(restate: RestateServer, key: str) -> list[str]:
    return [p["key"] for p in promises(restate, key) if p["completed"] and p["key"].startswith("decision:")]


def token_of(link: str) -> str:
    return link.rsplit("/", 1)[1]


def rebody(token: str, **fields: object) -> str:
    version, kid, body, tag = token.split(".")
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode().split("~")
    values = dict(zip(("run", "index", "slot", "round", "exp"), raw, strict=True)) | {
        k: str(v) for k, v in fields.items()
    }
    new_body = "~".join(values[k] for k in ("run", "index", "slot", "round", "exp")).encode()
    return ".".join([version, kid, base64.urlsafe_b64encode(new_body).rstrip(b"=").decode(), tag])


def signing_keys(app_env: dict[str, str]) -> dict[str, bytes]:
    return Settings(approvals_signing_keys=app_env["APPROVALS_SIGNING_KEYS"]).approvals_signing_keys  # type: ignore[arg-type]


def test_forged_and_foreign_tokens_are_refused_directly(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    other_run = f"{run_id}-other"
    ingress.start_run(run_id, refund(new_order(demo_db, 100000), "700.00"))
    ingress.start_run(other_run, refund(new_order(demo_db, 100000), "700.00"))
    [mail] = wait_for_email(outbox_dir, run_id)
    [other] = wait_for_email(outbox_dir, other_run)
    token, foreign = token_of(mail.link), token_of(other.link)
    version, kid, body, _ = token.split(".")
    attempts = {
        "random tag": ".".join([version, kid, body, base64.urlsafe_b64encode(b"\x01" * 32).rstrip(b"=").decode()]),
        "another run's token": foreign,
        "another run's token, renamed": rebody(foreign, run=run_id),
        "another approval index": rebody(token, index=1),
        "another slot": rebody(token, slot=1),
        "a later round": rebody(token, round=2),
        "a later expiry": rebody(token, exp=9999999999),
        "an unknown key id": token.replace(f".{kid}.", ".k9.", 1),
    }
    for what, forged in attempts.items():
        reply = ingress.call("AgentRun", run_id, "decide", {"token": forged, "verdict": "approve"})
        assert reply.status_code in (400, 403), what
        assert forged not in reply.text and "Traceback" not in reply.text, what
    unknown_field = ingress.call("AgentRun", run_id, "decide", {"token": token, "verdict": "approve", "as": "root"})
    assert unknown_field.status_code == 400, "an input that does not parse is a 400, not the SDK's 500"
    assert token not in unknown_field.json()["message"]
    assert decided(restate_server, run_id) == [] and decided(restate_server, other_run) == []
    assert ingress.status(run_id)["pending"][0]["approvals"] == 0

    ok = ingress.call("AgentRun", run_id, "decide", {"token": token, "verdict": "reject", "reason": "direct, signed"})
    assert ok.status_code == 200 and ok.json()["accepted"] is True
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "rejected"
    ingress.call("AgentRun", other_run, "cancel", {"reason": "test cleanup"})


def test_pre_resolution_plants_nothing(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    donor = f"{run_id}-donor"
    first, second = new_order(demo_db, 100000), new_order(demo_db, 100000)
    ingress.start_run(donor, refund(first, "700.00"))
    [donor_mail] = wait_for_email(outbox_dir, donor)
    donor_token = token_of(donor_mail.link)

    # Before the run exists: a real token of another run, and one renamed to this run.
    for token in (donor_token, rebody(donor_token, run=run_id)):
        early = ingress.call("AgentRun", run_id, "decide", {"token": token, "verdict": "approve"})
        assert early.status_code == 403
    assert promises(restate_server, run_id) == []

    # The run starts and asks about its first action; its second approval does not exist yet.
    two_steps = refund(first, "600.00")
    two_steps["script"].append(refund(second, "650.00")["script"][0])
    ingress.start_run(run_id, two_steps)
    [mail] = wait_for_email(outbox_dir, run_id)
    for index in (1, 2):
        ahead = {"token": rebody(token_of(mail.link), index=index), "verdict": "approve"}
        assert ingress.call("AgentRun", run_id, "decide", ahead).status_code == 403
    assert decided(restate_server, run_id) == []

    assert submit(mail.link, "approve").status_code == 200
    [_, later] = wait_for_email(outbox_dir, run_id, count=2)
    wait_until(lambda: ingress.status(run_id)["pending"], 20, "the second approval to be asked")
    assert decided(restate_server, run_id) == [f"decision:{run_id}-a0:r1:s0"], "nothing was planted for the second"
    assert submit(later.link, "reject", "one is enough").status_code == 200
    result = ingress.wait_output(run_id).json()
    assert [a["outcome"] for a in result["actions"]] == ["approved", "rejected"]
    ingress.call("AgentRun", donor, "cancel", {"reason": "test cleanup"})


def test_another_tenants_token_is_refused(
    app_server: AppServer,
    app_env: dict[str, str],
    ingress: Ingress,
    restate_server: RestateServer,
    outbox_dir: Path,
    demo_db: Path,
    run_id: str,
) -> None:
    acme, globex = f"{run_id}-acme", f"{run_id}-globex"
    ingress.start_run(acme, refund(new_order(demo_db, 100000), "700.00", tenant="acme"))
    ingress.start_run(globex, refund(new_order(demo_db, 100000), "700.00", tenant="globex"))
    [acme_mail] = wait_for_email(outbox_dir, acme)
    [globex_mail] = wait_for_email(outbox_dir, globex)
    keys = signing_keys(app_env)
    record = ApprovalRecord.model_validate(ingress.status(globex)["approvals"][0])
    assert record.tenant == "globex"
    # Someone who can make links for acme (acme's subkey) tries them on globex's approval.
    as_acme = links.mint(record.model_copy(update={"tenant": "acme"}), 0, keys, "k1")
    as_globex = links.mint(record, 0, keys, "k1")
    assert as_globex == token_of(globex_mail.link), "the test mints exactly as the app does"
    renamed = rebody(token_of(acme_mail.link), run=globex)
    for token in (as_acme, renamed):
        assert httpx.get(f"{app_server.url}/approvals/{token}", timeout=30).status_code == 403
    for token in (as_acme, renamed, token_of(acme_mail.link)):
        direct = ingress.call("AgentRun", globex, "decide", {"token": token, "verdict": "reject", "reason": "x"})
        assert direct.status_code == 403
    assert decided(restate_server, globex) == []
    for key in (acme, globex):
        ingress.call("AgentRun", key, "cancel", {"reason": "test cleanup"})


def test_high_stakes_needs_the_typed_value_on_the_page_and_directly(
    app_server: AppServer, ingress: Ingress, restate_server: RestateServer, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    order = new_order(demo_db, 300000)
    ingress.start_run(run_id, refund(order, "1500.00"))
    [mail] = wait_for_email(outbox_dir, run_id)
    [pending] = ingress.status(run_id)["pending"]
    assert pending["tool"] == "issue_refund"
    record = ingress.status(run_id)["approvals"][0]
    assert record["confirm_field"] == "amount_usd"
    token = token_of(mail.link)
    for typed in ("", "150", "1500.01", "c_17", "1500.001"):
        direct = ingress.call("AgentRun", run_id, "decide", {"token": token, "verdict": "approve", "confirm": typed})
        assert direct.status_code == 400 and direct.json()["message"] == confirm.REFUSAL
    on_page = submit(mail.link, "approve", confirm="1,499.99")
    assert on_page.status_code == 400 and "type the value shown" in on_page.text
    # Lowering the amount: the typed value must be the amount that will run.
    csrf_page = open_page(mail.link)
    assert csrf_page.status_code == 200
    origin = {"Origin": app_server.url}
    csrf = csrf_page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    form = {"csrf": csrf, "verdict": "approve", "edit.amount_usd": "1200"}
    assert httpx.post(mail.link, data={**form, "confirm": "1500.00"}, headers=origin, timeout=30).status_code == 400
    assert decided(restate_server, run_id) == []
    edited = httpx.post(mail.link, data={**form, "confirm": "1200.00"}, headers=origin, timeout=30)
    assert edited.status_code == 200, edited.text
    action = ingress.wait_output(run_id).json()["actions"][0]
    assert action["outcome"] == "approved_with_edits" and action["args"]["amount_usd"] == "1200.00"
    assert refunds_for(demo_db, run_id) == [(f"{run_id}/0", order, 120000)]


def test_refunds_up_to_the_threshold_need_no_typing(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    ingress.start_run(run_id, refund(new_order(demo_db, 300000), "1000.00"))
    [mail] = wait_for_email(outbox_dir, run_id)
    assert 'name="confirm"' not in open_page(mail.link).text
    assert submit(mail.link, "approve").status_code == 200
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "approved"


def test_rejecting_a_high_stakes_action_needs_no_typing(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    delete = {"tool": "delete_customer", "args": {"customer_id": "c_77", "reason": "duplicate"}}
    ingress.start_run(run_id, {"goal": "x", "requester": "alice@example.com", "script": [delete]})
    ops, _security = sorted(wait_for_email(outbox_dir, run_id, count=2), key=lambda m: m.message["To"])
    assert "<code>c_77</code>" in open_page(ops.link).text
    assert submit(ops.link, "approve", confirm="c_7").status_code == 400
    assert submit(ops.link, "reject", "keep it").status_code == 200
    assert ingress.wait_output(run_id).json()["actions"][0]["outcome"] == "rejected"


def test_batch_page_asks_to_type_per_high_stakes_item(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> None:
    big, small = new_order(demo_db, 300000), new_order(demo_db, 300000)
    turn = refund(big, "2000.00")["script"][0] | {"also": [refund(small, "600.00")["script"][0]]}
    ingress.start_run(run_id, {"goal": "x", "requester": "alice@example.com", "script": [turn]})
    [mail] = wait_for_email(outbox_dir, run_id, kind="batch")
    page = open_page(mail.link)
    assert page.text.count('name="confirm.') == 1 and 'name="confirm.0"' in page.text
    csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    origin = {"Origin": app_server.url}
    both = {"csrf": csrf, "verdict.0": "approve", "verdict.1": "approve"}
    untyped = httpx.post(mail.link, data=both, headers=origin, timeout=30)
    assert untyped.status_code == 200 and "type the value shown" in untyped.text, "the small one went through"
    typed = httpx.post(mail.link, data={**both, "confirm.0": "2000"}, headers=origin, timeout=30)
    assert typed.status_code == 200
    result = ingress.wait_output(run_id).json()
    assert [a["outcome"] for a in result["actions"]] == ["approved", "approved"]
    assert len(refunds_for(demo_db, run_id)) == 2

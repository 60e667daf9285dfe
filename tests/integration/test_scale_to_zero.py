"""Scale to zero: 200 runs wait for approval with no handler process at all, then each acts exactly once."""

from __future__ import annotations

import concurrent.futures
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from support.approver import CSRF, ApprovalEmail, approval_emails
from support.business import new_order
from support.processes import Ingress, IsolatedStack, RestateServer, StackFactory, port_is_free, wait_until

RUNS = 200
WORKERS = 16
T = TypeVar("T")


def refund(order: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "510.00", "reason": "late"}}],
    }


def in_parallel(fn: Callable[[Ingress, str], T], run_ids: Iterable[str], stack: IsolatedStack) -> dict[str, T]:
    """`fn(client, run_id)` for every run on WORKERS threads; each thread keeps one client (a new httpx
    client costs ~40 ms of CPU for its TLS context, which would dominate this test)."""
    local = threading.local()
    clients: list[Ingress] = []

    def init() -> None:
        local.client = Ingress(stack.restate.ingress_url, stack.env["COUNTERSIGN_JOURNAL_KEYS"])
        clients.append(local.client)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS, initializer=init) as pool:
            futures = {run_id: pool.submit(lambda r: fn(local.client, r), run_id) for run_id in run_ids}
            return {run_id: future.result(timeout=180) for run_id, future in futures.items()}
    finally:
        for client in clients:
            client.close()


def approve(ingress: Ingress, link: str) -> int:
    """What a person does: open the page, press Approve (the form's CSRF value, same-origin POST)."""
    client = ingress.client  # a plain HTTP client: the link is absolute
    page = client.get(link)
    match = CSRF.search(page.text)
    assert match, f"no form on the page (status {page.status_code})"
    origin = "/".join(link.split("/", 3)[:3])
    reply = client.post(link, data={"csrf": match.group(1), "verdict": "approve"}, headers={"Origin": origin})
    return reply.status_code


def run_statuses(restate: RestateServer, prefix: str, service: str = "AgentRun") -> Counter[str]:
    rows = restate.sql(
        f"select status, count(*) as n from sys_invocation where target_service_name = '{service}'"
        f" and target_handler_name = 'run' and target_service_key like '{prefix}%' group by status"
    )
    return Counter({row["status"]: int(row["n"]) for row in rows})


def all_in(restate: RestateServer, prefix: str, status: str) -> bool:
    """Every run, and every run's approval (its own workflow, which sends the email), in `status`."""
    return all(
        run_statuses(restate, prefix, service) == Counter({status: RUNS}) for service in ("AgentRun", "Approval")
    )


def refunds_by_key(db: Path, prefix: str) -> dict[str, tuple[int, int, int]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, count(*), min(order_id), sum(amount_cents) FROM refunds"
            " WHERE idempotency_key LIKE ? GROUP BY idempotency_key",
            (f"{prefix}%",),
        ).fetchall()
    return {key: (count, order, cents) for key, count, order, cents in rows}


@pytest.mark.slow
def test_200_paused_runs_need_no_handler_and_each_refund_happens_once(private_stacks: StackFactory) -> None:
    """Registered request/response, as a platform that scales to zero invokes it. (Only this mode: the
    test is the suite's most expensive, and the kill -9 tests already pause runs over HTTP/2.)"""
    stack = private_stacks(http1=True)
    restate, app = stack.restate, stack.app
    prefix = "zero-"
    orders = {f"{prefix}{i:03d}": new_order(stack.db_path, 100000) for i in range(RUNS)}

    def start(ingress: Ingress, run_id: str) -> int:
        return ingress.start_run(run_id, refund(orders[run_id])).status_code

    assert set(in_parallel(start, orders, stack).values()) == {202}
    wait_until(lambda: all_in(restate, prefix, "suspended"), 180, f"all {RUNS} runs to suspend", interval=0.5)
    mails: dict[str, ApprovalEmail] = {}
    for run_id in orders:
        [mails[run_id]] = approval_emails(stack.outbox_dir, run_id)

    app.stop()
    assert not app.alive() and port_is_free(app.port) and port_is_free(app.restate_port) and not app.sigterm_ignored
    for service in ("AgentRun", "Approval"):
        assert run_statuses(restate, prefix, service) == Counter({"suspended": RUNS}), f"no {service} retries"

    app.restart()
    replies = in_parallel(lambda ingress, run_id: approve(ingress, mails[run_id].link), orders, stack)
    assert Counter(replies.values()) == Counter({200: RUNS})
    wait_until(lambda: all_in(restate, prefix, "completed"), 180, f"all {RUNS} runs to complete", interval=0.5)

    outputs = in_parallel(lambda ingress, run_id: ingress.output(run_id), orders, stack)
    assert {r.status_code for r in outputs.values()} == {200}
    assert {r.json()["actions"][0]["outcome"] for r in outputs.values()} == {"approved"}
    assert refunds_by_key(stack.db_path, prefix) == {f"{run_id}/0": (1, orders[run_id], 51000) for run_id in orders}
    assert len(list(stack.outbox_dir.glob(f"approval-request_{prefix}*.eml"))) == RUNS

"""A three-node Restate cluster (cluster/cluster.sh): a node dies while approvals wait, nothing is lost."""

from __future__ import annotations

import concurrent.futures
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.approver import CSRF, ApprovalEmail, open_page, submit, wait_for_email
from support.business import new_order, refunds_for
from support.cluster import Cluster, free_port_base
from support.processes import AppServer, Ingress, free_port, make_app_env, wait_until

RUNS = 12


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(directory=tmp_path / "cluster", port_base=free_port_base())
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        assert cluster.running() == [], "every node is stopped"


def refund(order: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "820.00", "reason": "late"}}],
    }


def run_statuses(cluster: Cluster, node: int) -> Counter[str]:
    rows = cluster.wait_sql(
        node,
        "select status, count(*) as n from sys_invocation"
        " where target_service_name = 'AgentRun' and target_handler_name = 'run' group by status",
    )
    return Counter({row["status"]: int(row["n"]) for row in rows})


def waiting(statuses: Counter[str]) -> int:
    """Runs waiting on their approval: still attached to the handler (`running`) or `suspended`."""
    return statuses["running"] + statuses["suspended"] if set(statuses) <= {"running", "suspended"} else -1


def approve_until_decided(mail: ApprovalEmail) -> int:
    """A person opens the page and presses Approve, and tries again when the page says to (503: the
    page could not reach Restate in time while a leader moved). A press whose answer timed out may
    still be applied later; the next look then finds the approval decided (no form, or a 409)."""

    def attempt() -> int | None:
        try:
            page = open_page(mail.link)
            if page.status_code == 503:
                return None
            form = CSRF.search(page.text)
            if form is None:
                return page.status_code
            reply = submit(mail.link, "approve", csrf=form.group(1))
        except httpx.TimeoutException:
            return None
        return None if reply.status_code == 503 else reply.status_code

    return wait_until(attempt, 120, f"the approval of {mail.path.name} to be taken", interval=1.0)


@pytest.mark.slow
def test_a_node_dies_while_approvals_wait_and_every_run_completes_once(cluster: Cluster, tmp_path: Path) -> None:
    # The pages reach the cluster through n2 (in production: a load balancer over every node's ingress).
    port = free_port()
    env = {
        **make_app_env(ingress_url=cluster.ingress_url(2), outbox_dir=tmp_path / "outbox", db_path=tmp_path / "db"),
        "APPROVALS_PUBLIC_URL": f"http://127.0.0.1:{port}",
    }
    app = AppServer.start(env=env, port=port, log_path=tmp_path / "app.log")
    try:
        cluster.register(1, app.restate_uri)
        outbox, db = tmp_path / "outbox", tmp_path / "db"
        orders = {f"node-loss-{i:02d}": new_order(db, 100000) for i in range(RUNS)}
        keys = env["COUNTERSIGN_JOURNAL_KEYS"]
        with Ingress(cluster.ingress_url(1), keys) as n1:
            for run_id, order in orders.items():
                assert n1.start_run(run_id, refund(order)).status_code == 202
        mails = {run_id: wait_for_email(outbox, run_id, timeout=60)[0] for run_id in orders}
        wait_until(lambda: waiting(run_statuses(cluster, 2)) == RUNS, 60, "every run to wait for its approval")

        cluster.kill9(1)  # the node that provisioned the cluster and took the runs in
        with concurrent.futures.ThreadPoolExecutor(max_workers=RUNS) as pool:
            replies = list(pool.map(approve_until_decided, mails.values()))
        assert set(replies) <= {200, 409}

        with Ingress(cluster.ingress_url(3), keys) as n3:
            for run_id, order in orders.items():
                result = n3.attach(run_id, timeout=120)
                assert result.status_code == 200, result.text
                assert result.json()["actions"][0]["outcome"] == "approved"
                assert refunds_for(db, run_id) == [(f"{run_id}/0", order, 82000)]
        assert len(list(outbox.glob("approval-request_node-loss-*.eml"))) == RUNS
        assert run_statuses(cluster, 3) == Counter({"completed": RUNS})

        cluster.start(1)  # rejoins by itself, with everything that happened while it was down
        with Ingress(cluster.ingress_url(1), keys) as n1:
            for run_id in orders:
                output = n1.output(run_id)
                assert output.status_code == 200 and output.json()["status"] == "completed"
    finally:
        app.stop()

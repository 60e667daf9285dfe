"""Serverless deployment: the Lambda entry point, request/response registration, upgrades while paused."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from restate.server_types import RestateLambdaRequest
from support.approver import submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import (
    DEPLOYMENT_PROTOCOLS,
    REPO,
    AppServer,
    RestateServer,
    StackFactory,
    free_port,
    wait_until,
)
from support.serverless import (
    LambdaBridge,
    deployment_id,
    deployments,
    pinned_deployments,
)

from countersign.exceptions import SettingsError
from countersign.ops.cli import parser
from countersign.runtime.lambda_handler import create_handler
from countersign.security import identity
from countersign.settings import Settings

T = TypeVar("T")
MANIFEST_V3 = "application/vnd.restate.endpointmanifest.v3+json"


def refund(order: int, amount: str = "750.00") -> dict[str, Any]:
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": amount, "reason": "late"}}],
    }


def lambda_event(path: str, method: str = "GET", headers: dict[str, str] | None = None) -> RestateLambdaRequest:
    """An event exactly as restate-server's Lambda invoker shapes it (an API Gateway proxy request)."""
    return {"path": path, "httpMethod": method, "headers": headers or {}, "body": "", "isBase64Encoded": True}


def on_own_thread(fn: Callable[[], T]) -> T:
    # The SDK's adapter installs an event loop on the thread that creates it: keep it off pytest's.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result(timeout=60)


def test_lambda_handler_answers_discovery_and_health_in_process(tmp_path: Path) -> None:
    settings = Settings(
        countersign_env="test",
        approvals_signing_keys={"k1": b"s" * 40},
        approvals_outbox_dir=tmp_path / "outbox",
        demo_db=tmp_path / "business.db",
    )

    def discover() -> tuple[dict[str, Any], dict[str, Any]]:
        handler = create_handler(settings)
        discovery = handler(lambda_event("/discover", headers={"accept": MANIFEST_V3}), None)
        health = handler(lambda_event("/health"), None)
        return dict(discovery), dict(health)

    discovery, health = on_own_thread(discover)
    assert discovery["statusCode"] == 200 and discovery["isBase64Encoded"] is True
    assert discovery["headers"]["content-type"] == MANIFEST_V3
    manifest = json.loads(base64.b64decode(discovery["body"]))
    assert manifest["protocolMode"] == "REQUEST_RESPONSE"
    [service] = [s for s in manifest["services"] if s["name"] == "AgentRun"]
    assert service["ty"] == "WORKFLOW"
    assert {"run", "status", "decide", "cancel"} <= {h["name"] for h in service["handlers"]}
    assert health["statusCode"] == 200


def test_lambda_handler_refuses_unsigned_requests_when_identity_keys_are_set(tmp_path: Path) -> None:
    settings = Settings(
        countersign_env="test",
        approvals_signing_keys={"k1": b"s" * 40},
        approvals_outbox_dir=tmp_path / "outbox",
        restate_identity_keys=[identity.ensure_key_pair(tmp_path / "identity.pem")],
    )

    def unsigned() -> tuple[int, int]:
        handler = create_handler(settings)
        discovery = handler(lambda_event("/discover", headers={"accept": MANIFEST_V3}), None)
        invoke = handler(lambda_event("/invoke/AgentRun/run", "POST"), None)
        return int(discovery["statusCode"]), int(invoke["statusCode"])

    assert on_own_thread(unsigned) == (401, 401)


def test_lambda_handler_refuses_to_start_without_signing_keys(tmp_path: Path) -> None:
    settings = Settings(countersign_env="test", approvals_signing_keys={}, approvals_outbox_dir=tmp_path / "outbox")
    with pytest.raises(SettingsError, match="APPROVALS_SIGNING_KEYS is not set") as refused:
        create_handler(settings)
    assert refused.value.setting == "APPROVALS_SIGNING_KEYS"


@pytest.mark.slow
def test_a_run_served_by_the_lambda_handler_pauses_and_completes(private_stacks: StackFactory, tmp_path: Path) -> None:
    """restate-server signs every request; the handler sees only Lambda events, one per attempt."""
    stack = private_stacks()
    assert stack.env["RESTATE_IDENTITY_KEYS"] == stack.restate.identity_key
    unsigned = httpx.get(f"{stack.app.restate_uri}/discover", timeout=10, trust_env=False)
    assert unsigned.status_code == 401

    bridge = LambdaBridge.start(
        env={**stack.env, "AWS_LAMBDA_FUNCTION_NAME": "countersign-test"}, log_path=tmp_path / "lambda.log"
    )
    try:
        stack.restate.register(bridge.restate_uri, http1=True)
        lambda_id = deployment_id(stack.restate, bridge.restate_uri)
        [registered] = [d for d in deployments(stack.restate) if d["id"] == lambda_id]
        assert registered["protocol_type"] == "RequestResponse"
        [http_app] = [d for d in deployments(stack.restate) if d["uri"] == stack.app.restate_uri]
        assert {s["name"] for s in registered["services"]} == {s["name"] for s in http_app["services"]}

        order = new_order(stack.db_path, 100000)
        stack.ingress.start_run("via-lambda", refund(order))
        [mail] = wait_for_email(stack.outbox_dir, "via-lambda")
        wait_until(
            lambda: "suspended" in {r["status"] for r in stack.restate.invocation_statuses(key="via-lambda")},
            30,
            "the run to suspend",
        )
        assert pinned_deployments(stack.restate, ["via-lambda"]) == {"via-lambda": lambda_id}
        assert submit(mail.link, "approve").status_code == 200

        result = stack.ingress.wait_output("via-lambda", timeout=60).json()
        assert result["status"] == "completed" and result["actions"][0]["outcome"] == "approved"
        assert refunds_for(stack.db_path, "via-lambda") == [("via-lambda/0", order, 75000)]
        events = bridge.event_lines()
        assert "POST /discover -> 200" in events or "GET /discover -> 200" in events
        runs = [e for e in events if e.startswith("POST /invoke/AgentRun/run ")]
        assert len(runs) >= 2, f"one event up to the pause and at least one after the approval: {events}"
        assert all(e.endswith("-> 200") for e in runs)
        assert "POST /invoke/Approval/submit -> 200" in events, "the page decides through the approval"
        assert any(e.startswith("POST /invoke/Approval/run ") for e in events), "the approval waits on its own"
    finally:
        bridge.stop()


def test_the_session_app_is_registered_with_the_parametrised_protocol(
    app_server: AppServer, restate_server: RestateServer, deployment_protocol: str
) -> None:
    [mine] = [d for d in deployments(restate_server) if d["uri"] == app_server.restate_uri]
    http1 = DEPLOYMENT_PROTOCOLS[deployment_protocol]
    assert mine["protocol_type"] == ("RequestResponse" if http1 else "BidiStream")
    assert mine["http_version"] == ("HTTP/1.1" if http1 else "HTTP/2.0")


def statuses(restate: RestateServer, run_id: str, service: str = "AgentRun") -> set[str]:
    return {r["status"] for r in restate.invocation_statuses(service, run_id) if r["target_handler_name"] == "run"}


@pytest.mark.slow
def test_upgrade_while_paused_new_runs_go_to_b_and_paused_runs_finish_on_a(
    isolated_stack: StackFactory, deployment_protocol: str, tmp_path: Path
) -> None:
    stack = isolated_stack()
    restate, app_a = stack.restate, stack.app
    id_a = deployment_id(restate, app_a.restate_uri)
    old_runs = ["old-1", "old-2", "old-3"]
    orders = {run_id: new_order(stack.db_path, 100000) for run_id in [*old_runs, "new-1", "new-2"]}
    for run_id in old_runs:
        stack.ingress.start_run(run_id, refund(orders[run_id]))
    mails = {run_id: wait_for_email(stack.outbox_dir, run_id)[0] for run_id in old_runs}
    wait_until(lambda: all("suspended" in statuses(restate, r) for r in old_runs), 30, "the old runs to suspend")

    # Deployment B: a new process on another port, registered while the old runs wait.
    port_b = free_port()
    app_b = AppServer.start(
        env={**stack.env, "APPROVALS_PUBLIC_URL": f"http://127.0.0.1:{port_b}"},
        port=port_b,
        log_path=tmp_path / "b.log",
    )
    try:
        restate.register(app_b.restate_uri, http1=DEPLOYMENT_PROTOCOLS[deployment_protocol])
        id_b = deployment_id(restate, app_b.restate_uri)
        assert id_b != id_a

        for run_id in ("new-1", "new-2"):
            stack.ingress.start_run(run_id, refund(orders[run_id]))
        new_mails = {run_id: wait_for_email(stack.outbox_dir, run_id)[0] for run_id in ("new-1", "new-2")}
        assert all(m.link.startswith(app_b.url) for m in new_mails.values())
        assert pinned_deployments(restate, [*old_runs, "new-1", "new-2"]) == {
            **{run_id: id_a for run_id in old_runs},
            "new-1": id_b,
            "new-2": id_b,
        }

        # Pinned runs need A: with A down, an approved old run cannot move on, and does not move to B.
        app_a.stop()
        token = mails["old-3"].link.rsplit("/", 1)[1]
        decided = stack.ingress.call("AgentRun", "old-3", "decide", {"token": token, "verdict": "approve"})
        assert decided.status_code == 200 and decided.json()["accepted"] is True
        # The approval's own workflow, pinned to A like its run, is what resumes on the decision.
        approval_waits = lambda: "backing-off" in statuses(restate, "old-3-a0", "Approval")  # noqa: E731
        wait_until(approval_waits, 30, "old-3's approval to retry against the stopped A")
        assert refunds_for(stack.db_path, "old-3") == []
        app_a.restart()

        for run_id in ("old-1", "old-2"):
            assert submit(mails[run_id].link, "approve").status_code == 200
        for mail in new_mails.values():
            assert submit(mail.link, "approve").status_code == 200
        for run_id, order in orders.items():
            result = stack.ingress.wait_output(run_id, timeout=60).json()
            assert result["status"] == "completed", run_id
            assert result["actions"][0]["outcome"] == "approved", run_id
            assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 75000)]
        assert pinned_deployments(restate, old_runs) == {run_id: id_a for run_id in old_runs}
    finally:
        app_b.stop()


def test_the_container_file_copies_what_the_app_reads_and_serves_on_port() -> None:
    """Docker cannot run here; this checks what can be checked without building the image."""
    dockerfile = (REPO / "Dockerfile").read_text()
    lines = [line.strip() for line in dockerfile.splitlines() if line.strip() and not line.startswith("#")]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert stages == ["FROM python:3.11-slim AS wheel", "FROM python:3.11-slim"]
    from_context = [line.split()[1:-1] for line in lines if line.startswith("COPY ") and "--from=" not in line]
    copied = {src for sources in from_context for src in sources}
    assert {"countersign", "email_templates", "requirements.lock", "pyproject.toml", "handlers"} <= copied
    assert all((REPO / src).exists() for src in copied)
    # The image runs the built wheel, installed with the locked dependencies, never an editable checkout.
    assert "RUN pip install -c /tmp/requirements.lock /tmp/dist/*.whl \\" in lines
    assert not any(" -e " in line for line in lines if line.startswith("RUN "))
    allowed = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line[:1] == "!"}
    assert copied <= allowed, "the build context must include every copied path"
    [cmd] = [line for line in lines if line.startswith("CMD ")]
    assert json.loads(cmd.removeprefix("CMD "))[-1] == "exec countersign serve --bind 0.0.0.0:${PORT}"
    # The deployable handlers/ (the demo, the Lambda function) import beside the installed library.
    assert "WORKDIR /app" in lines and "COPY handlers ./handlers" in lines and "PYTHONPATH=/app" in dockerfile
    # The platform routes one port: the Restate endpoint shares it with the pages.
    assert "RESTATE_ENDPOINT_BIND=shared" in dockerfile
    assert parser().parse_args(["serve", "--bind", "0.0.0.0:8080"]).bind == "0.0.0.0:8080"


def test_the_deployable_handlers_build_from_the_environment_with_the_public_api(tmp_path: Path) -> None:
    """handlers/app.py and handlers/lambda_function.py (this repository's deployable) build from the
    environment through `countersign`'s public names only; without a signing key, one typed error."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "COUNTERSIGN_ENV": "dev",
        "APPROVALS_OUTBOX_DIR": str(tmp_path / "outbox"),
        "DEMO_DB": str(tmp_path / "business.db"),
    }
    probe = (
        "from handlers.app import app; from handlers.lambda_function import handler; "
        "import countersign; print(callable(app), handler is countersign.lambda_handler)"
    )
    keyed = {**env, "APPROVALS_SIGNING_KEYS": "k1:" + "s" * 40}
    built = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=keyed, capture_output=True, text=True)
    assert built.returncode == 0 and built.stdout.split() == ["True", "True"], built.stderr
    unkeyed = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert unkeyed.returncode != 0 and "SettingsError: APPROVALS_SIGNING_KEYS is not set" in unkeyed.stderr

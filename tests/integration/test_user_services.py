"""A user's own Restate services in Countersign's endpoint: COUNTERSIGN_SERVICES and create_app(services=...)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import restate
from support.approver import submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import USER_CODE, StackFactory, free_port, make_app_env, user_services

from countersign.runtime.app import create_app
from countersign.settings import Settings

MANIFEST_V3 = "application/vnd.restate.endpointmanifest.v3+json"


def test_user_services_are_served_beside_countersign(private_stacks: StackFactory) -> None:
    stack = private_stacks(app_env=user_services("myapp.services:both"))
    assert stack.ingress.call("Greeter", None, "greet", "ada").json() == "hello ada"
    assert [stack.ingress.call("Counter", "c1", "add", n).json() for n in (2, 3)] == [2, 5]
    # Countersign's own services and pages, in the same app and registration.
    order = new_order(stack.db_path, 70000)
    task = {
        "goal": "refund",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "700.00", "reason": "r"}}],
    }
    stack.ingress.start_run("svc-1", task)
    [mail] = wait_for_email(stack.outbox_dir, "svc-1")
    assert submit(mail.link, "approve").status_code == 200
    assert stack.ingress.wait_output("svc-1").json()["status"] == "completed"
    assert len(refunds_for(stack.db_path, "svc-1")) == 1
    [deployment] = httpx.get(f"{stack.restate.admin_url}/deployments", timeout=10).json()["deployments"]
    assert {"AgentRun", "ApprovalInbox", "Greeter", "Counter"} <= {s["name"] for s in deployment["services"]}
    log = stack.app.log_path.read_text()
    assert "services: COUNTERSIGN_SERVICES=myapp.services:both: Greeter, Counter" in log
    # Each listener says where it listens once (hypercorn's own handler doubled every line).
    listening = [line.split("Running on ", 1)[1] for line in log.splitlines() if "Running on " in line]
    assert len(listening) == 2 and len(set(listening)) == 2, listening
    # Registering the listener without its path: restate-server's refusal quotes where the endpoint is.
    with pytest.raises(RuntimeError, match=r"META0003.*register its URL ending in /restate"):
        stack.restate.register(f"http://127.0.0.1:{stack.app.restate_port}")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("myapp/services.py", "is not package.module:ATTR"),
        ("nosuch.module:greeter", "cannot import 'nosuch.module'"),
        ("myapp.broken:greeter", "importing 'myapp.broken' raised RuntimeError: boom at import"),
        ("myapp.typo:toolset", "raised ValueError: CountersignToolset: issue_refnd not among the loaded tools"),
        ("myapp.services:nope", "module 'myapp.services' has no attribute 'nope'"),
        ("myapp.services:NOT_A_SERVICE", "not a restate Service, VirtualObject or Workflow or a list of them (int)"),
        ("myapp.services:clash", "a service named 'AgentRun' is already served"),
        ("myapp.services:greeter,myapp.services:both", "a service named 'Greeter' is already served"),
    ],
)
def test_a_bad_services_setting_stops_serve_at_start_with_one_line(tmp_path: Path, value: str, says: str) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        **make_app_env(ingress_url="http://127.0.0.1:9", outbox_dir=tmp_path / "outbox", db_path=tmp_path / "b.db"),
        "COUNTERSIGN_SERVICES": value,
    }
    bind = f"127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "countersign", "serve", "--bind", bind],
        cwd=USER_CODE,  # a user's project folder with the package `myapp`: the cwd the app is started from
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert "COUNTERSIGN_SERVICES" in line and says in line, line


def test_create_app_serves_the_given_services_and_refuses_bad_ones(tmp_path: Path) -> None:
    settings = Settings(
        countersign_env="test", approvals_signing_keys={"k1": b"s" * 40}, approvals_outbox_dir=tmp_path / "outbox"
    )
    mine = restate.Workflow("Onboarding")

    @mine.main()
    async def run(ctx: restate.WorkflowContext) -> str:
        return "done"

    async def discover() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(settings, services=[mine]))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.get("/restate/discover", headers={"accept": MANIFEST_V3})

    # A thread of its own: an earlier test (Playwright's sync API) may leave a loop on this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        discovered = pool.submit(asyncio.run, discover()).result(timeout=60)
    assert discovered.status_code == 200
    names = {s["name"]: s["ty"] for s in discovered.json()["services"]}
    assert names["Onboarding"] == "WORKFLOW" and names["AgentRun"] == "WORKFLOW"
    with pytest.raises(ValueError, match="a service named 'Onboarding' is already served"):
        create_app(settings, services=[mine, mine])
    with pytest.raises(ValueError, match=r"create_app\(services=...\): a value is not a restate Service"):
        create_app(settings, services=["Onboarding"])  # type: ignore[list-item]

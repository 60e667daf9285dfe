"""Your own tools, loaded by COUNTERSIGN_TOOLS, against the real restate-server and app: an async
effect that calls an HTTP API (a local fake) with the idempotency key, its policy given in code."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.approver import form_csrf, submit, wait_for_email
from support.processes import AppServer, ProcessStartError, StackFactory, make_app_env, wait_until

OWN_TOOLS = "tests.support.own_tools:TOOLS"


class PaymentsFake:
    """A payments API on 127.0.0.1: `POST /payments` with an Idempotency-Key; a repeated key gets the
    first payment back and pays nothing (as real payment APIs do). `requests` lists every key seen."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.payments: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                key = self.headers.get("idempotency-key")
                with fake._lock:
                    fake.requests.append(str(key))
                    if key is None:
                        status, answer = 400, {"error": "an Idempotency-Key header is required"}
                    else:
                        payment = fake.payments.setdefault(key, {"id": f"pay_{len(fake.payments) + 1}", **body})
                        status, answer = 200, payment
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture()
def payments() -> Iterator[PaymentsFake]:
    fake = PaymentsFake()
    try:
        yield fake
    finally:
        fake.stop()


def pay(invoice: int, amount: str, country: str = "DE") -> dict[str, Any]:
    return {
        "tool": "pay_invoice",
        "args": {"invoice": f"inv_{invoice}", "amount": amount, "vendor": {"name": "Acme", "country": country}},
    }


def task(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"goal": "Pay the invoices", "requester": "alice@example.com", "tenant": "acme", "script": list(calls)}


def own_tools_env(payments: PaymentsFake) -> dict[str, str]:
    return {"COUNTERSIGN_TOOLS": OWN_TOOLS, "PAYMENTS_API_URL": payments.url}


def test_own_async_tool_runs_once_with_its_context(isolated_stack: StackFactory, payments: PaymentsFake) -> None:
    stack = isolated_stack(app_env=own_tools_env(payments))
    assert f"tools: COUNTERSIGN_TOOLS={OWN_TOOLS}: pay_invoice" in stack.app.log_path.read_text()
    run = "own-pay"
    stack.ingress.start_run(run, task(pay(1, "120.00"), pay(2, "800.00")))
    [mail] = wait_for_email(stack.outbox_dir, run)
    assert "manager-of-alice@example.com" in str(mail.message["To"]), "the callable named the requester's manager"
    assert payments.requests == [f"{run}/0"], "the autonomous payment ran; the gated one waits"

    assert submit(mail.link, "approve").status_code == 200
    result = stack.ingress.wait_output(run, timeout=60).json()
    small, big = result["actions"]
    assert (small["outcome"], big["outcome"]) == ("autonomous", "approved")
    assert small["result"]["approval_id"] is None and small["result"]["approved_by"] == []
    assert {k: small["result"][k] for k in ("run_id", "tenant", "requester")} == {
        "run_id": run,
        "tenant": "acme",
        "requester": "alice@example.com",
    }
    assert big["result"]["approval_id"] == f"{run}-a1"
    assert big["result"]["approved_by"] == ["manager-of-alice@example.com"]
    assert payments.requests == [f"{run}/0", f"{run}/1"], "each payment was asked for exactly once"
    assert payments.payments[f"{run}/1"]["amount"] == "800.00"


@pytest.mark.slow
def test_kill9_handler_while_own_tool_pending_then_approve(
    isolated_stack: StackFactory, payments: PaymentsFake
) -> None:
    stack = isolated_stack(app_env=own_tools_env(payments))
    run = "own-kill"
    stack.ingress.start_run(run, task(pay(3, "40.00", country="FR")))  # gated by the vendor's country
    [mail] = wait_for_email(stack.outbox_dir, run)
    csrf = form_csrf(mail.link)

    stack.app.kill9()
    wait_until(
        lambda: (
            {r["status"] for r in stack.restate.invocation_statuses(key=run) if r["target_handler_name"] == "run"}
            & {"suspended", "backing-off"}
        ),
        30,
        "the run to park",
    )
    stack.app.restart()
    assert payments.requests == []
    assert submit(mail.link, "approve", csrf=csrf).status_code == 200

    result = stack.ingress.wait_output(run, timeout=60).json()
    assert result["status"] == "completed" and result["actions"][0]["outcome"] == "approved"
    assert payments.requests == [f"{run}/0"], "exactly one payment request after the crash"


def test_a_bad_tools_path_stops_the_app_at_start(tmp_path: Path) -> None:
    env = {
        **make_app_env(ingress_url="http://127.0.0.1:9", outbox_dir=tmp_path / "outbox", db_path=tmp_path / "b.db"),
        "COUNTERSIGN_TOOLS": "tests.support.own_tools:NO_SUCH_TOOLS",
    }
    log = tmp_path / "app.log"
    with pytest.raises(ProcessStartError):
        AppServer.start(env=env, log_path=log)
    spec = "tests.support.own_tools:NO_SUCH_TOOLS"
    assert f"COUNTERSIGN_TOOLS={spec}: module tests.support.own_tools has no attribute" in log.read_text()

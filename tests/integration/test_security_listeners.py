"""The two listeners: the pages time out slow clients while a Restate invocation stream stays open.

The pages' timeouts are set tiny here (about a second, through the PAGES_* settings) so the test
takes well under a minute; production defaults are 5 s idle, 30 s read, 10 s body. A connection
"is closed within" a timeout when the server ends it before that timeout plus `GRACE` (a loaded
machine's slack). The Restate stream is held idle for `STREAM_IDLE_SECONDS`, many times every
page timeout, and must come through on its first attempt.
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
import subprocess
import sys
import time
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.approver import submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import REPO, AppServer, StackFactory, free_port, make_app_env

from countersign.runtime.server import public_config, restate_config
from countersign.settings import Settings

IDLE_TIMEOUT, BODY_TIMEOUT, READ_TIMEOUT = 1.0, 1.5, 2
PAGE_TIMEOUTS = {
    "PAGES_IDLE_TIMEOUT_SECONDS": str(IDLE_TIMEOUT),
    "PAGES_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
    "PAGES_READ_TIMEOUT_SECONDS": str(READ_TIMEOUT),
}
GRACE = 5.0
TRICKLE_EVERY = 0.2
"""Slower than any timeout here, faster than the read timeout: only the body or idle deadline stops it."""
STREAM_IDLE_SECONDS = 20.0
WEBHOOK_SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def slow_post(path: str, origin: str = "", content_type: str = "application/x-www-form-urlencoded") -> bytes:
    """The head of a POST declaring 1,000 bytes, and the first 10 of them."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: 1000\r\n"
    if origin:
        head += f"Origin: {origin}\r\nSec-Fetch-Site: same-origin\r\n"
    return (head + "\r\n").encode() + b"verdict=ap"


# The webhook reads its body (once a secret is set) before it checks anything else.
SLOW_WEBHOOK = slow_post("/webhooks/resend", content_type="application/json")


def until_closed(address: tuple[str, int], sent: bytes, within: float, trickle: bytes = b"") -> bytes:
    """Send `sent`, then one byte of `trickle` (repeated) every TRICKLE_EVERY s, and return what the
    server answered once it has closed the connection; fail if it is still open after `within` s."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(sent)
        received = b""
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(min(TRICKLE_EVERY, left))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if trickle:
                    try:
                        sock.sendall(trickle[:1])
                    except (BrokenPipeError, ConnectionResetError):
                        return received
                continue
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk
        raise AssertionError(f"the connection was still open after {within} s; it had answered {received[:120]!r}")


def start_app(tmp_path: Path, extra: dict[str, str] | None = None) -> AppServer:
    """The real app, no Restate behind it (the pages' timeouts act before any handler runs)."""
    env = {
        **make_app_env(ingress_url="http://127.0.0.1:9", outbox_dir=tmp_path / "outbox", db_path=tmp_path / "db"),
        **PAGE_TIMEOUTS,
        "RESEND_WEBHOOK_SECRET": WEBHOOK_SECRET,
        **(extra or {}),
    }
    return AppServer.start(env=env, log_path=tmp_path / "app.log")


@pytest.fixture()
def app(tmp_path: Path) -> Any:
    server = start_app(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def assert_refused_slow_body(answer: bytes) -> None:
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 408"), answer[:200]
    assert b"connection: close" in head and b"x-frame-options: deny" in head


def test_a_slow_body_gets_408_and_is_closed_within_the_body_timeout(app: AppServer) -> None:
    """Declares 1,000 bytes, sends 10, then trickles: neither idle nor read timeout ends it, the body one does."""
    answer = until_closed(("127.0.0.1", app.port), SLOW_WEBHOOK, BODY_TIMEOUT + GRACE, trickle=b"x")
    assert_refused_slow_body(answer)


def test_slow_headers_and_idle_connections_are_closed_within_the_idle_timeout(app: AppServer) -> None:
    partial = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    assert until_closed(("127.0.0.1", app.port), partial, IDLE_TIMEOUT + GRACE, trickle=b"X") == b""
    kept_alive = until_closed(("127.0.0.1", app.port), b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 1 + GRACE)
    assert kept_alive.startswith(b"HTTP/1.1 200") and kept_alive.endswith(b"ok")


def test_on_one_shared_port_the_body_deadline_still_holds(tmp_path: Path) -> None:
    """RESTATE_ENDPOINT_BIND=shared (the container image): the Restate limits serve the pages, but
    no page waits on a trickled body past its deadline."""
    shared = start_app(tmp_path, {"RESTATE_ENDPOINT_BIND": "shared"})
    try:
        assert shared.restate_uri == f"{shared.url}/restate"
        answer = until_closed(("127.0.0.1", shared.port), SLOW_WEBHOOK, BODY_TIMEOUT + GRACE, trickle=b"x")
        assert_refused_slow_body(answer)
    finally:
        shared.stop()


def test_a_restate_stream_stays_open_far_past_the_pages_timeouts(private_stacks: StackFactory) -> None:
    """HTTP/2, bidirectional: the run waits on its approval on one open invocation stream, idle for many
    times every page timeout (the same attempt throughout), while the same process closes a slow page
    client; then the approval completes it."""
    stack = private_stacks(
        restate_env={"RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT": "10m"}, app_env=PAGE_TIMEOUTS, http1=False
    )
    run_id = "listeners-1"
    order = new_order(stack.db_path, 90000)
    task = {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "900.00", "reason": "damaged"}}],
    }
    assert stack.ingress.start_run(run_id, task).status_code == 202
    [mail] = wait_for_email(stack.outbox_dir, run_id)

    def attempt() -> dict[str, Any]:
        [row] = stack.restate.sql(
            "select status, retry_count, last_start_at from sys_invocation"
            f" where target_service_key = '{run_id}' and target_handler_name = 'run'"
        )
        return row

    waiting = attempt()
    assert waiting["status"] == "running", waiting  # on its stream: not suspended, not backing off
    # The approver's own link, same origin: the page would read this body, were it ever complete.
    link = urlsplit(mail.link)
    decision = slow_post(link.path, origin=f"{link.scheme}://{link.netloc}")
    assert_refused_slow_body(until_closed(("127.0.0.1", stack.app.port), decision, BODY_TIMEOUT + GRACE))
    idle_until = time.monotonic() + STREAM_IDLE_SECONDS
    while time.monotonic() < idle_until:  # bounded: checks the stream is still the first attempt, throughout
        assert attempt() == waiting
        time.sleep(0.5)

    assert submit(mail.link, "approve", confirm="900.00").status_code == 200
    result = stack.ingress.wait_output(run_id).json()
    assert result["status"] == "completed" and result["actions"][0]["outcome"] == "approved"
    assert refunds_for(stack.db_path, run_id) == [(f"{run_id}/0", order, 90000)]


def test_the_limits_come_from_the_installed_package() -> None:
    """Not from the current folder: `countersign/runtime/hypercorn.toml` is package data, read as a resource."""
    assert resources.files("countersign.runtime").joinpath("hypercorn.toml").is_file()
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "hypercorn.toml" in package_data["countersign.runtime"]
    restate = restate_config("127.0.0.1:9081")
    assert (restate.keep_alive_max_requests, restate.keep_alive_timeout, restate.h2_max_concurrent_streams) == (
        2147483647,
        2147483647,
        2147483647,
    )
    assert restate.read_timeout is None and restate.bind == ["127.0.0.1:9081"]
    pages = public_config("127.0.0.1:9080", Settings(pages_idle_timeout_seconds=3, pages_read_timeout_seconds=7))
    assert (pages.keep_alive_timeout, pages.read_timeout, pages.h11_max_incomplete_size) == (3, 7, 16384)


@pytest.mark.parametrize(
    ("endpoint_bind", "named"),
    [
        ("busy", "RESTATE_ENDPOINT_BIND 127.0.0.1:{busy}: Address already in use"),
        ("pages", "RESTATE_ENDPOINT_BIND 127.0.0.1:{pages} is the pages' --bind too"),
        ("9081", "RESTATE_ENDPOINT_BIND: String should match pattern"),
    ],
)
def test_a_bad_restate_endpoint_bind_stops_serve_with_one_line(tmp_path: Path, endpoint_bind: str, named: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = {"busy": taken.getsockname()[1], "pages": free_port()}
        value = f"127.0.0.1:{ports[endpoint_bind]}" if endpoint_bind in ports else endpoint_bind
        env = {
            **os.environ,
            **make_app_env(ingress_url="http://127.0.0.1:9", outbox_dir=tmp_path / "outbox", db_path=tmp_path / "db"),
            "RESTATE_ENDPOINT_BIND": value,
        }
        done = subprocess.run(
            [sys.executable, "-m", "countersign", "serve", "--bind", f"127.0.0.1:{ports['pages']}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert named.format(**ports) in done.stderr and "Traceback" not in done.stderr

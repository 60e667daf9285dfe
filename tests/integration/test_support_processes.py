"""Self-checks for tests/support/processes.py and the conftest fixtures.

Guarantee: these tests need the restate-server and CLI binaries but not the `countersign` package;
the AppServer checks run a stand-in `countersign` package written into a temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import httpx
import pytest
from support.processes import (
    AppServer,
    Ingress,
    ProcessStartError,
    RestateServer,
    find_restate_cli,
    free_port,
    port_is_free,
    wait_until,
)

FAKE_MAIN = textwrap.dedent(
    """
    import argparse, http.server, os, signal, subprocess, sys, threading

    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--bind", required=True)
    args = parser.parse_args()
    if os.environ.get("FAKE_EXIT_AT_START"):
        print("fake app refuses to start", flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("FAKE_CHILD_PID_FILE"):
        child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        with open(os.environ["FAKE_CHILD_PID_FILE"], "w") as f:
            f.write(str(child.pid))

    def answering(path):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == path else 404)
                self.end_headers()
        return Handler

    # Like the real app: the pages on --bind, the Restate endpoint on RESTATE_ENDPOINT_BIND.
    host, port = os.environ["RESTATE_ENDPOINT_BIND"].rsplit(":", 1)
    endpoint = http.server.HTTPServer((host, int(port)), answering("/restate/health"))
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    host, port = args.bind.rsplit(":", 1)
    http.server.HTTPServer((host, int(port)), answering("/healthz")).serve_forever()
    """
)


def _pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (works for processes that are not our children)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _assert_reaped(proc: subprocess.Popen[bytes]) -> None:
    assert proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)


@pytest.fixture()
def fake_app_dir(tmp_path: Path) -> Path:
    package = tmp_path / "fake" / "countersign"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(FAKE_MAIN)
    return package.parent


def test_wait_until_returns_the_first_truthy_value_and_times_out() -> None:
    answers = iter([None, False, "ready"])
    assert wait_until(lambda: next(answers), 5.0, "the answer", interval=0.01) == "ready"
    with pytest.raises(TimeoutError, match=r"^timed out after 0.2s waiting for nothing$"):
        wait_until(lambda: None, 0.2, "nothing")


def test_restate_server_sql_restart_and_stop(tmp_path: Path) -> None:
    server = RestateServer.start(tmp_path / "restate")
    try:
        assert server.sql("select 1 as one") == [{"one": 1}]
        assert server.invocation_statuses() == []
        urls = (server.ingress_url, server.admin_url, server.env["RESTATE_BIND_ADDRESS"])
        assert all(url.startswith(("http://127.0.0.1:", "127.0.0.1:")) for url in urls)

        with Ingress(server.ingress_url) as ingress:
            # Leaves a keep-alive connection open across the crash.
            assert ingress.call("NoSuchService", None, "run", None).status_code == 404
            first = server.proc
            server.restart(hard=True)
            _assert_reaped(first)
            assert first.returncode == -9
            assert server.pid != first.pid
            assert (server.ingress_url, server.admin_url, server.env["RESTATE_BIND_ADDRESS"]) == urls
            assert httpx.get(f"{server.admin_url}/health", trust_env=False).status_code == 200
            assert server.sql("select 1 as one") == [{"one": 1}]
            assert ingress.call("NoSuchService", "k", "run", {"x": 1}).status_code == 404

            second = server.proc
            server.restart()
            _assert_reaped(second)
            assert second.returncode == 0
            assert server.invocation_statuses(key="it's quoted") == []

        last = server.proc
        server.stop()
        _assert_reaped(last)
        assert last.returncode == 0
        server.stop()
        server.kill9()
        assert server.log_path.read_text().count("starting: ") == 3
    finally:
        server.stop()


def test_session_server_fixture_cli_and_register_errors(restate_server: RestateServer) -> None:
    cli = subprocess.run(
        [str(find_restate_cli()), "sql", "select 41 + 1 as answer"],
        env=restate_server.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "42" in cli.stdout

    # Discovery of a dead endpoint fails; the error shows which HTTP client the server used.
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=r"HTTP 500: .*META0003") as h2_error:
        restate_server.register(dead)
    assert "h2 pool" in str(h2_error.value)
    with pytest.raises(RuntimeError, match=r"HTTP 500: .*META0003") as http1_error:
        restate_server.register(dead, http1=True)
    assert "h2 pool" not in str(http1_error.value)


def test_app_server_start_kill_restart_stop(fake_app_dir: Path, tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    app = AppServer.start(
        env={"FAKE_CHILD_PID_FILE": str(child_pid_file)}, cwd=fake_app_dir, log_path=tmp_path / "app.log"
    )
    try:
        assert app.url == f"http://127.0.0.1:{app.port}"
        assert app.restate_port != app.port and "RESTATE_ENDPOINT_BIND" not in app.env
        assert app.restate_uri == f"http://127.0.0.1:{app.restate_port}/restate"
        assert httpx.get(f"{app.url}/healthz", trust_env=False).status_code == 200
        assert httpx.get(f"{app.restate_uri}/health", trust_env=False).status_code == 200
        child_pid = int(wait_until(lambda: child_pid_file.read_text() or None, 5.0, "the child's pid"))
        assert _pid_alive(child_pid)

        first, port, restate_port = app.proc, app.port, app.restate_port
        app.kill9()
        _assert_reaped(first)
        wait_until(lambda: not _pid_alive(child_pid), 5.0, "the app's child to die with its group")
        assert port_is_free(port) and port_is_free(restate_port)

        app.restart()
        assert (app.port, app.restate_port) == (port, restate_port) and app.pid != first.pid
        assert httpx.get(f"{app.restate_uri}/health", trust_env=False).status_code == 200
        assert httpx.get(f"{app.url}/healthz", trust_env=False).status_code == 200

        second = app.proc
        app.restart()
        _assert_reaped(second)
        assert second.returncode == -15

        last = app.proc
        app.stop()
        _assert_reaped(last)
        assert not app.sigterm_ignored
    finally:
        app.stop()


def test_app_server_that_ignores_sigterm_is_killed_and_flagged(fake_app_dir: Path, tmp_path: Path) -> None:
    app = AppServer.start(env={"FAKE_IGNORE_SIGTERM": "1"}, cwd=fake_app_dir, log_path=tmp_path / "app.log")
    try:
        proc = app.proc
        app.stop(grace=0.5)
        _assert_reaped(proc)
        assert proc.returncode == -9
        assert app.sigterm_ignored
    finally:
        app.kill9()


def test_app_server_that_fails_to_start_raises_with_its_log(fake_app_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(ProcessStartError, match=r"(?s)exit code 3.*fake app refuses to start"):
        AppServer.start(env={"FAKE_EXIT_AT_START": "1"}, port=port, cwd=fake_app_dir, log_path=tmp_path / "app.log")
    assert port_is_free(port)

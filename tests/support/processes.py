"""Real restate-server and handlers processes for the tests, on 127.0.0.1 and free ports.

Guarantee: every process started here runs in a new session, so its process group id is its own
PID. It is signalled only through that PID or that group, and it is reaped when it is stopped.
Nothing else on the machine is ever signalled. A start that does not become healthy before its
deadline is stopped before the error (with the tail of the log) is raised, so a failed start
leaves nothing running. Every wait is a bounded poll (`wait_until`); nothing sleeps blindly.
Stacks run protected as in production: each restate-server signs its requests with its own ed25519
key, which the app it registers requires, and the app seals journal values with a fresh key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, TypeVar, cast

import httpx

from countersign.security import identity
from countersign.security.codec import JournalCipher
from countersign.settings import SHARED_LISTENER, parse_journal_keys
from countersign.tools import DEMO_TOOLS

REPO = Path(__file__).resolve().parents[2]
NODE_MODULES = REPO / "node_modules"
RESTATE_CONFIG = REPO / "restate.toml"

RESTATE_START_TIMEOUT = 30.0
RESTATE_STOP_GRACE = 10.0
APP_START_TIMEOUT = 60.0
"""An app serving an agent framework imports it first (several seconds of CPU for ADK or the Agents
SDK); with the suite's workers sharing two cores that can take well over 20 s."""
APP_STOP_GRACE = 5.0
PORT_RELEASE_TIMEOUT = 15.0
LOG_TAIL_LINES = 40
DEPLOYMENT_PROTOCOLS = {"http2": False, "http1.1": True, "http2+replay": False}
"""Test id -> whether a deployment is registered with `use_http_11` (request/response) or not (bidi).
`http2+replay` is HTTP/2 under replay torture (see `restate_env_of`)."""
ALWAYS_REPLAY = "ALWAYS_REPLAY"
INACTIVITY_TIMEOUT = "RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT"

T = TypeVar("T")

_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
_OS = {"Linux": "linux", "Darwin": "darwin"}


class ProcessExitedError(RuntimeError):
    """A process exited while we were waiting for it to become ready."""


class ProcessStartError(RuntimeError):
    """A process did not become healthy; it has been stopped and the message has its log tail."""


# --------------------------------------------------------------------------------------------------
# Binaries, ports, polling


def _npm_platform() -> str:
    machine, system = platform.machine().lower(), platform.system()
    if machine not in _ARCH or system not in _OS:
        raise RuntimeError(f"no @restatedev npm binaries for {system}/{machine}")
    return f"{_OS[system]}-{_ARCH[machine]}"


def _find_binary(env_var: str, package: str, executable: str) -> Path:
    override = os.environ.get(env_var)
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"{env_var}={override!r} is not an executable file")
        return path
    path = NODE_MODULES / "@restatedev" / f"{package}-{_npm_platform()}" / "bin" / executable
    if not path.is_file():
        raise FileNotFoundError(
            f"{executable} binary not found at {path}. Run `npm ci` in {REPO} (or point {env_var} at the binary)."
        )
    return path


def find_restate_server() -> Path:
    """The native restate-server binary: $RESTATE_SERVER_BIN, else the one npm installed."""
    return _find_binary("RESTATE_SERVER_BIN", "restate-server", "restate-server")


def find_restate_cli() -> Path:
    """The native restate CLI binary: $RESTATE_CLI_BIN, else the one npm installed."""
    return _find_binary("RESTATE_CLI_BIN", "restate", "restate")


# Ports for the servers the tests start are handed out below the kernel's ephemeral range (where
# outgoing connections take theirs), from a block of this process's own: pytest-xdist workers run
# side by side, and a port that one of them saw free and released would be taken by another's
# server before its own process bound it. The block is picked by the worker's number and the test
# run's id, so two runs on one machine rarely share blocks either; a port is handed out only if it is
# free when it is picked, and the cursor moves on, so a port just released is not handed out again at once.
_PORT_FLOOR, _PORT_BLOCK, _PORT_BLOCKS = 10000, 600, 37  # ports 10000-32199: below the ephemeral range
_port_cursor: list[int] = []


def _port_block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
    index = (int(worker) if worker.isdigit() else 0) + int(hashlib.sha256(run.encode()).hexdigest()[:8], 16)
    start = _PORT_FLOOR + (index % _PORT_BLOCKS) * _PORT_BLOCK
    return range(start, start + _PORT_BLOCK)


def _free_ports(count: int) -> list[int]:
    block = _port_block()
    if not _port_cursor:
        _port_cursor.append(block.start)
    chosen: list[int] = []
    for _ in range(len(block)):
        port = _port_cursor[0]
        _port_cursor[0] = port + 1 if port + 1 < block.stop else block.start
        if port_is_free(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"no {count} free ports in {block.start}-{block.stop - 1}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return _free_ports(1)[0]


def port_is_free(port: int) -> bool:
    """True if a server (which sets SO_REUSEADDR, as restate-server and hypercorn do) could bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_until(predicate: Callable[[], T | bool | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `predicate` until it returns something other than None or False, and return that.

    Raises TimeoutError after `timeout` seconds. Exceptions from `predicate` propagate at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result is not None and result is not False:
            return cast(T, result)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(min(interval, remaining))


PARKED = frozenset({"suspended", "backing-off"})
"""Restate's statuses of an invocation that waits (on a call, or to retry) rather than runs."""


def parked(statuses: set[str]) -> set[str] | None:
    """The parked statuses among an invocation's `statuses`, or None while there are none: a
    predicate for `wait_until`, which takes an empty set as an answer, not as "not yet"."""
    return (statuses & PARKED) or None


# --------------------------------------------------------------------------------------------------
# Process handling. Popen.poll()/send_signal() reap an exited child, after which its PID may be
# reused; these helpers look with WNOWAIT instead, so the PID (and its process group id) stays
# reserved until _kill_group_and_reap has signalled the group.


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _kill_group_and_reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.returncode is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _stop_process(proc: subprocess.Popen[bytes], grace: float, name: str) -> bool:
    """SIGTERM the process; SIGKILL its group after `grace` s. True if SIGTERM was enough."""
    if proc.returncode is not None:
        return True
    graceful = True
    if not _exited(proc):
        os.kill(proc.pid, signal.SIGTERM)
        try:
            wait_until(lambda: _exited(proc), grace, f"{name} (pid {proc.pid}) to exit on SIGTERM")
        except TimeoutError:
            graceful = False
    # Also takes down anything the process left behind in its group.
    _kill_group_and_reap(proc)
    return graceful


def _spawn(command: list[str], *, env: dict[str, str], cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n--- {time.strftime('%H:%M:%S')} starting: {shlex.join(command)}\n".encode())
        log.flush()
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _http_get_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def _wait_ready(
    proc: subprocess.Popen[bytes],
    *,
    name: str,
    checks: list[Callable[[], bool]],
    what: str,
    timeout: float,
    log_path: Path,
    stop_grace: float,
) -> None:
    def ready() -> bool:
        if _exited(proc):
            raise ProcessExitedError(f"{name} (pid {proc.pid}) exited during startup")
        return all(check() for check in checks)

    try:
        wait_until(ready, timeout, what)
    except BaseException as exc:
        _stop_process(proc, stop_grace, name)
        if isinstance(exc, TimeoutError | ProcessExitedError):
            raise ProcessStartError(
                f"{name} did not become healthy: {exc} (exit code {proc.returncode})\n"
                f"--- last {LOG_TAIL_LINES} lines of {log_path} ---\n{log_tail(log_path)}"
            ) from exc
        raise


def _url_of(bind_address: str) -> str:
    return f"http://{bind_address}"


def _port_of(bind_address: str) -> int:
    return int(bind_address.rsplit(":", 1)[1])


def restate_env_of(protocol: str) -> dict[str, str]:
    """The restate-server settings of a protocol's tests: under `http2+replay`, replay torture (an
    inactivity timeout of 0 s, so every await suspends and every resume replays the journal)."""
    return {INACTIVITY_TIMEOUT: "0s"} if protocol.endswith("+replay") else {}


def inactivity_timeout() -> str:
    """2 s normally; 0 s under replay torture (`ALWAYS_REPLAY=1`, set by `pytest --always-replay`),
    where every await suspends the invocation and every resume replays its journal from the start."""
    return "0s" if os.environ.get(ALWAYS_REPLAY) == "1" else "2s"


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# --------------------------------------------------------------------------------------------------
# restate-server


@dataclass
class RestateServer:
    """One native restate-server process with its own base dir and ports."""

    proc: subprocess.Popen[bytes]
    base_dir: Path
    ingress_url: str
    admin_url: str
    env: dict[str, str]
    """The RESTATE_* variables this server runs with (on top of os.environ)."""
    log_path: Path
    binary: Path
    identity_key: str
    """The public key (publickeyv1_...) of the key this server signs its requests with."""
    journal_keys: str = ""
    """COUNTERSIGN_JOURNAL_KEYS of the app registered with this server (operator tools need them)."""

    @classmethod
    def start(cls, base_dir: Path, *, extra_env: dict[str, str] | None = None) -> RestateServer:
        binary = find_restate_server()
        base_dir = base_dir.resolve()
        base_dir.mkdir(parents=True, exist_ok=True)
        identity_pem = base_dir / "identity_private.pem"
        identity_key = identity.ensure_key_pair(identity_pem)
        ingress_port, admin_port, fabric_port = _free_ports(3)
        env = {
            identity.PRIVATE_KEY_ENV: str(identity_pem),
            "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ingress_port}",
            "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{admin_port}",
            "RESTATE_BIND_ADDRESS": f"127.0.0.1:{fabric_port}",
            "RESTATE_LISTEN_MODE": "tcp",
            "RESTATE_DEFAULT_NUM_PARTITIONS": "1",
            "RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE": "64 MiB",
            "RESTATE_DISABLE_TELEMETRY": "true",
            "RESTATE_LOG_DISABLE_ANSI_CODES": "true",
            "RESTATE_SHUTDOWN_TIMEOUT": "5s",
            INACTIVITY_TIMEOUT: inactivity_timeout(),
            **(extra_env or {}),
        }
        log_path = base_dir / "restate-server.log"
        server = cls(
            proc=_spawn(cls._command(binary, base_dir), env=cls._process_env(env), cwd=base_dir, log_path=log_path),
            base_dir=base_dir,
            ingress_url=_url_of(env["RESTATE_INGRESS__BIND_ADDRESS"]),
            admin_url=_url_of(env["RESTATE_ADMIN__BIND_ADDRESS"]),
            env=env,
            log_path=log_path,
            binary=binary,
            identity_key=identity_key,
        )
        server._wait_ready()
        return server

    @staticmethod
    def _command(binary: Path, base_dir: Path) -> list[str]:
        return [
            str(binary),
            "--config-file",
            str(RESTATE_CONFIG),
            "--base-dir",
            str(base_dir),
            "--node-name",
            "test-node",
            "--no-logo",
        ]

    @staticmethod
    def _process_env(env: dict[str, str]) -> dict[str, str]:
        return {**os.environ, **env}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _ports(self) -> list[int]:
        keys = ("RESTATE_INGRESS__BIND_ADDRESS", "RESTATE_ADMIN__BIND_ADDRESS", "RESTATE_BIND_ADDRESS")
        return [_port_of(self.env[key]) for key in keys]

    def _sql_answers(self) -> bool:
        # /health turns 200 before the partition processor can answer queries on sys_* tables.
        try:
            response = httpx.post(
                f"{self.admin_url}/query",
                json={"query": "select count(*) as n from sys_invocation"},
                headers={"accept": "application/json"},
                timeout=5.0,
                trust_env=False,
            )
        except httpx.TransportError:
            return False
        return response.status_code == 200

    def _wait_ready(self) -> None:
        _wait_ready(
            self.proc,
            name="restate-server",
            checks=[
                lambda: _http_get_ok(f"{self.admin_url}/health"),
                lambda: _http_get_ok(f"{self.ingress_url}/restate/health"),
                self._sql_answers,
            ],
            what=f"restate-server health at {self.admin_url}/health and {self.ingress_url}/restate/health",
            timeout=RESTATE_START_TIMEOUT,
            log_path=self.log_path,
            stop_grace=RESTATE_STOP_GRACE,
        )

    def register(self, uri: str, *, http1: bool = False) -> dict[str, Any]:
        """Register (or force-overwrite) the deployment at `uri`; return the admin API's answer."""
        body: dict[str, object] = {"uri": uri, "force": True}
        if http1:
            body["use_http_11"] = True
        response = httpx.post(f"{self.admin_url}/deployments", json=body, timeout=30.0, trust_env=False)
        if not response.is_success:
            raise RuntimeError(f"registering {uri} failed: HTTP {response.status_code}: {response.text}")
        return cast(dict[str, Any], response.json())

    def sql(self, query: str) -> list[dict[str, Any]]:
        """Run a SQL query through the admin API and return its rows."""
        response = httpx.post(
            f"{self.admin_url}/query",
            json={"query": query},
            headers={"accept": "application/json"},
            timeout=30.0,
            trust_env=False,
        )
        if not response.is_success:
            raise RuntimeError(f"query failed: HTTP {response.status_code}: {response.text}\n{query}")
        return cast(list[dict[str, Any]], response.json()["rows"])

    def invocation_statuses(self, service: str = "AgentRun", key: str | None = None) -> list[dict[str, Any]]:
        """id, target_service_key, target_handler_name and status of a service's invocations."""
        query = (
            "select id, target_service_key, target_handler_name, status from sys_invocation"
            f" where target_service_name = {_sql_literal(service)}"
        )
        if key is not None:
            query += f" and target_service_key = {_sql_literal(key)}"
        return self.sql(query + " order by created_at")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s. Idempotent."""
        _stop_process(self.proc, RESTATE_STOP_GRACE, "restate-server")

    def kill9(self) -> None:
        """SIGKILL the server at once (a crash). Idempotent."""
        _kill_group_and_reap(self.proc)

    def restart(self, hard: bool = False) -> None:
        """Stop (kill -9 if `hard`) and start again with the same binary, env, ports and base dir."""
        if hard:
            self.kill9()
        else:
            self.stop()
        wait_until(
            lambda: all(port_is_free(port) for port in self._ports()),
            PORT_RELEASE_TIMEOUT,
            f"restate-server ports {self._ports()} to be released",
        )
        self.proc = _spawn(
            self._command(self.binary, self.base_dir),
            env=self._process_env(self.env),
            cwd=self.base_dir,
            log_path=self.log_path,
        )
        self._wait_ready()

    def cli_env(self) -> dict[str, str]:
        """A complete environment for running the `restate` CLI against this server."""
        return {**os.environ, "RESTATE_ADMIN_URL": self.admin_url, "RESTATE_INGRESS_URL": self.ingress_url}


# --------------------------------------------------------------------------------------------------
# The handlers app


@dataclass
class AppServer:
    """The `python -m countersign serve` process, on fixed ports across restarts: the pages on `port`,
    the Restate endpoint on `restate_port` (RESTATE_ENDPOINT_BIND), unless `env` says `shared`."""

    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    """The variables given to start() (on top of os.environ; RESTATE_ENDPOINT_BIND is added at launch)."""
    cwd: Path
    log_path: Path
    restate_port: int
    sigterm_ignored: bool = field(default=False)
    """Set once a stop() had to fall back to SIGKILL."""
    own_restate_listener: ClassVar[bool] = True
    """False for stand-ins that serve their Restate endpoint on `port` (restate_port is then port)."""

    @classmethod
    def start(cls, *, env: dict[str, str], port: int | None = None, cwd: Path = REPO, log_path: Path) -> Self:
        first, second = _free_ports(2)
        if port is None:
            port, restate_port = first, second
        else:
            restate_port = second if second != port else first
        if cls.own_restate_listener and "RESTATE_ENDPOINT_BIND" in env:
            bind = env["RESTATE_ENDPOINT_BIND"]
            restate_port = port if bind == SHARED_LISTENER else _port_of(bind)
        elif not cls.own_restate_listener:
            restate_port = port
        app = cls(
            proc=_spawn(cls._command(port), env=cls._launch_env(env, restate_port), cwd=cwd, log_path=log_path),
            port=port,
            env=dict(env),
            cwd=cwd,
            log_path=log_path,
            restate_port=restate_port,
        )
        app._wait_ready()
        return app

    @staticmethod
    def _command(port: int) -> list[str]:
        return [sys.executable, "-m", "countersign", "serve", "--bind", f"127.0.0.1:{port}"]

    @staticmethod
    def _process_env(env: dict[str, str]) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", **env}

    @classmethod
    def _launch_env(cls, env: dict[str, str], restate_port: int) -> dict[str, str]:
        if cls.own_restate_listener:
            env = {"RESTATE_ENDPOINT_BIND": f"127.0.0.1:{restate_port}", **env}
        return cls._process_env(env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def restate_uri(self) -> str:
        return f"http://127.0.0.1:{self.restate_port}/restate"

    def _wait_ready(self) -> None:
        _wait_ready(
            self.proc,
            name="handlers app",
            checks=[
                lambda: _http_get_ok(f"{self.url}/healthz"),
                # The two listeners start together; registering needs the Restate one.
                *([lambda: _http_get_ok(f"{self.restate_uri}/health")] if self.restate_port != self.port else []),
            ],
            what=f"{self.url}/healthz and {self.restate_uri}/health",
            timeout=APP_START_TIMEOUT,
            log_path=self.log_path,
            stop_grace=APP_STOP_GRACE,
        )

    def stop(self, grace: float = APP_STOP_GRACE) -> None:
        """SIGTERM; if the app is still running after `grace` s, SIGKILL and set sigterm_ignored."""
        if not _stop_process(self.proc, grace, "handlers app"):
            self.sigterm_ignored = True

    def kill9(self) -> None:
        """SIGKILL the app and anything in its process group at once (a crash). Idempotent."""
        _kill_group_and_reap(self.proc)

    def alive(self) -> bool:
        return not _exited(self.proc)

    def restart(self) -> None:
        """Stop if running, then start again on the same port with the same env."""
        self.stop()
        ports = sorted({self.port, self.restate_port})
        wait_until(lambda: all(map(port_is_free, ports)), PORT_RELEASE_TIMEOUT, f"ports {ports} to be released")
        self.proc = _spawn(
            self._command(self.port),
            env=self._launch_env(self.env, self.restate_port),
            cwd=self.cwd,
            log_path=self.log_path,
        )
        self._wait_ready()


# --------------------------------------------------------------------------------------------------
# Ingress client


class Ingress:
    """A small client for the restate ingress (AgentRun workflow calls).

    Given the app's COUNTERSIGN_JOURNAL_KEYS, it seals request bodies and opens successful answers,
    as any client of a journal-encrypting endpoint must; answers keep their status and headers.
    """

    def __init__(self, ingress_url: str, journal_keys: str | None = None) -> None:
        self.client = httpx.Client(base_url=ingress_url, timeout=30.0, trust_env=False)
        self.codec = JournalCipher(parse_journal_keys(journal_keys)) if journal_keys else None

    def _sealed(self, body: object) -> bytes:
        raw = json.dumps(body).encode()
        return self.codec.encode(raw) if self.codec else raw

    def _opened(self, response: httpx.Response) -> httpx.Response:
        if self.codec is None or not response.is_success:
            return response
        stale = ("content-length", "content-encoding")
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in stale]
        return httpx.Response(
            response.status_code, headers=headers, content=self.codec.open(response.content), request=response.request
        )

    def post_json(self, path: str, body: object, headers: dict[str, str] | None = None) -> httpx.Response:
        headers = {"content-type": "application/json", **(headers or {})}
        return self.client.post(path, content=self._sealed(body), headers=headers)

    def __enter__(self) -> Ingress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start_run(self, run_id: str, task: dict[str, Any]) -> httpx.Response:
        """Start AgentRun `run_id` without waiting (202 Accepted / PreviouslyAccepted)."""
        return self.post_json(f"/AgentRun/{run_id}/run/send", task)

    def call(
        self, service: str, key: str | None, handler: str, body: object | None, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """Call a handler and wait for its answer; `body` None sends no body; `headers` e.g. an idempotency-key."""
        path = f"/{service}/{handler}" if key is None else f"/{service}/{key}/{handler}"
        if body is None:
            return self._opened(self.client.post(path, headers=headers))
        return self._opened(self.post_json(path, body, headers))

    def send(self, service: str, key: str | None, handler: str, body: object) -> str:
        """Start any handler without waiting; its invocation id."""
        path = f"/{service}/{handler}/send" if key is None else f"/{service}/{key}/{handler}/send"
        response = self.post_json(path, body)
        response.raise_for_status()
        return str(response.json()["invocationId"])

    def wait_invocation(self, invocation_id: str, timeout: float = 30.0) -> httpx.Response:
        """Poll an invocation's output until it has completed, and return that response."""

        def done() -> httpx.Response | None:
            response = self._opened(self.client.get(f"/restate/invocation/{invocation_id}/output"))
            return None if response.status_code == 470 else response

        return wait_until(done, timeout, f"invocation {invocation_id} to complete", interval=0.1)

    def output(self, run_id: str) -> httpx.Response:
        """The run's output now; 470 while it has not completed."""
        return self._opened(self.client.get(f"/restate/workflow/AgentRun/{run_id}/output"))

    def attach(self, run_id: str, timeout: float = 60.0) -> httpx.Response:
        """Block (up to `timeout` s) until the run completes, and return its output."""
        return self._opened(self.client.get(f"/restate/workflow/AgentRun/{run_id}/attach", timeout=timeout))

    def status(self, run_id: str) -> dict[str, Any]:
        """The AgentRun `status` shared handler's answer."""
        response = self._opened(self.client.post(f"/AgentRun/{run_id}/status"))
        response.raise_for_status()
        return cast(dict[str, Any], response.json())

    def wait_output(self, run_id: str, timeout: float = 30.0) -> httpx.Response:
        """Poll `output` until it is no longer 470 (not completed yet), and return that response."""
        return self.wait_output_of("AgentRun", run_id, timeout)

    def wait_output_of(self, workflow: str, key: str, timeout: float = 30.0) -> httpx.Response:
        """Poll a workflow's output until it is no longer 470 (not completed yet), and return it."""

        def done() -> httpx.Response | None:
            response = self._opened(self.client.get(f"/restate/workflow/{workflow}/{key}/output"))
            return None if response.status_code == 470 else response

        return wait_until(done, timeout, f"{workflow} {key} to complete", interval=0.1)

    def close(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------------------------------
# A whole stack (used by the conftest fixtures)


def make_app_env(*, ingress_url: str, outbox_dir: Path, db_path: Path, admin_url: str | None = None) -> dict[str, str]:
    """The handlers app's environment for tests, with a fresh signing key and journal key, serving the
    demo tools by name (outside dev, as in production, the app serves no tools it was not given).
    The demo is this repository's (handlers/demo), not the library's: the checkout is on PYTHONPATH,
    after the folder the app runs in, as a deployment puts its own code beside the installed library."""
    return {
        **({"RESTATE_ADMIN_URL": admin_url} if admin_url else {}),
        "COUNTERSIGN_TOOLS": DEMO_TOOLS,
        "PYTHONPATH": str(REPO),
        "RESTATE_INGRESS_URL": ingress_url,
        "APPROVALS_SIGNING_KEYS": "k1:" + secrets.token_urlsafe(32),
        "COUNTERSIGN_JOURNAL_KEYS": "j1:" + base64.b64encode(secrets.token_bytes(32)).decode(),
        "APPROVALS_OUTBOX_DIR": str(outbox_dir),
        "DEMO_DB": str(db_path),
        "COUNTERSIGN_ENV": "test",
    }


USER_CODE = REPO / "tests" / "support" / "user_code"
"""The users' own code the integration tests serve beside Countersign: one package per user
(`myshop`, `plandesk`, ...), each module saying which tests serve it. The folder is the app's PYTHONPATH,
as a deployment puts its own code first (`user_services`); the checkout stays importable as the folder
the app runs in. Apart from tests/support/user_project, whose `handlers` package would shadow this
checkout's on the same path."""


def user_services(services: str) -> dict[str, str]:
    """The app's settings serving a user's own services from USER_CODE: `services` is the value of
    COUNTERSIGN_SERVICES (`myshop.agents:served`), and USER_CODE is the app's PYTHONPATH."""
    return {"COUNTERSIGN_SERVICES": services, "PYTHONPATH": str(USER_CODE)}


def start_registered_app(
    restate: RestateServer, *, env: dict[str, str], log_path: Path, http1: bool = False
) -> AppServer:
    """Start the app on a free port (APPROVALS_PUBLIC_URL = its own URL, accepting only requests
    signed by `restate`'s identity key unless `env` says otherwise) and register it with `restate`
    (over HTTP/1.1, request/response, if `http1`; else HTTP/2, bidirectional)."""
    port = free_port()
    app_env = {"RESTATE_IDENTITY_KEYS": restate.identity_key, **env, "APPROVALS_PUBLIC_URL": f"http://127.0.0.1:{port}"}
    app = AppServer.start(env=app_env, port=port, log_path=log_path)
    try:
        restate.register(app.restate_uri, http1=http1)
    except BaseException:
        app.stop()
        raise
    restate.journal_keys = app_env.get("COUNTERSIGN_JOURNAL_KEYS", "")
    return app


@dataclass
class IsolatedStack:
    """A private restate-server + app pair (for tests that kill processes)."""

    restate: RestateServer
    app: AppServer
    ingress: Ingress
    env: dict[str, str]
    """The app's environment (as given to AppServer.start)."""
    outbox_dir: Path
    db_path: Path


class StackFactory(Protocol):
    """The `isolated_stack` fixture: call it to get a fresh, registered stack."""

    def __call__(
        self, *, restate_env: dict[str, str] | None = None, app_env: dict[str, str] | None = None, http1: bool = False
    ) -> IsolatedStack: ...

"""`python -m countersign dev`: the whole local stack in one command.

Guarantee: starts restate-server (the pinned npm binary, `restate.toml`, data in `.restate/` of the
folder it runs in, as `.outbox/` and `.demo/` are), serves the pages on 127.0.0.1:9080 and the Restate
endpoint on RESTATE_ENDPOINT_BIND (127.0.0.1:9081, its own listener, as `serve` does), registers it,
and on Ctrl-C or SIGTERM stops everything it
started, by PID. Every wait is bounded; a busy port or a missing binary is a one-line error. Dev is
protected like production: restate-server signs its requests with a generated ed25519 key that the
handlers require, and journal values are sealed with a generated key (all kept in `.restate/`).
Every operator command run from the same folder finds that journal key when `COUNTERSIGN_JOURNAL_KEYS`
is not set (`journal_keys`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from countersign.runtime import startup
from countersign.runtime.server import listeners, serve
from countersign.security import identity
from countersign.security.codec import JournalCipher, JournalValueUnreadable, journal_codec
from countersign.settings import SHARED_LISTENER, Settings, get_settings, parse_journal_keys

REPO = Path(__file__).resolve().parents[2]
# Relative, like the outbox and demo database defaults: resolved against the folder the command runs in.
DATA_DIR = Path(".restate")
IDENTITY_PEM = DATA_DIR / "identity_private.pem"
DEV_JOURNAL_KEYS = DATA_DIR / "dev-journal-keys"
INGRESS, ADMIN, HANDLERS = "127.0.0.1:8080", "127.0.0.1:9070", "127.0.0.1:9080"
DEMO_GOAL = "Refund order 1042 for $612.40"
NO_JOURNAL_KEYS = (
    "COUNTERSIGN_JOURNAL_KEYS is not set (and there is no dev stack key in .restate/ here: "
    "run from the folder `python -m countersign dev` runs in, or set the handlers' keys)"
)


NOT_A_CHECKOUT = (
    "`python -m countersign dev` runs from a source checkout of Countersign (it needs the checkout's "
    "restate.toml and the restate-server that `npm ci` pins): run scripts/dev there. An installed wheel "
    "runs `python -m countersign serve` next to a restate-server of your own (docs/getting-started.md)"
)


def restate_config() -> Path:
    """The checkout's `restate.toml`; the process stops with one line when this is not a checkout."""
    config = REPO / "restate.toml"
    if not (config.is_file() and (REPO / "package.json").is_file()):
        raise SystemExit(NOT_A_CHECKOUT)
    return config


def restate_binary(name: str = "restate-server") -> Path:
    restate_config()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower(), "")
    system = platform.system().lower()
    package = "restate-server" if name == "restate-server" else "restate"
    path = REPO / "node_modules" / "@restatedev" / f"{package}-{system}-{arch}" / "bin" / name
    if not path.exists():
        raise SystemExit(f"{name} not found at {path}: run `npm ci` in {REPO}")
    return path


def _port_free(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


def _dev_secret(name: str, make: str) -> str:
    """A generated value kept (owner-only) in `.restate/<name>`, the same on every start."""
    path = DATA_DIR / name
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(make + "\n")
    return path.read_text(encoding="utf-8").strip()


def dev_journal_keys() -> str:
    return _dev_secret(DEV_JOURNAL_KEYS.name, "dev1:" + base64.b64encode(os.urandom(32)).decode())


def journal_keys(settings: Settings) -> dict[str, bytes]:
    """The keys an operator command opens journal values with: `COUNTERSIGN_JOURNAL_KEYS`, else the dev
    stack's generated key in `.restate/` (never created here), else none."""
    if settings.countersign_journal_keys or not DEV_JOURNAL_KEYS.exists():
        return settings.countersign_journal_keys
    try:
        return parse_journal_keys(DEV_JOURNAL_KEYS.read_text(encoding="utf-8").strip())
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"COUNTERSIGN_JOURNAL_KEYS is not set and {DEV_JOURNAL_KEYS.resolve()} is unusable: {exc}"
        ) from None


def _wait_ok(url: str, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"restate-server exited with {proc.returncode}; see {DATA_DIR / 'restate-server.log'}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout}s waiting for {url}")


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def run_dev(demo: bool) -> int:
    # Before anything is written to the folder: from an installed wheel there is nothing to start.
    config, binary = restate_config(), restate_binary()
    os.environ.setdefault("COUNTERSIGN_ENV", "dev")
    signing = _dev_secret("dev-signing-keys", f"dev1:{secrets.token_urlsafe(32)}")
    os.environ.setdefault("APPROVALS_SIGNING_KEYS", signing)
    os.environ.setdefault("COUNTERSIGN_JOURNAL_KEYS", dev_journal_keys())
    os.environ.setdefault("RESTATE_IDENTITY_KEYS", identity.ensure_key_pair(IDENTITY_PEM))
    os.environ.setdefault("APPROVALS_PUBLIC_URL", f"http://{HANDLERS}")
    os.environ.setdefault("RESTATE_INGRESS_URL", f"http://{INGRESS}")
    # After every default above: get_settings() reads the environment once.
    busy = [a for a in (INGRESS, ADMIN, HANDLERS, _endpoint_bind(), "127.0.0.1:5122") if not _port_free(a)]
    if busy:
        raise SystemExit(f"ports already in use: {', '.join(busy)} (is another dev stack running?)")
    settings = get_settings()
    startup.configure_logging(settings)
    startup.check(settings)

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    with open(DATA_DIR / "restate-server.log", "ab") as log:
        server = subprocess.Popen(
            [
                str(binary),
                "--config-file",
                str(config),
                "--base-dir",
                str(DATA_DIR),
                "--no-logo",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, identity.PRIVATE_KEY_ENV: str(IDENTITY_PEM)},
        )
    try:
        _wait_ok(f"http://{ADMIN}/health", server, 30)
        _wait_ok(f"http://{INGRESS}/restate/health", server, 30)
        asyncio.run(_serve_and_register(demo))
    finally:
        _stop(server)
        print("dev stack stopped")
    return 0


def _endpoint_bind() -> str:
    """Where the Restate endpoint listens (RESTATE_ENDPOINT_BIND; `shared`: on the pages' port)."""
    bind = get_settings().restate_endpoint_bind
    return HANDLERS if bind == SHARED_LISTENER else bind


async def _serve_and_register(demo: bool) -> None:
    stop = asyncio.Event()
    serving = asyncio.create_task(serve(*listeners(get_settings(), HANDLERS), stop=stop))
    async with httpx.AsyncClient(timeout=10) as client:
        deadline = time.monotonic() + 20
        while True:
            if serving.done():
                await serving
                return
            try:
                if (await client.get(f"http://{HANDLERS}/healthz")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                stop.set()
                raise SystemExit("handlers did not come up within 20 s")
            await asyncio.sleep(0.1)
        reply = await client.post(
            f"http://{ADMIN}/deployments", json={"uri": f"http://{_endpoint_bind()}/restate", "force": True}
        )
        if reply.status_code >= 300:
            stop.set()
            raise SystemExit(f"registering the handlers failed: {reply.status_code} {reply.text}")
        print(_banner())
        if demo:
            run_id = f"demo-{secrets.token_hex(3)}"
            task = json.dumps({"goal": DEMO_GOAL, "requester": "alice@example.com"}).encode()
            codec = journal_codec(get_settings())
            sent = await client.post(
                f"http://{INGRESS}/AgentRun/{run_id}/run/send",
                content=codec.encode(task) if codec else task,
                headers={"content-type": "application/json"},
            )
            print(f"started demo run {run_id}: {sent.status_code}; its approval link is logged below")
    await serving


def _banner() -> str:
    task = json.dumps({"goal": DEMO_GOAL, "requester": "alice@example.com"})
    settings = get_settings()
    return f"""
Countersign dev stack is up (Ctrl-C stops everything).
  ingress   http://{INGRESS}     admin http://{ADMIN}
  pages     http://{HANDLERS}     Restate endpoint http://{_endpoint_bind()}/restate
  outbox    {settings.approvals_outbox_dir}/     demo database {settings.demo_db}
Start a run:
  curl -s -X POST http://{INGRESS}/AgentRun/refund-1/run/send -H 'content-type: application/json' -d '{task}'
Approval links are logged below as emails are written. Results and state are sealed (journal encryption);
read them with:
  curl -s http://{INGRESS}/restate/workflow/AgentRun/refund-1/output | .venv/bin/python -m countersign decode
"""


def decode_stdin() -> int:
    """`python -m countersign decode`: print the value on stdin, opened with the journal keys."""
    keys = journal_keys(get_settings())
    if not keys:
        raise SystemExit(NO_JOURNAL_KEYS)
    try:
        opened = JournalCipher(keys).open(sys.stdin.buffer.read().strip())
    except JournalValueUnreadable as exc:
        hint = "" if "COUNTERSIGN_JOURNAL_KEYS" in str(exc) else " (is COUNTERSIGN_JOURNAL_KEYS the handlers' key?)"
        raise SystemExit(f"{exc}{hint}") from None
    sys.stdout.buffer.write(opened + b"\n")
    return 0

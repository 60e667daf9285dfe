"""Operator commands find the dev stack's journal key the way `decode` does, and a missing or wrong key
is one line naming COUNTERSIGN_JOURNAL_KEYS (exit 1), never a traceback and never a write."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from support.approver import wait_for_email
from support.business import new_order
from support.processes import IsolatedStack, StackFactory

READS = [["pending"], ["show", "{run}"], ["stats"], ["audit", "export"]]


def operator(stack: IsolatedStack, cwd: Path, *args: str, keys: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m countersign ...` as an operator runs it from `cwd`: no journal keys unless given."""
    env = {
        "RESTATE_INGRESS_URL": stack.restate.ingress_url,
        "RESTATE_ADMIN_URL": stack.restate.admin_url,
        "PATH": "/usr/bin:/bin",
    }
    if keys is not None:
        env["COUNTERSIGN_JOURNAL_KEYS"] = keys
    return subprocess.run(
        [sys.executable, "-m", "countersign", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture()
def dev_folder(tmp_path: Path) -> tuple[Path, str]:
    """A folder where the dev stack has written its journal key (by devstack's own code), and that key."""
    folder = tmp_path / "checkout"
    folder.mkdir()
    made = subprocess.run(
        [sys.executable, "-c", "from countersign.runtime.devstack import dev_journal_keys; print(dev_journal_keys())"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert (folder / ".restate" / "dev-journal-keys").exists()
    return folder, made.stdout.strip()


@pytest.fixture()
def waiting_run(private_stacks: StackFactory, dev_folder: tuple[Path, str]) -> tuple[IsolatedStack, str]:
    """A stack whose handlers seal the journal with the dev key, and a run waiting for approval."""
    stack = private_stacks(app_env={"COUNTERSIGN_JOURNAL_KEYS": dev_folder[1]})
    order = new_order(stack.db_path, 70000)
    step = {"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "700.00", "reason": "late"}}
    stack.ingress.start_run("keys-1", {"goal": "refund", "requester": "alice@example.com", "script": [step]})
    wait_for_email(stack.outbox_dir, "keys-1")
    return stack, "keys-1"


def test_operator_commands_use_the_dev_stack_key(
    waiting_run: tuple[IsolatedStack, str], dev_folder: tuple[Path, str]
) -> None:
    stack, run = waiting_run
    folder = dev_folder[0]
    pending = operator(stack, folder, "pending", "--json")
    assert pending.returncode == 0, pending.stderr
    assert [row["approval_id"] for row in json.loads(pending.stdout)] == [f"{run}-a0"]
    show = operator(stack, folder, "show", run, "--json")
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["approvals"][0]["state"] == "pending"
    stats = operator(stack, folder, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert isinstance(json.loads(stats.stdout), list)
    export = operator(stack, folder, "audit", "export")
    assert export.returncode == 0, export.stderr
    assert json.loads(export.stdout.splitlines()[0])["kind"] == "requested"


def one_line_naming_the_keys(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "COUNTERSIGN_JOURNAL_KEYS" in line, line
    return line


def test_a_missing_or_wrong_key_is_one_line_and_writes_nothing(
    waiting_run: tuple[IsolatedStack, str], tmp_path: Path
) -> None:
    stack, run = waiting_run
    elsewhere = tmp_path / "elsewhere"  # no .restate/ here
    elsewhere.mkdir()
    random_key = base64.b64encode(secrets.token_bytes(32)).decode()
    attempts = {
        "missing": None,
        "wrong key, same id": f"dev1:{random_key}",
        "unknown key id": f"j9:{random_key}",
    }
    for what, keys in attempts.items():
        for command in [*READS, ["cancel", "{run}", "--reason", "stop"]]:
            args = [arg.format(run=run) for arg in command]
            line = one_line_naming_the_keys(operator(stack, elsewhere, *args, keys=keys))
            assert "sealed" in line or "key" in line, (what, args, line)
    # The refused cancels did not reach the run.
    assert stack.ingress.status(run)["approvals"][0]["state"] == "pending"


def test_decode_names_the_setting_for_a_wrong_key(waiting_run: tuple[IsolatedStack, str], tmp_path: Path) -> None:
    stack, run = waiting_run
    sealed = stack.ingress.client.post(f"/AgentRun/{run}/status").content
    done = subprocess.run(
        [sys.executable, "-m", "countersign", "decode"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "COUNTERSIGN_JOURNAL_KEYS": "dev1:" + base64.b64encode(bytes(32)).decode()},
        input=sealed.decode(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert "COUNTERSIGN_JOURNAL_KEYS" in line and "Traceback" not in done.stderr


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """`... | python -m countersign decode | head -c 10`: the reader goes away with most of the output
    unread; the command ends quietly (exit 1), as Unix tools do, whatever it was printing."""
    value = json.dumps({"pad": "x" * 1_000_000}).encode()  # far more than a pipe holds
    child = subprocess.Popen(
        [sys.executable, "-m", "countersign", "decode"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "COUNTERSIGN_JOURNAL_KEYS": "k1:" + base64.b64encode(bytes(32)).decode()},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    child.stdin.write(value)
    child.stdin.close()
    assert child.stdout.read(10) == value[:10]
    child.stdout.close()
    try:
        assert child.wait(timeout=60) == 1
    finally:
        child.kill()
    errors = child.stderr.read().decode()
    child.stderr.close()
    assert errors == "", errors

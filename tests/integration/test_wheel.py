"""The built wheel, installed (not editable) into a fresh venv and run from a folder outside the checkout:
a user's own serverless project, whose code sits in a `handlers/` package first on `sys.path` (as AWS
Lambda lays it out), served with the `countersign` console script: it serves the user's tool on the
pages and the Restate endpoint, renders emails from its packaged templates and serves with the
packaged hypercorn limits. The wheel is built the way the Dockerfile builds it: from exactly
the paths its build stage copies, with `pip wheel --no-deps`, then installed with `-c requirements.lock`.

Slow (a venv and an install): marked `wheel`, run once by `scripts/test` with the rest of the suite.
"""

from __future__ import annotations

import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path
from typing import ClassVar

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from support.approver import submit, wait_for_email
from support.processes import REPO, AppServer, Ingress, RestateServer, free_port, make_app_env

pytestmark = pytest.mark.wheel
PIP_TIMEOUT = 600


USER_PROJECT = REPO / "tests" / "support" / "user_project"


class InstalledApp(AppServer):
    """`countersign serve`: the console script the wheel installed, instead of this interpreter."""

    python: ClassVar[str] = ""

    @classmethod
    def _command(cls, port: int) -> list[str]:
        assert cls.python, "set InstalledApp.python to the venv's interpreter first"
        return [str(Path(cls.python).parent / "countersign"), "serve", "--bind", f"127.0.0.1:{port}"]


def pip(*args: str, python: str = sys.executable) -> None:
    """This interpreter's pip (the local pip config: find-links, cache), acting on `python`'s venv."""
    command = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def wheel_stage_sources() -> list[str]:
    """The build-context paths the Dockerfile's wheel stage copies."""
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    stage = lines[lines.index("FROM python:3.11-slim AS wheel") + 1 :]
    stage = stage[: next(i for i, line in enumerate(stage) if line.startswith("FROM "))]
    return [src for line in stage if line.startswith("COPY ") for src in line.split()[1:-1]]


def tracked_files(under: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", under],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [path for path in listed.stdout.splitlines() if (REPO / path).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of what the Dockerfile's build stage copies (no stale build/ dir)."""
    context = tmp_path_factory.mktemp("context")
    for src in wheel_stage_sources():
        for path in tracked_files(src):
            (context / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, context / path)
    dist = tmp_path_factory.mktemp("dist")
    pip("wheel", "--no-deps", "--wheel-dir", str(dist), str(context))
    [built] = dist.glob("countersign_approvals-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no pip of its own: this interpreter's pip installs into it) with the wheel installed."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    pip("install", "-c", str(REPO / "requirements.lock"), str(wheel), python=str(python))
    return python


def test_the_wheel_carries_every_module_and_the_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {path for path in tracked_files("countersign") if path.endswith(".py")}
    assert modules and not modules - names, f"missing from the wheel: {sorted(modules - names)}"
    templates = {f"countersign/mail/{path}" for path in tracked_files("email_templates")}
    assert templates and not templates - names, f"missing from the wheel: {sorted(templates - names)}"
    assert "countersign/runtime/hypercorn.toml" in names
    pages = set(tracked_files("countersign/web/templates"))
    assert pages and pages <= names


def h2_settings_of(port: int, timeout: float = 10.0) -> dict[int, int]:
    """The SETTINGS the server sends first on an HTTP/2 (prior knowledge) connection, as Restate connects."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(connection.data_to_send())
        while time.monotonic() < deadline:
            data = sock.recv(65535)
            assert data, "the server closed the HTTP/2 connection before sending its SETTINGS"
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    return {int(key): change.new_value for key, change in event.changed_settings.items()}
    raise TimeoutError("no SETTINGS frame from the server")


def test_the_installed_wheel_serves_one_approval_from_outside_the_checkout(
    venv: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # What a deployment has: the user's own project (its `handlers/` package first on sys.path), no
    # source tree of Countersign's, no email_templates/.
    folder = tmp_path / "deploy"
    shutil.copytree(USER_PROJECT, folder, ignore=shutil.ignore_patterns("__pycache__"))
    probe = (
        "import countersign, countersign.mail.render as r, handlers; from countersign import Tool; "
        "print(countersign.__file__, r.template_dir(), handlers.__file__)"
    )
    located = subprocess.run(
        [str(venv), "-c", probe],
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(folder)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    package, templates, users = located.stdout.split()
    site = str(venv.parent.parent)
    assert package.startswith(site) and templates.startswith(site), located.stdout
    assert users == str(folder / "handlers" / "__init__.py"), "the user's own handlers/ is theirs"
    usage = subprocess.run(
        [str(venv.parent / "countersign"), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    for command in ("serve", "dev", "pending", "show", "cancel", "reassign", "inbox", "stats", "audit", "decode"):
        assert command in usage.stdout, (command, usage.stdout)

    restate = RestateServer.start(tmp_path_factory.mktemp("restate-wheel"))
    try:
        port = free_port()
        env = {
            **make_app_env(
                ingress_url=restate.ingress_url, outbox_dir=folder / "outbox", db_path=folder / "business.db"
            ),
            "RESTATE_IDENTITY_KEYS": restate.identity_key,
            "APPROVALS_PUBLIC_URL": f"http://127.0.0.1:{port}",
            "PYTHONPATH": str(folder),
            "COUNTERSIGN_TOOLS": "handlers.tools:TOOLS",
            "PAYMENTS_DB": str(folder / "payments.db"),
        }
        InstalledApp.python = str(venv)
        app = InstalledApp.start(env=env, port=port, cwd=folder, log_path=tmp_path / "app.log")
        try:
            # The packaged limits are in force on the Restate listener: hypercorn's default would
            # advertise 100 streams (and so does the public listener, on purpose).
            packaged = tomllib.loads((site_packages(venv) / "countersign" / "runtime" / "hypercorn.toml").read_text())
            limit = packaged["restate"]["h2_max_concurrent_streams"]
            assert h2_settings_of(app.restate_port)[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == limit
            assert limit == 2147483647

            restate.register(app.restate_uri)
            ingress = Ingress(restate.ingress_url, env["COUNTERSIGN_JOURNAL_KEYS"])
            try:
                step = {"tool": "pay_invoice", "args": {"invoice_id": "inv_1001", "amount_usd": "700.00"}}
                task = {"goal": "pay the invoice", "requester": "alice@example.com", "script": [step]}
                assert ingress.start_run("wheel-1", task).status_code == 202
                [mail] = wait_for_email(folder / "outbox", "wheel-1", timeout=30)
                assert "pay_invoice" in mail.text and "<html" in mail.html.lower()
                assert mail.link.startswith(app.url)
                assert submit(mail.link, "approve").status_code == 200
                result = ingress.wait_output("wheel-1", timeout=60).json()
                assert result["status"] == "completed" and result["actions"][0]["outcome"] == "approved"
                with sqlite3.connect(folder / "payments.db") as db:
                    paid = db.execute("SELECT idempotency_key, invoice_id, cents FROM payments").fetchall()
                assert paid == [("wheel-1/0", "inv_1001", 70000)]
            finally:
                ingress.close()
        finally:
            app.stop()
    finally:
        restate.stop()
    assert not (folder / "email_templates").exists() and not (folder / "hypercorn.toml").exists()


def test_dev_from_the_installed_wheel_says_it_needs_a_checkout_and_writes_nothing(venv: Path, tmp_path: Path) -> None:
    # The dev stack starts the checkout's pinned restate-server with its restate.toml; neither is in the
    # wheel. A new user who tries it gets one line that says where it runs instead, and an untouched folder.
    done = subprocess.run(
        [str(venv), "-m", "countersign", "dev"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("`python -m countersign dev` runs from a source checkout"), done.stderr
    assert "run scripts/dev there" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert list(tmp_path.iterdir()) == [], "nothing written: no .restate/ keys, no .outbox/"


def site_packages(python: Path) -> Path:
    return python.parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"

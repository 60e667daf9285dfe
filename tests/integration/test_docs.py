"""The documentation does what it says: every Python snippet in README.md and docs/ runs, the
generated reference refuses an undocumented setting, the services and routes tables name what the
code serves, and the getting-started tutorial's shell steps work against a real restate-server.

A Python snippet is run as a module of its own, in a fresh interpreter (a tool or service defined
at import is enough to catch most drift); one that defines `TOOLS` or `services` is then built into
the app with `create_app`, which loads and checks them as `serve` does. A snippet that cannot run
outside a deployment is marked, on the line before its fence, `<!-- snippet: not run: <why> -->`;
one that needs settings of its own names them there, `<!-- snippet: env: NAME=value ... -->`.
"""

from __future__ import annotations

import email
import email.policy
import functools
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from support.processes import REPO, StackFactory, wait_until

DOCS = REPO / "docs"
PAGES = sorted([REPO / "README.md", *DOCS.rglob("*.md")])
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!-- snippet: not run: (.+?) -->\s*$")
ENV = re.compile(r"<!-- snippet: env: (.+?) -->\s*$")


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int
    language: str
    info: str
    code: str
    skipped: str | None
    env: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def snippets(language: str) -> list[Snippet]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group(1) != language:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            skipped = NOT_RUN.search(before)
            env = ENV.search(before)
            variables = dict(item.split("=", 1) for item in env.group(1).split()) if env else {}
            line = text.count("\n", 0, match.start()) + 1
            found.append(
                Snippet(
                    page,
                    line,
                    language,
                    match.group(2),
                    match.group(3),
                    skipped.group(1) if skipped else None,
                    variables,
                )
            )
    return found


PYTHON = snippets("python")


def _reference() -> ModuleType:
    """docs/hooks/reference.py, the MkDocs hook that renders the generated reference parts."""
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Run in a fresh interpreter: create_app sets the process's tools, which must not leak into other tests.
CHECK = """
import runpy, sys
from countersign import Settings, create_app
module = runpy.run_path(sys.argv[1], run_name="snippet")
tools, services = module.get("TOOLS"), module.get("services")
if tools is not None or services is not None:
    settings = Settings(countersign_env="test", approvals_signing_keys={"k1": b"s" * 32})
    create_app(settings, services=list(services or []), tools=tools if tools is not None else None)
    print("served:", [t.name for t in tools or []], [s.name for s in services or []])
"""


def test_the_docs_have_python_snippets_and_each_marked_one_says_why() -> None:
    assert len(PYTHON) >= 5
    assert all(s.skipped is None or s.skipped.strip() for s in PYTHON)


@pytest.mark.parametrize("snippet", PYTHON, ids=lambda s: s.name)
def test_python_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    compile(snippet.code, snippet.name, "exec")  # even a snippet that is not run must be Python
    if snippet.skipped:
        pytest.skip(snippet.skipped)
    path = tmp_path / "snippet.py"
    path.write_text(snippet.code, encoding="utf-8")
    # As the docs' own set-up: the dev environment, where the demo's tools are the process's tools.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COUNTERSIGN_", "APPROVALS_", "RESTATE_"))}
    # The tutorial's module is there too (a snippet may import it), and a signing key, as in the tutorial.
    env.update({"COUNTERSIGN_ENV": "dev", "PYTHONPATH": str(REPO), "APPROVALS_SIGNING_KEYS": "k1:" + "s" * 32})
    env.update(snippet.env)
    (tmp_path / "payments.py").write_text(_python_titled("getting-started.md", "payments.py") + "\n")
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{snippet.name} failed:\n{done.stderr[-3000:]}"


def test_an_undocumented_setting_fails_the_reference() -> None:
    from pydantic import Field

    from countersign.settings import Settings

    class Drifted(Settings):
        new_knob: int = 3  # no description
        described: int = Field(default=1, description="documented")

    reference = _reference()
    with pytest.raises(reference.UndocumentedSetting, match="NEW_KNOB"):
        reference.settings_table(Drifted)
    table = reference.render("<!-- generated: settings -->")
    assert all(f"`{name.upper()}`" in table for name in Settings.model_fields)
    with pytest.raises(ValueError, match="unknown generated part"):
        reference.render("<!-- generated: nothing-like-this -->")


def test_the_cli_reference_has_every_command() -> None:
    text = _reference().render("<!-- generated: cli -->")
    for command in ("serve", "pending", "show", "reassign", "cancel", "inbox revoke", "audit verify", "decode"):
        assert f"### `countersign {command}`" in text


def _table_rows(page: Path, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header line starts with `header`, cells stripped."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_the_services_table_names_every_service_and_handler_the_endpoint_serves() -> None:
    """Each row names its service(s) and, in the handler column, its handlers (`A` / `B` rows pair
    them in order); a `Service.handler` written anywhere in the table counts for that service."""
    from countersign.runtime.services import countersign_services

    served = {(s.name, h) for s in countersign_services() for h in s.handlers}
    names = {s.name for s in countersign_services()}
    documented: set[tuple[str, str]] = set()
    current: list[str] = []
    for cells in _table_rows(DOCS / "reference" / "services.md", "| service |"):
        current = re.findall(r"`(\w+)`", cells[0]) or current
        groups = [re.findall(r"`(\w+)`", part) for part in cells[2].split(" / ")]
        pairs = (
            zip(current, groups, strict=True) if len(current) > 1 else ((current[0], list(itertools.chain(*groups))),)
        )
        documented |= {(service, handler) for service, handlers in pairs for handler in handlers}
        for service, handler in re.findall(r"`(\w+)\.(\w+)`", " ".join(cells)):
            if service in names:
                documented.add((service, handler))
    missing = served - documented
    unknown = documented - served
    assert not missing, f"served but not in docs/reference/services.md: {sorted(missing)}"
    assert not unknown, f"in docs/reference/services.md but not served: {sorted(unknown)}"


def test_the_routes_table_names_every_route_of_the_pages() -> None:
    from starlette.routing import Mount, Route

    from countersign.runtime.app import public_app
    from countersign.settings import Settings

    app = public_app(Settings(countersign_env="test", approvals_signing_keys={"k1": b"s" * 32}))
    routes = [(route, "") for route in app.routes]
    routes += [(inner, route.path) for route in app.routes if isinstance(route, Mount) for inner in route.routes]
    served = {
        (method, prefix + route.path)
        for route, prefix in routes
        if isinstance(route, Route)
        for method in route.methods or ()
    }
    documented = set()
    for cells in _table_rows(DOCS / "reference" / "services.md", "| route |"):
        spec = cells[0].replace("`", "")
        if spec.startswith("/restate"):
            continue
        methods, _, path = spec.rpartition(" ")
        for method in re.findall(r"[A-Z]+", methods):
            documented |= {(method, path), ("HEAD", path)} if method == "GET" else {(method, path)}
    assert served == documented


# --------------------------------------------------------------------------------------------------
# The tutorial, as a reader runs it


def _bash_after(page: str, heading: str) -> str:
    """The first bash block after `heading` on `page`."""
    text = (DOCS / page).read_text(encoding="utf-8").split(heading, 1)[1]
    return text.split("```bash\n", 1)[1].split("\n```", 1)[0]


def _python_titled(page: str, title: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    return text.split(f'```python title="{title}"\n', 1)[1].split("\n```", 1)[0]


def test_the_getting_started_tutorial_approves_a_payment_with_curl(
    private_stacks: StackFactory, tmp_path: Path
) -> None:
    """Steps 2, 5, 6 and 7 of docs/getting-started.md, as written, on a private restate-server (its
    ports put in place of the defaults): the tool and workflow served by name, a payment over the
    threshold asked, a POST without Origin refused (403), the same POST from the page's origin
    approved (200), and the workflow's output the approved record, its effect run once."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "payments.py").write_text(_python_titled("getting-started.md", "payments.py") + "\n")
    stack = private_stacks(
        app_env={
            "COUNTERSIGN_ENV": "dev",
            "COUNTERSIGN_JOURNAL_KEYS": "",  # as in the tutorial: no journal keys, plain JSON answers
            "COUNTERSIGN_TOOLS": "payments:TOOLS",
            "COUNTERSIGN_SERVICES": "payments:services",
            "PYTHONPATH": str(project),
        }
    )
    (project / ".outbox").symlink_to(stack.outbox_dir)
    ports = {"http://127.0.0.1:8080": stack.restate.ingress_url, "http://127.0.0.1:9080": stack.app.url}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def step(heading: str) -> str:
        script = _bash_after("getting-started.md", heading)
        for default, actual in ports.items():
            script = script.replace(default, actual)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=project, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{heading}: {done.stderr}"
        return done.stdout

    assert '"Accepted"' in step("## 5. Ask for a payment")

    def emails(pattern: str) -> list[Path] | None:
        return list(stack.outbox_dir.glob(pattern)) or None

    [request] = wait_until(functools.partial(emails, "approval-request_inv-1-a0_*.eml"), 30, "the approval email")
    # A workflow's own gated_call is worded as the workflow's request, not an agent's.
    text = email.message_from_bytes(request.read_bytes(), policy=email.policy.default).get_body(("plain",))
    assert text is not None and "A workflow working for alice@example.com" in str(text.get_content())
    assert step("## 6. Approve").split() == ["403", "200"]
    record = json.loads(step("## 7. The result"))
    assert record["outcome"] == "approved"
    assert record["approved_by"] == ["finance@example.com"]
    assert record["result"] == {"paid": "inv_1042", "idempotency_key": "inv-1/0"}
    assert record["args"] == {"invoice": "inv_1042", "amount": 612.4}
    # "The requester gets an outcome email and the approver a receipt."
    for pattern in ("approval-outcome_inv-1-a0_*.eml", "approval-receipt_inv-1-a0_*.eml"):
        wait_until(functools.partial(emails, pattern), 30, pattern)


def test_the_readmes_links_point_at_files_that_exist() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local and all((REPO / t).exists() for t in local), [t for t in local if not (REPO / t).exists()]

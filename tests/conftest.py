"""Pytest fixtures: one restate-server and one handlers app per session, plus private stacks.

Guarantee: every process a fixture starts is stopped by that fixture's teardown, in reverse
order of starting, whether or not the test passed (see support.processes for how). The tests of the
modules in BOTH_PROTOCOLS that use the session stack (`restate_server`, `app_server`, ...) or
`isolated_stack` run twice: with the deployment registered over HTTP/2 (bidirectional streaming) and
over HTTP/1.1 (request/response, as serverless platforms invoke it); all other tests run over HTTP/2.
The same tests of the modules in REPLAY_TORTURE run a third time, over HTTP/2 under replay torture
(`http2+replay`). Each protocol gets its own session stack, so nothing one mode left behind (workflow
keys, demo rows) is seen by another.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from uuid import uuid4

import pytest
from support.processes import (
    ALWAYS_REPLAY,
    DEPLOYMENT_PROTOCOLS,
    AppServer,
    Ingress,
    IsolatedStack,
    RestateServer,
    StackFactory,
    make_app_env,
    restate_env_of,
    start_registered_app,
)

from countersign.settings import Settings
from countersign.tools import DEMO_TOOLS, use_tools

BOTH_PROTOCOLS = frozenset(
    {
        "test_approval_flow",
        "test_approval_semantics",
        "test_ask_person",
        "test_checkpoints",
        "test_deadline_and_refusals",
        "test_durability",
        "test_gate_library",
        "test_plan_flow",
        "test_models_replay",
        "test_observability",
        "test_operations",
        "test_security_ingress",
        "test_own_tools",
        "test_openai_agents",
        "test_langchain",
        "test_adk",
        "test_pydantic_ai",
        "test_serverless",
        "test_standing_approvals",
        "test_webhooks",
    }
)
"""Modules whose runs pause, resume and replay in the handler, where request/response differs from a
stream (every step ends an attempt and the next one replays the journal). The others check the web
tier, the security of pages, links and the journal codec, or the browser: the protocol does not
change what they check, and running them twice would double the suite's time for nothing."""

REPLAY_TORTURE = frozenset(
    {
        "test_approval_flow",
        "test_approval_semantics",
        "test_durability",
        "test_gate_library",
        "test_races",
        "test_openai_agents",
        "test_pydantic_ai",
        "test_plan_flow",
        "test_checkpoints",
        "test_slack_channel",
        "test_gate_path",
        "test_langchain",
        "test_adk",
        "test_ask_person",
        "test_standing_approvals",
    }
)
"""Modules whose protocol-parametrised tests also run under replay torture (`http2+replay`): the
approval, durability, race and adapter flows, where non-deterministic handler code would show. Only
over HTTP/2: over HTTP/1.1 every await the handler blocks on already ends the request and replays
the journal on resume, so that mode needs no torture of its own."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "deployment_protocol" in metafunc.fixturenames:
        module = metafunc.module.__name__.rsplit(".", 1)[-1]
        protocols = ["http2", "http1.1"] if module in BOTH_PROTOCOLS else ["http2"]
        if module in REPLAY_TORTURE and os.environ.get(ALWAYS_REPLAY) != "1":
            protocols.append("http2+replay")
        # Session scope: pytest runs all tests of one protocol before switching to the next.
        metafunc.parametrize("deployment_protocol", protocols, indirect=True, scope="session")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep a set-up that is shared across tests in one worker when pytest-xdist spreads the suite
    over several (`scripts/test` does, with `--dist loadgroup`): the tests of a module that share a
    module-scoped stack (one group per protocol, so a module's two halves still run side by side),
    and the browser tests, which share one Chromium. Every other test may run in any worker; each
    worker starts its own session stack per protocol."""
    for item in items:
        group = _shared_setup(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _shared_setup(item: pytest.Item) -> str | None:
    if item.path.parent.name == "browser":
        return "browser"
    fixtures = getattr(item, "_fixtureinfo", None)
    definitions = fixtures.name2fixturedefs.values() if fixtures is not None else ()
    if any(definition.scope == "module" for chain in definitions for definition in chain):
        callspec = getattr(item, "callspec", None)
        protocol = callspec.params.get("deployment_protocol", "") if callspec is not None else ""
        return f"{item.path.stem}[{protocol}]" if protocol else item.path.stem
    return None


@pytest.fixture(scope="session")
def deployment_protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--always-replay",
        action="store_true",
        help="replay torture: every restate-server the tests start suspends at every await and replays "
        "the journal on resume (inactivity timeout 0 s), which exposes non-deterministic handler code",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--always-replay"):
        os.environ[ALWAYS_REPLAY] = "1"


def pytest_report_header(config: pytest.Config) -> str | None:
    return "replay torture: restate inactivity timeout 0s" if os.environ.get(ALWAYS_REPLAY) == "1" else None


@pytest.fixture(scope="session", autouse=True)
def demo_tools_in_this_process() -> None:
    """The demo tools, named, for the code tests run in this process (a tool's policy, the gate's
    steps): the tests' environment names no tools and is not dev, where that refuses to start. The
    apps the tests start name them in their environment instead (make_app_env)."""
    use_tools(Settings(countersign_tools=(DEMO_TOOLS,)))


@pytest.fixture(scope="session")
def restate_server(deployment_protocol: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestateServer]:
    server = RestateServer.start(
        tmp_path_factory.mktemp(f"restate-{deployment_protocol}"), extra_env=restate_env_of(deployment_protocol)
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def app_env(restate_server: RestateServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = make_app_env(
        ingress_url=restate_server.ingress_url,
        outbox_dir=tmp_path_factory.mktemp("outbox"),
        db_path=tmp_path_factory.mktemp("demo") / "business.db",
    )
    # The operator's allow-list for reassignments outside a tool's policy (the tests that hand an
    # approval to someone new use these; anything else stays refused, see test_security_ingress).
    return {**env, "APPROVALS_REASSIGN_ALLOWED": "carol@example.com,@reassign.example"}


@pytest.fixture(scope="session")
def outbox_dir(app_env: dict[str, str]) -> Path:
    return Path(app_env["APPROVALS_OUTBOX_DIR"])


@pytest.fixture(scope="session")
def demo_db(app_env: dict[str, str]) -> Path:
    return Path(app_env["DEMO_DB"])


@pytest.fixture(scope="session")
def app_server(
    restate_server: RestateServer,
    app_env: dict[str, str],
    deployment_protocol: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[AppServer]:
    app = start_registered_app(
        restate_server,
        env=app_env,
        log_path=tmp_path_factory.mktemp("app") / "app.log",
        http1=DEPLOYMENT_PROTOCOLS[deployment_protocol],
    )
    try:
        yield app
    finally:
        app.stop()


@pytest.fixture(scope="session")
def ingress(restate_server: RestateServer, app_env: dict[str, str]) -> Iterator[Ingress]:
    client = Ingress(restate_server.ingress_url, app_env["COUNTERSIGN_JOURNAL_KEYS"])
    try:
        yield client
    finally:
        client.close()


@pytest.fixture()
def run_id() -> str:
    return f"t-{uuid4().hex[:12]}"


def _start_stack(
    root: Path,
    cleanup: ExitStack,
    *,
    restate_env: dict[str, str] | None = None,
    app_env: dict[str, str] | None = None,
    http1: bool = False,
) -> IsolatedStack:
    """A restate-server and an app registered with it, under `root`; `cleanup` stops them."""
    restate = RestateServer.start(root / "restate", extra_env=restate_env)
    cleanup.callback(restate.stop)
    outbox = root / "outbox"
    outbox.mkdir(parents=True)
    db_path = root / "business.db"
    env = {
        **make_app_env(
            ingress_url=restate.ingress_url, outbox_dir=outbox, db_path=db_path, admin_url=restate.admin_url
        ),
        **(app_env or {}),
    }
    app = start_registered_app(restate, env=env, log_path=root / "app.log", http1=http1)
    cleanup.callback(app.stop)
    client = Ingress(restate.ingress_url, restate.journal_keys or None)
    cleanup.callback(client.close)
    return IsolatedStack(restate=restate, app=app, ingress=client, env=app.env, outbox_dir=outbox, db_path=db_path)


@pytest.fixture()
def private_stacks(tmp_path: Path) -> Iterator[StackFactory]:
    """A factory for private restate-server + app stacks; all of them are stopped at teardown.

    Not parametrised: the caller picks the protocol (`http1=`). Tests that should run in both modes
    use `isolated_stack` instead.
    """
    with ExitStack() as cleanup:
        count = 0

        def start(
            *,
            restate_env: dict[str, str] | None = None,
            app_env: dict[str, str] | None = None,
            http1: bool = False,
        ) -> IsolatedStack:
            nonlocal count
            count += 1
            return _start_stack(
                tmp_path / f"stack{count}", cleanup, restate_env=restate_env, app_env=app_env, http1=http1
            )

        yield start


@pytest.fixture(scope="module")
def module_stack_app_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The app's settings for `module_stack`: the module's `MODULE_STACK_APP_ENV` (a dict, default none).
    A module whose settings are known only once its fixtures have run (a fake server's URL, a file under
    a temporary directory) overrides this fixture with a module-scoped one of its own instead."""
    return dict(getattr(request.module, "MODULE_STACK_APP_ENV", {}))


@pytest.fixture(scope="module")
def module_stack(
    request: pytest.FixtureRequest,
    deployment_protocol: str,
    tmp_path_factory: pytest.TempPathFactory,
    module_stack_app_env: dict[str, str],
) -> Iterator[IsolatedStack]:
    """One private restate-server and app shared by the tests of a module (in the session's protocol),
    for tests that neither kill, restart nor reconfigure them: the app's settings are the module's
    `MODULE_STACK_APP_ENV` (a dict, default none; see `module_stack_app_env`), and every test places its
    runs under ids of its own. A test that kills or reconfigures a process takes `isolated_stack` instead.
    (Starting a stack costs about 2.5 CPU-seconds: per module, not per test.)"""
    app_env = dict(module_stack_app_env)
    root = tmp_path_factory.mktemp(f"{request.module.__name__.rsplit('.', 1)[-1]}-{deployment_protocol}")
    with ExitStack() as cleanup:
        yield _start_stack(
            root,
            cleanup,
            restate_env=restate_env_of(deployment_protocol),
            app_env=app_env,
            http1=DEPLOYMENT_PROTOCOLS[deployment_protocol],
        )


@pytest.fixture()
def own_stack(isolated_stack: StackFactory, module_stack_app_env: dict[str, str]) -> IsolatedStack:
    """A stack of the test's own with the module's settings (`module_stack_app_env`), for a test that
    kills its app or checks what every test on a shared stack would change (a tool's trust figures,
    an approver's whole inbox, "nobody was emailed")."""
    return isolated_stack(app_env=module_stack_app_env)


@pytest.fixture()
def isolated_stack(private_stacks: StackFactory, deployment_protocol: str) -> StackFactory:
    """`private_stacks` registered with this session's deployment protocol (so: run in both modes)."""
    session_http1 = DEPLOYMENT_PROTOCOLS[deployment_protocol]
    protocol_env = restate_env_of(deployment_protocol)

    def start(
        *, restate_env: dict[str, str] | None = None, app_env: dict[str, str] | None = None, http1: bool = session_http1
    ) -> IsolatedStack:
        return private_stacks(restate_env={**protocol_env, **(restate_env or {})}, app_env=app_env, http1=http1)

    return start

"""Building blocks for the model tests' fixtures: running fakes, and a stack whose app talks to them.

Guarantee: each context manager stops what it started when it exits, whether or not the test
passed (fakes by shutting their server down, restate-server and the app by PID, in reverse order).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar

from support.processes import Ingress, IsolatedStack, RestateServer, make_app_env, start_registered_app

from fakes import anthropic_server, openai_server
from fakes.provider import FakeProvider

F = TypeVar("F", bound=FakeProvider)

# Small bounds so retry and timeout cases finish in seconds.
TEST_MODEL_SETTINGS = {
    "MODEL_TIMEOUT_SECONDS": "2",
    "MODEL_MAX_ATTEMPTS": "3",
    "MODEL_MAX_MALFORMED_TURNS": "3",
}


@contextmanager
def running(fake: F) -> Iterator[F]:
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def provider_env(openai: openai_server.OpenAIFake, anthropic: anthropic_server.AnthropicFake) -> dict[str, str]:
    """The app's provider variables, pointing both SDKs at the fakes."""
    return {
        "OPENAI_BASE_URL": openai.base_url,
        "OPENAI_API_KEY": openai_server.API_KEY,
        "ANTHROPIC_BASE_URL": anthropic.base_url,
        "ANTHROPIC_API_KEY": anthropic_server.API_KEY,
        **TEST_MODEL_SETTINGS,
    }


@contextmanager
def model_stack(root: Path, app_env: dict[str, str]) -> Iterator[IsolatedStack]:
    """A private restate-server + app (registered), with `app_env` on top of the usual test env."""
    with ExitStack() as cleanup:
        restate = RestateServer.start(root / "restate")
        cleanup.callback(restate.stop)
        outbox = root / "outbox"
        outbox.mkdir(parents=True)
        db_path = root / "business.db"
        env = {**make_app_env(ingress_url=restate.ingress_url, outbox_dir=outbox, db_path=db_path), **app_env}
        app = start_registered_app(restate, env=env, log_path=root / "app.log")
        cleanup.callback(app.stop)
        client = Ingress(restate.ingress_url, restate.journal_keys or None)
        cleanup.callback(client.close)
        yield IsolatedStack(restate=restate, app=app, ingress=client, env=app.env, outbox_dir=outbox, db_path=db_path)

"""A private restate-server + handlers app that sends its email through a `FakeResend`.

Guarantee: `resend_stack` stops everything it started (app, then restate-server) when its block
ends, whether or not the block raised; `resend_env` is the exact environment that points the app's
real `resend` SDK at the fake.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from support.processes import Ingress, IsolatedStack, RestateServer, make_app_env, start_registered_app

from fakes.resend_server import FakeResend

FROM = "Countersign <approvals@countersign.example>"


def resend_env(fake: FakeResend, *, timeout: float = 2.0) -> dict[str, str]:
    return {
        "RESEND_API_KEY": "re_test_" + "k" * 24,
        "RESEND_API_URL": fake.url,
        "RESEND_FROM": FROM,
        "RESEND_WEBHOOK_SECRET": fake.webhook_secret,
        "RESEND_TIMEOUT_SECONDS": str(timeout),
    }


@contextmanager
def resend_stack(root: Path, fake: FakeResend, extra_env: dict[str, str] | None = None) -> Iterator[IsolatedStack]:
    with ExitStack() as cleanup:
        restate = RestateServer.start(root / "restate")
        cleanup.callback(restate.stop)
        outbox = root / "outbox"
        outbox.mkdir(parents=True, exist_ok=True)
        db_path = root / "business.db"
        env = {
            **make_app_env(ingress_url=restate.ingress_url, outbox_dir=outbox, db_path=db_path),
            **resend_env(fake),
            **(extra_env or {}),
        }
        app = start_registered_app(restate, env=env, log_path=root / "app.log")
        cleanup.callback(app.stop)
        client = Ingress(restate.ingress_url, restate.journal_keys or None)
        cleanup.callback(client.close)
        yield IsolatedStack(restate=restate, app=app, ingress=client, env=app.env, outbox_dir=outbox, db_path=db_path)

"""The product floor: bare Restate doing Countersign's product work for one gated refund, the most
direct way, so the bench can tell what the product costs from what Countersign's own shape costs.

What one `ProductFloor.run` does, each side effect in its own journaled step:

1. `model turn N`: a scripted model proposes the next call (`lookups` order look-ups, then the refund)
   and the policy answers in the same step (gated when the amount is over $500), as AgentRun's turn does;
   a look-up then runs as its own step (one SQLite read).
2. `request email`: an HMAC-signed link (stdlib `hmac`: run id and expiry), the request email rendered with
   Jinja2 (text and HTML) into an `.eml` file named by its idempotency key (`request/<run>`; a retried step
   finds the file and writes nothing). The proposed call is kept in state for the page.
3. A durable-promise wait raced against the link's deadline (a run must not outlive its link).
4. `refund`: the precondition read (the order still has the amount left) and the refund, in one SQLite
   transaction under the idempotency key `<run>/refund` (`INSERT OR IGNORE`; a retry returns the first row).
5. `receipt and outcome emails`: the approver's receipt and the requester's outcome, two `.eml` files.
6. `model turn N+1`: the model's answer; the run returns.

The page (`GET /approvals/<token>`) checks the link and shows the call (read through the `pending` shared
handler) with a form carrying a CSRF value (an HMAC of the token); `POST` checks the Origin header
(`null` only with `Sec-Fetch-Site: same-origin`, as browsers send it under `Referrer-Policy: same-origin`),
the CSRF value and the link, then makes one ingress call to the shared handler `decide`, which resolves
the workflow's promise (Restate refuses a second resolve with a 409, and so does the page).

What it leaves out, and why it is not the product work of this path: the audit trail, the approver's
inbox, trust statistics and webhooks (bookkeeping for other screens and integrations: one invocation or
more each in Countersign); reminder and escalation timers and their emails (none fires in the bench);
the approver's context facts on the email (a tool option, three reads in the model turn); a styled
email (Countersign inlines a stylesheet; these are short plain templates); binding the link to an
action digest, approver and round (one action, one approver, one round per run here: the run id is the
whole binding); journal encryption (a deployment option the bench turns on for Countersign); model
pinning, phase and status state (answers to `status` calls nobody makes here). Their cost is
Countersign's, and it is in the ratio.

Two choices made the way Countersign makes them: a finished invocation keeps no journal (its output,
state and promise stay; a journal nobody reads is not product work), and the page and the Restate
endpoint share one process. One made differently: the precondition and the refund share one SQLite
transaction (Countersign re-checks, then acts, in two steps); atomic is the most direct way, and each
side effect is still in a journaled step.

Run it with `python -m bench.product_floor --bind HOST:PORT --ingress URL --outbox DIR --db FILE` (or the
`PRODUCT_FLOOR_*` variables; `PRODUCT_FLOOR_SECRET` keeps links valid across restarts).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import formatdate
from pathlib import Path
from typing import Any, Literal

import httpx
import restate
from jinja2 import DictLoader, Environment, select_autoescape
from pydantic import BaseModel, Field
from restate import RunOptions, TerminalError, WorkflowContext, WorkflowSharedContext
from restate.server_types import RestateAppT
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route

from countersign.runtime.server import Listener, restate_config, serve

SERVICE = "ProductFloor"
DECISION = "decision"
PENDING = "pending"
INGRESS_ENV, OUTBOX_ENV, DB_ENV = "PRODUCT_FLOOR_INGRESS", "PRODUCT_FLOOR_OUTBOX", "PRODUCT_FLOOR_DB"
SECRET_ENV = "PRODUCT_FLOOR_SECRET"  # noqa: S105 (the name of a variable)
APPROVER = "finance@example.com"
SENDER = "approvals@example.com"
GATE_CENTS = 500_00
DEADLINE = timedelta(hours=24)
STEP = RunOptions[Any](max_attempts=5, initial_retry_interval=timedelta(milliseconds=100))
"""Every step: bounded retries (an unbounded step falls back to the server's 70 attempts, then pauses)."""


class FloorTask(BaseModel):
    order_id: int
    amount_cents: int = Field(gt=0)
    requester: str
    lookups: int = Field(default=0, ge=0, le=200)


class Call(BaseModel):
    tool: Literal["lookup_order", "issue_refund"]
    order_id: int
    amount_cents: int = 0
    why: str = ""


class Turn(BaseModel):
    """One journaled model turn: the proposed call (or the answer) and the policy's answer for it."""

    call: Call | None = None
    gated: bool = False
    answer: str = ""


class Verdict(BaseModel):
    verdict: Literal["approve", "reject"]
    approver: str
    reason: str = ""


class Refund(BaseModel):
    refund_id: int | None = None
    created_at: float | None = None
    refused: str | None = None


Outcome = Literal["approved", "rejected", "expired", "refused"]


class FloorResult(BaseModel):
    outcome: Outcome
    answer: str
    refund: Refund | None = None


# --- the side effects (each the body of one journaled step) ----------------------------------------

_TEMPLATES = {
    "request.txt": "{{ approver }}: {{ requester }}'s agent asks to refund ${{ usd }} to order {{ order }}.\n"
    "Why: {{ why }}\nDecide by {{ deadline }}: {{ link }}\n",
    "request.html": "<p>{{ requester }}'s agent asks to refund <b>${{ usd }}</b> to order {{ order }}.</p>"
    '<p>Why: {{ why }}</p><p><a href="{{ link }}">Review and decide</a> by {{ deadline }}.</p>',
    "receipt.txt": "You {{ verdict }}d the refund of ${{ usd }} to order {{ order }}.\n",
    "receipt.html": "<p>You {{ verdict }}d the refund of <b>${{ usd }}</b> to order {{ order }}.</p>",
    "outcome.txt": "Your agent's refund of ${{ usd }} to order {{ order }}: {{ outcome }} by {{ approver }}.\n",
    "outcome.html": "<p>Your agent's refund of <b>${{ usd }}</b> to order {{ order }}: {{ outcome }} by "
    "{{ approver }}.</p>",
    "page.html": "<!doctype html><title>Refund ${{ usd }}</title><h1>Refund ${{ usd }} to order {{ order }}</h1>"
    '<p>Why: {{ why }}</p><form method="post"><input type="hidden" name="csrf" value="{{ csrf }}">'
    '<input name="reason"><button name="verdict" value="approve">Approve</button>'
    '<button name="verdict" value="reject">Reject</button></form>',
    "done.html": "<!doctype html><title>{{ title }}</title><h1>{{ title }}</h1>",
}
_JINJA = Environment(loader=DictLoader(_TEMPLATES), autoescape=select_autoescape(("html",)), auto_reload=False)


def _usd(cents: int) -> str:
    return f"{cents / 100:.2f}"


def write_email(outbox: Path, key: str, to: str, subject: str, template: str, **values: Any) -> str:
    """Render `template` (text and HTML) into `<key>.eml`, once per key (atomic: temp file, then a link)."""
    path = outbox / (re.sub(r"[^A-Za-z0-9_.-]", "_", key) + ".eml")
    if path.exists():
        return path.name
    message = MIMEMultipart("alternative")
    message["From"], message["To"], message["Subject"] = SENDER, to, subject
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = f"<{hashlib.sha256(key.encode()).hexdigest()[:40]}@product-floor.local>"
    for kind in ("plain", "html"):
        body = _JINJA.get_template(f"{template}.{'txt' if kind == 'plain' else 'html'}").render(values)
        message.attach(MIMEText(body, kind, "utf-8"))
    fd, tmp = tempfile.mkstemp(dir=outbox, prefix=".tmp-", suffix=".eml")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(message.as_bytes())
        os.link(tmp, path)
    except FileExistsError:
        pass  # a concurrent attempt under the same key wrote it first: that one stays
    finally:
        os.unlink(tmp)
    return path.name


LINK_DOMAIN, CSRF_DOMAIN = b"link\0", b"csrf\0"


def _mac(secret: bytes, domain: bytes, text: str) -> str:
    tag = hmac.new(secret, domain + text.encode(), hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(tag).decode().rstrip("=")


def sign_link(secret: bytes, run_id: str, expires: int) -> str:
    claims = f"{run_id}~{expires}"
    return f"{claims}~{_mac(secret, LINK_DOMAIN, claims)}"


def check_link(secret: bytes, token: str, now: float) -> str | None:
    """The run id of a valid, unexpired token, else None."""
    run_id, _, rest = token.partition("~")
    expires, _, tag = rest.partition("~")
    if not expires.isdigit() or not hmac.compare_digest(tag, _mac(secret, LINK_DOMAIN, f"{run_id}~{expires}")):
        return None
    return run_id if now < int(expires) else None


def csrf_for(secret: bytes, token: str) -> str:
    return _mac(secret, CSRF_DOMAIN, token)


SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, amount_cents INTEGER NOT NULL,
    refunded_cents INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL UNIQUE,
    order_id INTEGER NOT NULL, amount_cents INTEGER NOT NULL, created_at REAL NOT NULL);
"""
_THREAD = threading.local()


def connect(path: Path) -> sqlite3.Connection:
    """This thread's connection (kept open, autocommit, WAL), as the demo tools keep theirs."""
    conn: sqlite3.Connection | None = getattr(_THREAD, "conn", None)
    if conn is None:
        conn = _THREAD.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SCHEMA)
    return conn


class Effects:
    """The steps' side effects, bound to the outbox, the database and the link secret."""

    def __init__(self, outbox: Path, db: Path, secret: bytes, public_url: str) -> None:
        self.outbox, self.db, self.secret, self.public_url = outbox, db, secret, public_url

    async def model_turn(self, task: FloorTask, done: int, refund: Refund | None = None) -> Turn:
        """The scripted model: `task.lookups` look-ups, then the refund, then an answer."""
        if done < task.lookups:
            return Turn(call=Call(tool="lookup_order", order_id=task.order_id, why="Check the order first."))
        if done == task.lookups:
            call = Call(tool="issue_refund", order_id=task.order_id, amount_cents=task.amount_cents, why="Asked.")
            return Turn(call=call, gated=call.amount_cents > GATE_CENTS)
        result = "not run" if refund is None else (refund.refused or "refunded")
        return Turn(answer=f"Done. issue_refund: {result}")

    def lookup(self, order_id: int) -> dict[str, int]:
        row = connect(self.db).execute("SELECT amount_cents, refunded_cents FROM orders WHERE id = ?", (order_id,))
        found = row.fetchone()
        return {"amount_cents": found[0], "refunded_cents": found[1]} if found else {}

    def request_email(self, run_id: str, requester: str, call: Call) -> str:
        expires = int(time.time() + DEADLINE.total_seconds())
        link = f"{self.public_url}/approvals/{sign_link(self.secret, run_id, expires)}"
        values: dict[str, Any] = {"approver": APPROVER, "requester": requester, "usd": _usd(call.amount_cents)}
        values |= {"order": call.order_id, "why": call.why, "deadline": formatdate(expires, usegmt=True), "link": link}
        subject = f"Approve a refund of ${values['usd']}?"
        return write_email(self.outbox, f"request/{run_id}", APPROVER, subject, "request", **values)

    def refund(self, key: str, call: Call) -> Refund:
        """The precondition read and the refund, one transaction, once per idempotency key."""
        db = connect(self.db)
        db.execute("BEGIN IMMEDIATE")
        try:
            done = db.execute("SELECT id, created_at FROM refunds WHERE idempotency_key = ?", (key,)).fetchone()
            if done is None:
                order = db.execute(
                    "SELECT amount_cents - refunded_cents FROM orders WHERE id = ?", (call.order_id,)
                ).fetchone()
                if order is None or order[0] < call.amount_cents:
                    db.execute("COMMIT")
                    return Refund(refused=f"order {call.order_id} has not that much left to refund")
                db.execute(
                    "INSERT OR IGNORE INTO refunds(idempotency_key, order_id, amount_cents, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    (key, call.order_id, call.amount_cents, time.time()),
                )
                db.execute(
                    "UPDATE orders SET refunded_cents = refunded_cents + ? WHERE id = ?",
                    (call.amount_cents, call.order_id),
                )
                done = db.execute("SELECT id, created_at FROM refunds WHERE idempotency_key = ?", (key,)).fetchone()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return Refund(refund_id=done[0], created_at=done[1])

    def closing_emails(self, run_id: str, requester: str, call: Call, verdict: Verdict, outcome: str) -> list[str]:
        values = {"usd": _usd(call.amount_cents), "order": call.order_id, "approver": verdict.approver}
        subject = f"Refund of ${values['usd']}: {outcome}"
        return [
            write_email(
                self.outbox,
                f"receipt/{run_id}",
                verdict.approver,
                subject,
                "receipt",
                verdict=verdict.verdict,
                **values,
            ),
            write_email(self.outbox, f"outcome/{run_id}", requester, subject, "outcome", outcome=outcome, **values),
        ]


# --- the workflow -------------------------------------------------------------------------------


def make_workflow(effects: Effects) -> restate.Workflow:
    wf = restate.Workflow(
        SERVICE,
        description="Bench product floor: the approval path's product work, bare.",
        journal_retention=timedelta(0),  # as Countersign's: what a finished run leaves is its output and state
    )

    @wf.main(name="run")
    async def run(ctx: WorkflowContext, task: FloorTask) -> FloorResult:
        run_id = ctx.key()
        for i in range(task.lookups):
            turn = await ctx.run_typed(f"model turn {i + 1}", effects.model_turn, STEP, task=task, done=i)
            if turn.call is None:
                raise TerminalError("the scripted model stopped early")
            await ctx.run_typed(f"lookup {i}", effects.lookup, STEP, order_id=turn.call.order_id)
        turn = await ctx.run_typed(
            f"model turn {task.lookups + 1}", effects.model_turn, STEP, task=task, done=task.lookups
        )
        call = turn.call
        if call is None or not turn.gated:
            raise TerminalError("the product floor measures a gated refund only (amount over $500)", 400)
        ctx.set(PENDING, call)
        await ctx.run_typed(
            "request email", effects.request_email, STEP, run_id=run_id, requester=task.requester, call=call
        )
        match await restate.select(
            decision=ctx.promise(DECISION, type_hint=Verdict).value(), deadline=ctx.sleep(DEADLINE)
        ):
            case ["decision", Verdict() as verdict]:
                pass
            case _:
                return FloorResult(outcome="expired", answer="The approval expired.")
        refund = None
        if verdict.verdict == "approve":
            refund = await ctx.run_typed("refund", effects.refund, STEP, key=f"{run_id}/refund", call=call)
        outcome: Outcome = "refused" if refund and refund.refused else ("approved" if refund else "rejected")
        await ctx.run_typed(
            "receipt and outcome emails",
            effects.closing_emails,
            STEP,
            run_id=run_id,
            requester=task.requester,
            call=call,
            verdict=verdict,
            outcome=outcome,
        )
        final = await ctx.run_typed(
            f"model turn {task.lookups + 2}", effects.model_turn, STEP, task=task, done=task.lookups + 1, refund=refund
        )
        return FloorResult(outcome=outcome, answer=final.answer, refund=refund)

    @wf.handler(name="decide")
    async def decide(ctx: WorkflowSharedContext, verdict: Verdict) -> str:
        promise = ctx.promise(DECISION, type_hint=Verdict)
        await promise.resolve(verdict)
        return "ok"

    @wf.handler(name="pending")
    async def pending(ctx: WorkflowSharedContext) -> Call | None:
        if await ctx.promise(DECISION, type_hint=Verdict).peek() is not None:
            return None
        return await ctx.get(PENDING, type_hint=Call)

    return wf


# --- the page ------------------------------------------------------------------------------------


def create_app(effects: Effects, ingress_url: str) -> Starlette:
    origin = effects.public_url
    client = httpx.AsyncClient(base_url=ingress_url, timeout=30, trust_env=False)
    headers = {"Referrer-Policy": "same-origin", "Cache-Control": "no-store"}

    def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(_JINJA.get_template(name).render(values), status, headers)

    async def show(request: Request) -> Response:
        token = request.path_params["token"]
        run_id = check_link(effects.secret, token, time.time())
        if run_id is None:
            return page("done.html", 403, title="This link is not valid")
        answer = await client.post(f"/{SERVICE}/{run_id}/pending")
        call = (
            Call.model_validate_json(answer.content)
            if answer.status_code == 200 and answer.content.strip() not in (b"", b"null")
            else None
        )
        if call is None:
            return page("done.html", 409, title="Already decided")
        csrf = csrf_for(effects.secret, token)
        return page("page.html", usd=_usd(call.amount_cents), order=call.order_id, why=call.why, csrf=csrf)

    async def submit(request: Request) -> Response:
        sent, site = request.headers.get("origin"), request.headers.get("sec-fetch-site")
        if not (sent == origin and site in (None, "same-origin")) and not (sent == "null" and site == "same-origin"):
            return page("done.html", 403, title="Cross-site request refused")
        token, form = request.path_params["token"], await request.form()
        if not hmac.compare_digest(str(form.get("csrf", "")), csrf_for(effects.secret, token)):
            return page("done.html", 403, title="This form has expired")
        run_id = check_link(effects.secret, token, time.time())
        verdict = form.get("verdict")
        if run_id is None or verdict not in ("approve", "reject"):
            return page("done.html", 400 if run_id else 403, title="This link is not valid")
        body = Verdict(
            verdict="approve" if verdict == "approve" else "reject",
            approver=APPROVER,
            reason=str(form.get("reason", "")),
        )
        answer = await client.post(
            f"/{SERVICE}/{run_id}/decide", content=body.model_dump_json(), headers={"content-type": "application/json"}
        )
        if answer.status_code != 200 or answer.json() != "ok":
            return page("done.html", 409, title="Already decided")
        return page("done.html", title="Approved" if verdict == "approve" else "Rejected")

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with client:
            yield

    endpoint: RestateAppT = restate.app(services=[make_workflow(effects)])
    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/approvals/{token}", show, methods=["GET"]),
            Route("/approvals/{token}", submit, methods=["POST"]),
            Mount("/restate", app=endpoint),
        ],
        lifespan=lifespan,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.product_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="127.0.0.1:9083", help="HOST:PORT (pages and the Restate endpoint)")
    env = os.environ.get
    parser.add_argument("--ingress", default=env(INGRESS_ENV, "http://127.0.0.1:8080"), help="the Restate ingress")
    parser.add_argument("--outbox", type=Path, default=env(OUTBOX_ENV), help="folder for the .eml files")
    parser.add_argument("--db", type=Path, default=env(DB_ENV), help="the SQLite business database")
    args = parser.parse_args(argv)
    if args.outbox is None or args.db is None:
        parser.error(f"--outbox and --db (or ${OUTBOX_ENV} and ${DB_ENV}) are required")
    args.outbox.mkdir(parents=True, exist_ok=True)
    secret = env(SECRET_ENV, "").encode() or secrets.token_bytes(32)
    effects = Effects(args.outbox, args.db, secret, f"http://{args.bind}")
    connect(args.db)  # the schema, before the first step needs it
    asyncio.run(serve(Listener(create_app(effects, args.ingress), restate_config(args.bind), "--bind")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The systems measured side by side, behind one interface: Countersign's agent, the library path
(a user's own workflow calling the gate), the bare floor and the product floor (bare Restate doing
the same product work the most direct way: `bench.product_floor`).

Guarantee: each is driven only through its public surfaces (the Restate ingress, the approval
page, the outbox and the business database for Countersign and the product floor; the ingress and
marker files for the bare floor), and every run is checked to have ended the way the scenario meant
before its figure counts.
"""

from __future__ import annotations

import email
import email.policy
import itertools
import json
import sqlite3
import time
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import httpx
from support.approver import CSRF, ApprovalEmail
from support.processes import AppServer

from bench.floor import SERVICE as FLOOR_SERVICE
from bench.library_subject import SERVICE as LIBRARY_SERVICE
from bench.product_floor import SERVICE as PRODUCT_SERVICE
from bench.product_floor import connect as product_db
from bench.watch import MarkerWatcher, approval_email_run, floor_marker_run, product_request_run
from countersign.security.codec import JournalCipher
from countersign.settings import parse_journal_keys
from handlers.demo.business_db import connect, transaction

REQUESTER = "bench@example.com"
GATED_AMOUNT = "800.00"
AUTONOMOUS_AMOUNT = "100.00"
ORDER_CENTS = 1_000_000


class BenchError(RuntimeError):
    """A run did not behave as the scenario meant; its figure would be meaningless."""


@dataclass
class Approval:
    """What an approver needs in hand before the timed POST (read from the email and the page)."""

    run_id: str
    link: str = ""
    csrf: str = ""


class Subject(Protocol):
    name: str
    service: str
    app: AppServer
    watcher: MarkerWatcher

    def body(self, task: dict[str, Any]) -> bytes:
        """A request body as this system's clients send it."""
        ...

    def read(self, answer: bytes) -> dict[str, Any]:
        """A successful answer's JSON, as this system's clients read it."""
        ...

    def waiting_task(self, run_id: str, turns: int) -> dict[str, Any]:
        """A run that does `turns` units of work, then notifies an approver and waits."""
        ...

    def steps_task(self, run_id: str, steps: int) -> dict[str, Any]:
        """A run that does `steps` units of work and finishes."""
        ...

    async def prepare(self, run_id: str) -> Approval: ...

    async def decide(self, approval: Approval) -> None:
        """The approver's one timed action."""
        ...

    def check_done(self, run_id: str, output: dict[str, Any]) -> float:
        """Raise unless the run ended as approved and acted; return when the action ran (epoch s)."""
        ...


class Countersign:
    name = "countersign"
    service = "AgentRun"

    def __init__(self, app: AppServer, outbox: Path, db_path: Path, client: httpx.AsyncClient) -> None:
        self.app = app
        self.watcher = MarkerWatcher(outbox, approval_email_run)
        self.db_path = db_path
        self.client = client
        self.origin = "{0.scheme}://{0.netloc}".format(urlsplit(app.url))
        self._orders: dict[str, int] = {}
        self._gated_index: dict[str, int] = {}
        self._next_order = itertools.count(10_000_000)
        keys = app.env.get("COUNTERSIGN_JOURNAL_KEYS")
        self.codec = JournalCipher(parse_journal_keys(keys)) if keys else None

    def body(self, task: dict[str, Any]) -> bytes:
        """Sealed with the journal key when the app encrypts its journal, as the app's clients do."""
        raw = json.dumps(task).encode()
        return self.codec.encode(raw) if self.codec else raw

    def read(self, answer: bytes) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(self.codec.open(answer) if self.codec else answer))

    def new_orders(self, run_ids: list[str]) -> None:
        """Give each run a fresh paid order (one transaction), so every refund has its own balance."""
        rows = [(next(self._next_order), run_id) for run_id in run_ids]
        with connect(self.db_path) as db, transaction(db):
            db.executemany(
                "INSERT INTO orders(id, customer_id, amount_cents, status) VALUES (?, 'c_17', ?, 'paid')",
                [(order, ORDER_CENTS) for order, _ in rows],
            )
        self._orders.update({run_id: order for order, run_id in rows})

    def _order(self, run_id: str) -> int:
        if run_id not in self._orders:
            self.new_orders([run_id])
        return self._orders[run_id]

    def waiting_task(self, run_id: str, turns: int) -> dict[str, Any]:
        """`turns` model turns: `turns - 1` autonomous look-ups, then a refund the policy gates."""
        order = self._order(run_id)
        script: list[dict[str, Any]] = [{"tool": "lookup_order", "args": {"order_id": order}}] * (turns - 1)
        script.append(
            {
                "tool": "issue_refund",
                "args": {"order_id": order, "amount_usd": GATED_AMOUNT, "reason": "bench"},
                "why": "Benchmark refund.",
            }
        )
        self._gated_index[run_id] = turns - 1
        return {"goal": f"Refund order {order} for ${GATED_AMOUNT}", "requester": REQUESTER, "script": script}

    def demo_task(self, run_id: str) -> dict[str, Any]:
        """The README's demo run: the scripted model plans a look-up, then a gated refund."""
        order = self._order(run_id)
        self._gated_index[run_id] = 1
        return {"goal": f"Refund order {order} for ${GATED_AMOUNT}", "requester": REQUESTER}

    def steps_task(self, run_id: str, steps: int) -> dict[str, Any]:
        script = [{"tool": "lookup_order", "args": {"order_id": 1042}}] * steps
        return {"goal": "Look up order 1042", "requester": REQUESTER, "script": script}

    def refund_steps_task(self, run_id: str, before: int, after: int) -> dict[str, Any]:
        """Autonomous work around one autonomous refund (under the $500 gate): a real effect mid-run."""
        order = self._order(run_id)
        lookup = {"tool": "lookup_order", "args": {"order_id": order}}
        refund_args = {"order_id": order, "amount_usd": AUTONOMOUS_AMOUNT, "reason": "bench"}
        refund = {"tool": "issue_refund", "args": refund_args}
        return {
            "goal": "Refund a little",
            "requester": REQUESTER,
            "script": [lookup] * before + [refund] + [lookup] * after,
        }

    async def prepare(self, run_id: str) -> Approval:
        return await _open_page(self.client, self.watcher.paths[run_id], run_id)

    async def decide(self, approval: Approval) -> None:
        await _post_page(self.client, approval, self.origin)

    def check_done(self, run_id: str, output: dict[str, Any]) -> float:
        index = self._gated_index[run_id]
        actions = output.get("actions", [])
        if output.get("status") != "completed" or len(actions) <= index or actions[index]["outcome"] != "approved":
            raise BenchError(f"{run_id} did not complete with an approved refund: {str(output)[:300]}")
        with sqlite3.connect(self.db_path) as db:
            row = db.execute(
                "SELECT created_at FROM refunds WHERE idempotency_key = ?", (f"{run_id}/{index}",)
            ).fetchone()
        if row is None:
            raise BenchError(f"{run_id}: no refund row")
        return float(row[0])

    def refunds(self, run_ids: list[str]) -> dict[str, tuple[int, int]]:
        """Run id -> (refund rows under its keys, cents refunded on its order)."""
        found: dict[str, tuple[int, int]] = {}
        with sqlite3.connect(self.db_path) as db:
            for run_id in run_ids:
                (rows,) = db.execute(
                    "SELECT count(*) FROM refunds WHERE idempotency_key LIKE ?", (f"{run_id}/%",)
                ).fetchone()
                (cents,) = db.execute(
                    "SELECT refunded_cents FROM orders WHERE id = ?", (self._orders[run_id],)
                ).fetchone()
                found[run_id] = (int(rows), int(cents))
        return found


class Library(Countersign):
    """A user's own workflow (`bench.library_subject`) gating the refund through `gated_call`: same app,
    same outbox, orders and business database as the agent, so it shares the agent's outbox watcher
    (two watchers moving files out of one folder would steal each other's)."""

    name = "library"
    service = LIBRARY_SERVICE

    def __init__(self, agent: Countersign) -> None:
        self.app = agent.app
        self.watcher = agent.watcher
        self.db_path = agent.db_path
        self.client = agent.client
        self.origin = agent.origin
        self.codec = agent.codec
        self._orders = agent._orders
        self._gated_index = {}
        self._next_order = agent._next_order

    def waiting_task(self, run_id: str, turns: int) -> dict[str, Any]:
        """`turns - 1` autonomous look-ups through the gate, then the refund it gates."""
        self._gated_index[run_id] = turns - 1
        return {
            "order_id": self._order(run_id),
            "amount_usd": GATED_AMOUNT,
            "requester": REQUESTER,
            "lookups": turns - 1,
            "why": "Benchmark refund.",
        }

    def demo_task(self, run_id: str) -> dict[str, Any]:
        """Like the agent's demo run: a look-up, then the gated refund."""
        return self.waiting_task(run_id, 2)

    def steps_task(self, run_id: str, steps: int) -> dict[str, Any]:
        raise BenchError("the library path is not measured per step (its look-ups are the caller's own steps)")


class Floor:
    name = "floor"
    service = FLOOR_SERVICE

    def __init__(self, app: AppServer, markers: Path, ingress: httpx.AsyncClient, steps_per_turn: int = 1) -> None:
        self.app = app
        self.watcher = MarkerWatcher(markers, floor_marker_run)
        self.ingress = ingress
        self.steps_per_turn = steps_per_turn
        """Bare steps standing for one Countersign model turn (set from the journal once measured)."""

    def body(self, task: dict[str, Any]) -> bytes:
        return json.dumps(task).encode()

    def read(self, answer: bytes) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(answer))

    def waiting_task(self, run_id: str, turns: int) -> dict[str, Any]:
        return {"steps": (turns - 1) * self.steps_per_turn, "wait": True}

    def steps_task(self, run_id: str, steps: int) -> dict[str, Any]:
        return {"steps": steps}

    async def prepare(self, run_id: str) -> Approval:
        return Approval(run_id)

    async def decide(self, approval: Approval) -> None:
        response = await self.ingress.post(f"/{self.service}/{approval.run_id}/decide", json={"verdict": "approve"})
        if response.status_code != 200:
            raise BenchError(f"resolving {approval.run_id} answered {response.status_code}: {response.text[:200]}")

    def check_done(self, run_id: str, output: dict[str, Any]) -> float:
        acted = output.get("acted_at")
        if not isinstance(acted, float):
            raise BenchError(f"{run_id} did not act: {str(output)[:300]}")
        return acted


class ProductFloor:
    """`bench.product_floor`: the same refund, gated and decided on its own emailed page."""

    name = "product_floor"
    service = PRODUCT_SERVICE

    def __init__(self, app: AppServer, outbox: Path, db_path: Path, client: httpx.AsyncClient) -> None:
        self.app = app
        self.watcher = MarkerWatcher(outbox, product_request_run)
        self.db_path = db_path
        self.client = client
        self.origin = "{0.scheme}://{0.netloc}".format(urlsplit(app.url))
        self._orders: dict[str, int] = {}
        self._next_order = itertools.count(10_000_000)

    def body(self, task: dict[str, Any]) -> bytes:
        return json.dumps(task).encode()

    def read(self, answer: bytes) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(answer))

    def new_orders(self, run_ids: list[str]) -> None:
        """A fresh order per run in the product floor's own database (one transaction)."""
        rows = [(next(self._next_order), run_id) for run_id in run_ids]
        db = product_db(self.db_path)
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO orders(id, amount_cents) VALUES (?, ?)", [(o, ORDER_CENTS) for o, _ in rows])
        db.execute("COMMIT")
        self._orders.update({run_id: order for order, run_id in rows})

    def waiting_task(self, run_id: str, turns: int) -> dict[str, Any]:
        """`turns - 1` look-ups, then the refund the policy gates (as the agent's script)."""
        if run_id not in self._orders:
            self.new_orders([run_id])
        cents = int(float(GATED_AMOUNT) * 100)
        return {"order_id": self._orders[run_id], "amount_cents": cents, "requester": REQUESTER, "lookups": turns - 1}

    def demo_task(self, run_id: str) -> dict[str, Any]:
        """Like the agent's demo run: a look-up, then the gated refund."""
        return self.waiting_task(run_id, 2)

    def steps_task(self, run_id: str, steps: int) -> dict[str, Any]:
        raise BenchError("the product floor is measured on the approval path only")

    async def prepare(self, run_id: str) -> Approval:
        return await _open_page(self.client, self.watcher.paths[run_id], run_id)

    async def decide(self, approval: Approval) -> None:
        await _post_page(self.client, approval, self.origin)

    def check_done(self, run_id: str, output: dict[str, Any]) -> float:
        key = f"{run_id}/refund"
        if output.get("outcome") != "approved":
            raise BenchError(f"{run_id} did not complete with an approved refund: {str(output)[:300]}")
        row = product_db(self.db_path).execute("SELECT created_at FROM refunds WHERE idempotency_key = ?", (key,))
        found = row.fetchone()
        if found is None:
            raise BenchError(f"{run_id}: no refund row")
        return float(found[0])


def _email_link(path: Path) -> str:
    message = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return str(ApprovalEmail(path, message).link)


async def _open_page(client: httpx.AsyncClient, path: Path, run_id: str) -> Approval:
    """The approver's untimed part: the link from the email, the page, its form's CSRF value."""
    link = _email_link(path)
    page = await client.get(link)
    match = CSRF.search(page.text)
    if page.status_code != 200 or match is None:
        raise BenchError(f"approval page for {run_id} answered {page.status_code} without a form")
    return Approval(run_id, link, match.group(1))


async def _post_page(client: httpx.AsyncClient, approval: Approval, origin: str) -> None:
    """The approver's one timed action: the form's POST, approving."""
    response = await client.post(
        approval.link,
        data={"csrf": approval.csrf, "verdict": "approve", "reason": ""},
        headers={"Origin": origin},
    )
    if response.status_code != 200:
        raise BenchError(f"approving {approval.run_id} answered {response.status_code}")


def owns(subject: Subject, service: str) -> bool:
    """Whether a Restate service's bytes are `subject`'s: each floor owns its one workflow; the agent and
    the library path own the rest (Countersign's workflows and objects, and BenchLibrary)."""
    floors = (FLOOR_SERVICE, PRODUCT_SERVICE)
    return service == subject.service if subject.service in floors else service not in floors


def now() -> float:
    """Wall-clock seconds, the clock file mtimes and journaled timestamps use."""
    return time.time()

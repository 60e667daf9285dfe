"""Test data in the demo business database (the same SQLite file the app's tools write)."""

from __future__ import annotations

import itertools
import os
import sqlite3
from pathlib import Path
from typing import Any

from handlers.demo.business_db import connect, transaction

# Always six digits (for fewer than 100,000 orders a session): the order id is in the summaries the
# pages show, and a seventh digit wrapped the phone page's heading onto a second line, putting Approve
# below the fold in one session out of ten (those whose pid ended in 900 or more).
_ids = itertools.count(100_000 + (os.getpid() % 800) * 1000)


def new_order(db: Path, amount_cents: int, customer_id: str = "c_17") -> int:
    """A fresh paid order, so each test refunds against its own balance."""
    order_id = next(_ids)
    with connect(db) as conn, transaction(conn):
        conn.execute(
            "INSERT INTO orders(id, customer_id, amount_cents, status) VALUES (?, ?, ?, 'paid')",
            (order_id, customer_id, amount_cents),
        )
    return order_id


def refunds_for(db: Path, run_id: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT idempotency_key, order_id, amount_cents FROM refunds WHERE idempotency_key LIKE ? ORDER BY id",
            (f"{run_id}/%",),
        ).fetchall()

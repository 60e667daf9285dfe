"""The demo database's connections: one per thread and file, reused, never left inside a transaction."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from handlers.demo.business_db import connect, transaction


def test_a_thread_reuses_its_connection_and_a_failure_leaves_no_transaction_open(tmp_path: Path) -> None:
    db_path = tmp_path / "business.db"
    with connect(db_path) as first:
        pass
    with pytest.raises(RuntimeError), connect(db_path) as again:
        assert again is first
        again.execute("BEGIN IMMEDIATE")
        again.execute("UPDATE orders SET status = 'lost' WHERE id = 1042")
        raise RuntimeError("the tool failed mid-transaction")
    assert not first.in_transaction
    with connect(db_path) as db, transaction(db):
        db.execute("UPDATE orders SET refunded_cents = 1 WHERE id = 1042")

    seen: list[tuple[str, int]] = []

    def other_thread() -> None:
        with connect(db_path) as db:
            assert db is not first
            row = db.execute("SELECT status, refunded_cents FROM orders WHERE id = 1042").fetchone()
            seen.append((row["status"], row["refunded_cents"]))

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join(timeout=10)
    assert seen == [("paid", 1)], "the failed write was rolled back, the later one committed"

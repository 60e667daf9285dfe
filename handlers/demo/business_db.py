"""The demo business database: a real SQLite file the demo tools act on.

Guarantee: every side-effect table has a UNIQUE `idempotency_key`, so "executed exactly once" can be
checked with SQL, and the schema plus seed data are created on first use (idempotently).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS customers (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL,
    deleted_at REAL
);
CREATE TABLE IF NOT EXISTS orders (
    id INTEGER PRIMARY KEY,
    customer_id TEXT NOT NULL REFERENCES customers(id),
    amount_cents INTEGER NOT NULL,
    refunded_cents INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS refunds (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    order_id INTEGER NOT NULL REFERENCES orders(id),
    amount_cents INTEGER NOT NULL,
    reason TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS customer_deletions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    customer_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS outbound_emails (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    customer_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""

SEED_CUSTOMERS = [
    ("c_17", "Ada Lovelace", "ada@example.com"),
    ("c_23", "Grace Hopper", "grace@example.com"),
    ("c_31", "Alan Turing", "alan@example.com"),
]
# When each seeded customer became one (a column added after the first release: older files get it too).
SEED_SINCE = {"c_17": "2019-03-14", "c_23": "2021-07-02", "c_31": "2024-11-20"}
SEED_ORDERS = [
    (1042, "c_17", 61240, "paid"),
    (1043, "c_17", 8999, "paid"),
    (1044, "c_23", 125000, "paid"),
    (1045, "c_31", 4500, "paid"),
]


_READY: set[Path] = set()
_THREAD = threading.local()


@contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    """This thread's connection to `path`, in autocommit mode; callers open `BEGIN IMMEDIATE` for
    writes. Kept open for the thread's next call (opening one cost as much as the tool's query);
    a transaction a failure left open is rolled back."""
    connections: dict[Path, sqlite3.Connection] = _THREAD.__dict__.setdefault("connections", {})
    conn = connections.get(path)
    if conn is None:
        conn = connections[path] = _open(path)
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _open(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys=ON")
    if path not in _READY:
        # WAL is a property of the file, so once per process is enough.
        conn.execute("PRAGMA journal_mode=WAL")
        _ensure_schema(conn)
        _READY.add(path)
    return conn


def _ensure_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)
    conn.execute("BEGIN IMMEDIATE")
    try:
        columns = {row["name"] for row in conn.execute("PRAGMA table_info(customers)")}
        if "customer_since" not in columns:
            conn.execute("ALTER TABLE customers ADD COLUMN customer_since TEXT")
        conn.executemany("INSERT OR IGNORE INTO customers(id, name, email) VALUES (?, ?, ?)", SEED_CUSTOMERS)
        conn.executemany(
            "UPDATE customers SET customer_since = ? WHERE id = ? AND customer_since IS NULL",
            [(since, cid) for cid, since in SEED_SINCE.items()],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO orders(id, customer_id, amount_cents, status) VALUES (?, ?, ?, ?)",
            SEED_ORDERS,
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")

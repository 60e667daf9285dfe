"""The processes under test: one restate-server, the Countersign handlers (with the bench's own
library-path workflow served beside them), the bare floor's handlers and the product floor's.

Guarantee: all four bind 127.0.0.1 on free ports, run the committed `restate.toml` and
`countersign/runtime/hypercorn.toml` (with the test suite's loopback overrides, and the partition
count and RocksDB budget put back to the committed values), and are stopped by PID through the
`ExitStack` they are started under, in reverse order, however the bench ends.
"""

from __future__ import annotations

import secrets
import sys
import tomllib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from support.processes import RESTATE_CONFIG, AppServer, RestateServer, free_port, make_app_env

from bench import REPO
from bench.floor import MARKERS_ENV
from bench.library_subject import SPEC as LIBRARY_SPEC
from bench.product_floor import DB_ENV, INGRESS_ENV, OUTBOX_ENV, SECRET_ENV

INACTIVITY_TIMEOUT = "2s"
"""How long an invocation waiting on a promise stays in the handler before it suspends (1m in production)."""


class FloorServer(AppServer):
    """`python -m bench.floor`, managed like the handlers app (same start, health check and stop)."""

    own_restate_listener = False

    @staticmethod
    def _command(port: int) -> list[str]:
        return [sys.executable, "-m", "bench.floor", "--bind", f"127.0.0.1:{port}"]


class ProductFloorServer(AppServer):
    """`python -m bench.product_floor`: its pages and Restate endpoint on one port, like the floor's."""

    own_restate_listener = False

    @staticmethod
    def _command(port: int) -> list[str]:
        return [sys.executable, "-m", "bench.product_floor", "--bind", f"127.0.0.1:{port}"]


@dataclass
class Stack:
    restate: RestateServer
    countersign: AppServer
    floor: AppServer
    product: AppServer
    outbox: Path
    markers: Path
    db_path: Path
    restate_dir: Path
    product_outbox: Path
    product_db: Path

    @classmethod
    def start(cls, work: Path, cleanup: ExitStack) -> Stack:
        restate_dir = work / "restate"
        restate = start_restate(restate_dir)
        cleanup.callback(restate.stop)

        outbox, markers, db_path = work / "outbox", work / "markers", work / "business.db"
        outbox.mkdir(parents=True, exist_ok=True)
        markers.mkdir(parents=True, exist_ok=True)
        port = free_port()
        env = {
            **make_app_env(ingress_url=restate.ingress_url, outbox_dir=outbox, db_path=db_path),
            "APPROVALS_PUBLIC_URL": f"http://127.0.0.1:{port}",
            # Long scripts (100 steps for the resume figure) plus the answering turn.
            "AGENT_MAX_TURNS": "200",
            # The library path: a user's own workflow calling the gate, served beside Countersign's.
            "COUNTERSIGN_SERVICES": LIBRARY_SPEC,
            "PYTHONPATH": str(REPO),
        }
        countersign = AppServer.start(env=env, port=port, log_path=work / "countersign.log")
        cleanup.callback(countersign.stop)
        restate.register(countersign.restate_uri)

        floor = FloorServer.start(env={MARKERS_ENV: str(markers)}, log_path=work / "floor.log")
        cleanup.callback(floor.stop)
        restate.register(floor.restate_uri)

        product_outbox, product_db = work / "product-outbox", work / "product.db"
        product_outbox.mkdir(parents=True, exist_ok=True)
        product_env = {
            INGRESS_ENV: restate.ingress_url,
            OUTBOX_ENV: str(product_outbox),
            DB_ENV: str(product_db),
            SECRET_ENV: secrets.token_urlsafe(32),
            "PYTHONPATH": str(REPO),
        }
        product = ProductFloorServer.start(env=product_env, log_path=work / "product-floor.log")
        cleanup.callback(product.stop)
        restate.register(product.restate_uri)
        return cls(
            restate, countersign, floor, product, outbox, markers, db_path, restate_dir, product_outbox, product_db
        )

    def second_restate(self, base_dir: Path) -> RestateServer:
        """Another restate-server (same settings) with every handler deployment registered: a data dir
        that holds one scenario's data only. The caller stops it."""
        restate = start_restate(base_dir)
        try:
            restate.register(self.countersign.restate_uri)
            restate.register(self.floor.restate_uri)
            restate.register(self.product.restate_uri)
        except BaseException:
            restate.stop()
            raise
        return restate


def start_restate(base_dir: Path) -> RestateServer:
    committed = tomllib.loads(RESTATE_CONFIG.read_text())
    return RestateServer.start(
        base_dir,
        extra_env={
            "RESTATE_DEFAULT_NUM_PARTITIONS": str(committed["default-num-partitions"]),
            "RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE": str(committed["rocksdb-total-memory-size"]),
            "RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT": INACTIVITY_TIMEOUT,
        },
    )

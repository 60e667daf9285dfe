"""What a paused run costs the handler: its RSS before and after pausing 1,000 runs, then with no handler.

`python -m bench.scale_to_zero [--runs 1000] [--protocol http1.1|http2]` starts its own restate-server
and handlers (the test suite's helpers: loopback, free ports), pauses a warm-up batch (the handler's
allocator grows to its working set for that many concurrent runs), then the runs in batches, and reads
the handler's VmRSS once every run of a batch is `suspended` in Restate. Finally it stops the handler
and checks Restate still holds every run as suspended. Exit 1 if the handler's RSS grows by more than
`--max-bytes-per-run` per paused run in the median batch: memory held per paused run would show in
every batch, while the allocator's one-off steps (a new peak of open connections) show in one.

Guarantee: every process it starts is stopped by PID before it exits, whatever happens; every wait is
bounded; the figures are read from /proc only when no invocation is open in the handler.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

_TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

from support.business import new_order  # noqa: E402
from support.processes import (  # noqa: E402
    DEPLOYMENT_PROTOCOLS,
    RestateServer,
    make_app_env,
    start_registered_app,
    wait_until,
)

MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def task(order: int) -> dict[str, Any]:
    return {
        "goal": f"Refund order {order}",
        "requester": "alice@example.com",
        "script": [{"tool": "issue_refund", "args": {"order_id": order, "amount_usd": "600.00", "reason": "bench"}}],
    }


def start_runs(ingress_url: str, outbox: Path, run_ids: list[str], orders: dict[str, int], concurrency: int) -> None:
    """A closed loop: each of `concurrency` workers starts a run and waits for its approval email (the
    run has reached its wait) before starting the next, so at most `concurrency` runs are in flight."""
    local = threading.local()
    clients: list[httpx.Client] = []

    def init() -> None:
        local.client = httpx.Client(base_url=ingress_url, timeout=60, trust_env=False)
        clients.append(local.client)

    def emailed(run_id: str) -> bool:
        return any(outbox.glob(f"approval-request_{run_id}-a*.eml"))

    def start(run_id: str) -> None:
        reply = local.client.post(f"/AgentRun/{run_id}/run/send", json=task(orders[run_id]))
        if reply.status_code != 202:
            raise RuntimeError(f"starting {run_id}: HTTP {reply.status_code} {reply.text}")
        wait_until(functools.partial(emailed, run_id), 120, f"{run_id} to ask for approval", interval=0.05)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, initializer=init) as pool:
            for future in [pool.submit(start, run_id) for run_id in run_ids]:
                future.result(timeout=600)
    finally:
        for client in clients:
            client.close()


def connections(port: int) -> int:
    """TCP connections the handler holds on its port (any state but LISTEN), from /proc/net/tcp."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if int(local.rsplit(":", 1)[1], 16) == port and state != "0A":
            count += 1
    return count


def suspended(restate: RestateServer) -> int:
    rows = restate.sql(
        "select status, count(*) as n from sys_invocation"
        " where target_service_name = 'AgentRun' and target_handler_name = 'run' group by status"
    )
    counts = {row["status"]: int(row["n"]) for row in rows}
    return counts.get("suspended", 0) if set(counts) <= {"suspended"} else -1


def all_suspended(restate: RestateServer, count: int) -> bool:
    return suspended(restate) == count


def batches(run_ids: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(run_ids), size):
        yield run_ids[i : i + size]


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    with ExitStack() as stack:
        restate = RestateServer.start(root / "restate")
        stack.callback(restate.stop)
        env = make_app_env(ingress_url=restate.ingress_url, outbox_dir=root / "outbox", db_path=root / "business.db")
        app = start_registered_app(
            restate, env=env, log_path=root / "app.log", http1=DEPLOYMENT_PROTOCOLS[args.protocol]
        )
        stack.callback(app.stop)
        batch = max(1, args.runs // args.batches)
        warmup = batch if args.warmup is None else args.warmup
        names = [f"warm-{i:04d}" for i in range(warmup)] + [f"paused-{i:05d}" for i in range(args.runs)]
        orders = {run_id: new_order(Path(env["DEMO_DB"]), 100000) for run_id in names}

        def reading(paused: int) -> dict[str, Any]:
            return {
                "paused": paused,
                "handler_rss": rss_bytes(app.pid),
                "restate_rss": rss_bytes(restate.pid),
                "handler_connections": connections(app.port),
            }

        rows = [reading(0)]
        t0 = time.monotonic()
        for group in [names[:warmup], *batches(names[warmup:], batch)]:
            start_runs(restate.ingress_url, root / "outbox", group, orders, args.concurrency)
            paused: int = rows[-1]["paused"] + len(group)
            wait_until(
                functools.partial(all_suspended, restate, paused), args.timeout, f"{paused} runs to suspend", 0.5
            )
            rows.append(reading(paused))
            row = rows[-1]
            print(
                f"  {paused:5d} paused  handler {row['handler_rss'] / MIB:6.1f} MiB, {row['handler_connections']:4d}"
                f" connections  restate-server {row['restate_rss'] / MIB:6.1f} MiB  ({time.monotonic() - t0:5.1f} s)",
                flush=True,
            )
        elapsed = time.monotonic() - t0
        app.stop()
        warm, last = rows[1], rows[-1]
        return {
            "protocol": args.protocol,
            "runs": args.runs,
            "warmup": warmup,
            "concurrency": args.concurrency,
            "rows": rows,
            "handler_bytes_per_paused_run": (last["handler_rss"] - warm["handler_rss"]) / args.runs,
            "handler_median_batch_bytes_per_run": statistics.median(
                (after["handler_rss"] - before["handler_rss"]) / (after["paused"] - before["paused"])
                for before, after in itertools.pairwise(rows[1:])
            ),
            "restate_bytes_per_paused_run": (last["restate_rss"] - warm["restate_rss"]) / args.runs,
            "suspended_after_handler_stopped": suspended(restate),
            "seconds_to_pause_all": elapsed,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_to_zero", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs to pause after the warm-up (default 1000)")
    parser.add_argument("--batches", type=int, default=4, help="RSS readings across the runs (default 4)")
    parser.add_argument("--warmup", type=int, help="runs paused before the baseline (default: one batch)")
    parser.add_argument("--protocol", choices=list(DEPLOYMENT_PROTOCOLS), default="http1.1")
    parser.add_argument("--concurrency", type=int, default=16, help="runs in flight at once (default 16)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a batch may take to suspend")
    parser.add_argument(
        "--max-bytes-per-run", type=float, default=2048, help="allowed handler RSS growth per run (median batch)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    print(f"{args.protocol} deployment: a warm-up batch, then {args.runs} runs paused in {args.batches} batches")
    with tempfile.TemporaryDirectory(prefix="scale-to-zero-") as tmp:
        result = measure(args, Path(tmp))
    idle, warm, last = result["rows"][0], result["rows"][1], result["rows"][-1]
    print(
        f"handler RSS: {idle['handler_rss'] / MIB:.1f} MiB idle, {warm['handler_rss'] / MIB:.1f} MiB after"
        f" {warm['paused']} warm-up runs, {last['handler_rss'] / MIB:.1f} MiB with {last['paused']} paused:"
        f" {result['handler_bytes_per_paused_run']:.0f} bytes per paused run overall,"
        f" {result['handler_median_batch_bytes_per_run']:.0f} in the median batch"
        f" (restate-server: {result['restate_bytes_per_paused_run']:.0f} bytes per paused run)"
    )
    print(f"handler stopped: Restate holds {result['suspended_after_handler_stopped']} runs suspended")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    ok = (
        result["handler_median_batch_bytes_per_run"] <= args.max_bytes_per_run
        and result["suspended_after_handler_stopped"] == last["paused"]
    )
    print("PASS" if ok else "FAIL: the handler's memory grows with paused runs, or runs were lost")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

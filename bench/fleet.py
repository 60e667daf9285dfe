"""Fleet figures: many runs of one approver and one tool, decided in a burst, then left to settle.

Guarantee: every run is the README demo run (one approver, finance@example.com, one gated tool,
issue_refund), so every bookkeeping call of the burst targets what one approver and one tool share;
each figure counts only runs that completed with an approved refund (checked on the output and in the
business database). Figures: decisions drained per second at the plan's concurrency, CPU per decision
(restate-server + handlers), how long the bookkeeping backlog (every invocation that is neither
completed nor suspended) takes to clear after the last decision, and the bytes kept per completed
run once the data dir stops changing, as Restate counts them (journal + state per service) and as
`du` sees the data dir grow.

`python -m bench.fleet [--runs N] [--concurrency C]` prints the figures as JSON; `fleet_figures`
is the same measurement for a driver of the main bench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.driver import Driver, bounded_gather, progress
from bench.paused import SERVER_LOG, SETTLE_INTERVAL_S, SETTLE_LIMIT_S
from bench.plan import quick_plan
from bench.probes import disk_usage
from bench.stack import Stack
from bench.subjects import Countersign, Floor, now

BYTES_PER_COMPLETED_TARGET = 16 * 1024
BACKLOG_TARGET_S = 10.0


async def _settled_usage(d: Driver) -> int:
    usage = disk_usage(d.stack.restate_dir, skip=SERVER_LOG).allocated
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_INTERVAL_S)
        again = disk_usage(d.stack.restate_dir, skip=SERVER_LOG).allocated
        if again == usage:
            break
        usage = again
    return usage


def _restate_bytes(d: Driver) -> dict[str, dict[str, int]]:
    journal = d.stack.restate.sql(
        "select i.target_service_name as s, sum(j.raw_length) as b, count(distinct j.id) as n from sys_journal j"
        " join sys_invocation i on j.id = i.id group by i.target_service_name"
    )
    state = d.stack.restate.sql(
        "select service_name as s, sum(length(value)) as b, count(*) as n from state group by service_name"
    )
    by_service: dict[str, dict[str, int]] = {}
    for kind, rows in (("journal", journal), ("state", state)):
        for row in rows:
            counts = by_service.setdefault(str(row["s"]), {"journal": 0, "state": 0})
            counts[kind] = int(row["b"] or 0)
    return by_service


async def _wait_backlog(d: Driver) -> float:
    """Until no invocation is in flight (only suspended or completed ones): the time it took."""
    t0 = now()
    await d.wait_quiet()
    return now() - t0


async def fleet_figures(d: Driver, runs: int) -> dict[str, Any]:
    cs = d.countersign
    before_disk = await _settled_usage(d)
    before_bytes = await asyncio.to_thread(_restate_bytes, d)
    ids = d.run_ids(cs, "fleet", runs)
    cs.new_orders(ids)
    progress(f"fleet: starting {runs} runs (one approver, one tool) at concurrency {d.plan.concurrency}")
    await bounded_gather((d.send(cs, run_id, cs.demo_task(run_id)) for run_id in ids), d.plan.concurrency)
    await d.wait_notified(cs, ids)
    await d.wait_suspended(cs, ids)
    await d.wait_quiet()
    progress("fleet: every run waits; reading the pages")
    approvals = await bounded_gather((cs.prepare(run_id) for run_id in ids), d.plan.concurrency)
    await d.wait_quiet()
    cpu = d.cpu(cs)
    progress(f"fleet: deciding {runs} approvals at concurrency {d.plan.concurrency}")
    with cpu.block():
        t0 = now()
        await bounded_gather((cs.decide(a) for a in approvals), d.plan.concurrency)
        last_decision = now()
        outputs = await bounded_gather((d.attach(cs, run_id) for run_id in ids), d.plan.concurrency)
        drained = now()
        backlog = await _wait_backlog(d)
    for run_id, output in zip(ids, outputs, strict=True):
        cs.check_done(run_id, output)
    after_disk = await _settled_usage(d)
    after_bytes = await asyncio.to_thread(_restate_bytes, d)
    restate_bytes = {
        service: {kind: counts[kind] - before_bytes.get(service, {}).get(kind, 0) for kind in ("journal", "state")}
        for service, counts in after_bytes.items()
    }
    total = sum(c["journal"] + c["state"] for c in restate_bytes.values())
    per_run = round(total / runs, 1)
    disk_per_run = round(max(0, after_disk - before_disk) / runs, 1)
    return {
        "runs": runs,
        "concurrency": d.plan.concurrency,
        "decisions_per_second": round(runs / (drained - t0), 2),
        "decide_seconds": round(last_decision - t0, 3),
        "drain_seconds": round(drained - t0, 3),
        "backlog_after_last_decision_seconds": round(max(drained, last_decision + backlog) - last_decision, 3),
        "cpu_ms_per_decision": cpu.ms_per_op(runs),
        "restate_bytes_per_completed_run": per_run,
        "restate_bytes_by_service": restate_bytes,
        "disk_bytes_per_completed_run": disk_per_run,
        "target_bytes_per_completed_run": BYTES_PER_COMPLETED_TARGET,
        "met_bytes": per_run <= BYTES_PER_COMPLETED_TARGET and disk_per_run <= BYTES_PER_COMPLETED_TARGET,
    }


async def _main(work: Path, runs: int, concurrency: int) -> dict[str, Any]:
    plan = quick_plan().with_overrides({"concurrency": concurrency, "timeout": 300.0})
    with ExitStack() as cleanup:
        stack = Stack.start(work, cleanup)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        async with (
            httpx.AsyncClient(base_url=stack.restate.ingress_url, timeout=300, trust_env=False, limits=limits) as ing,
            httpx.AsyncClient(timeout=300, trust_env=False, limits=limits) as pages,
        ):
            d = Driver(
                stack,
                plan,
                ing,
                Countersign(stack.countersign, stack.outbox, stack.db_path, pages),
                Floor(stack.floor, stack.markers, ing),
            )
            stop = asyncio.Event()
            watcher = asyncio.create_task(d.countersign.watcher.run(stop))
            try:
                return await fleet_figures(d, runs)
            finally:
                stop.set()
                await watcher


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description="Fleet figures of one approver, one tool.")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--keep-work", action="store_true")
    args = p.parse_args(argv)
    if not 1 <= args.runs <= 100_000:
        p.error("--runs must be 1..100000")
    work = Path(tempfile.mkdtemp(prefix="countersign-fleet-"))
    try:
        figures = asyncio.run(_main(work, args.runs, args.concurrency))
    finally:
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

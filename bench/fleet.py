"""Fleet figures: many runs of one approver and one tool, decided in a burst, against the floors.

Guarantee: every Countersign run is the README demo run (one approver, finance@example.com, one gated
tool, issue_refund), so every bookkeeping call of the burst targets what one approver and one tool
share; the library path's and the product floor's runs do the same look-up and gated refund; the bare
floor's runs do one step, notify and wait; all on the same restate-server, one system after the
other. Each figure counts only runs that ended as the scenario meant (`Subject.check_done`).
Figures: decisions drained per second at the plan's concurrency, CPU per decision (restate-server +
handlers), how long the bookkeeping backlog (every invocation neither completed nor suspended) takes
to clear after the last decision, and the bytes kept per completed run once the data dir stops
changing, as Restate counts them (journal + state of the system's services) and as `du` sees the
data dir grow.

`python -m bench --only fleet` runs it in the bench; `python -m bench.fleet [--runs N]` alone, printing JSON.
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
from bench.stats import ratio
from bench.subjects import Countersign, Floor, Library, ProductFloor, Subject, now, owns

DRAIN_TARGET = 0.6
CPU_TARGET = 3.0
BACKLOG_TARGET_S = 10.0
BYTES_PER_COMPLETED_TARGET = 16 * 1024


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
        "select i.target_service_name as s, sum(j.raw_length) as b from sys_journal j"
        " join sys_invocation i on j.id = i.id group by i.target_service_name"
    )
    state = d.stack.restate.sql("select service_name as s, sum(length(value)) as b from state group by service_name")
    by_service: dict[str, dict[str, int]] = {}
    for kind, rows in (("journal", journal), ("state", state)):
        for row in rows:
            by_service.setdefault(str(row["s"]), {"journal": 0, "state": 0})[kind] = int(row["b"] or 0)
    return by_service


def _task(d: Driver, subject: Subject, run_id: str) -> dict[str, Any]:
    if isinstance(subject, Countersign | ProductFloor):
        return subject.demo_task(run_id)
    return subject.waiting_task(run_id, 2)


async def _one(d: Driver, subject: Subject, runs: int) -> dict[str, Any]:
    """One system's burst: `runs` runs waiting at once, then decided with the plan's concurrency."""
    c = d.plan.concurrency
    before_disk = await _settled_usage(d)
    before_bytes = await asyncio.to_thread(_restate_bytes, d)
    ids = d.run_ids(subject, "fleet", runs)
    if isinstance(subject, Countersign | ProductFloor):
        subject.new_orders(ids)
    progress(f"fleet: {subject.name}: starting {runs} runs (one approver, one tool) at concurrency {c}")
    await bounded_gather((d.send(subject, run_id, _task(d, subject, run_id)) for run_id in ids), c)
    await d.wait_notified(subject, ids)
    await d.wait_suspended(subject, ids)
    await d.wait_quiet()
    approvals = await bounded_gather((subject.prepare(run_id) for run_id in ids), c)
    await d.wait_quiet()
    cpu = d.cpu(subject)
    progress(f"fleet: {subject.name}: deciding {runs} approvals at concurrency {c}")
    with cpu.block():
        t0 = now()
        await bounded_gather((subject.decide(a) for a in approvals), c)
        last_decision = now()
        outputs = await bounded_gather((d.attach(subject, run_id) for run_id in ids), c)
        drained = now()
        # The bookkeeping backlog: until nothing is in flight but suspended (or completed) invocations.
        await d.wait_quiet()
        quiet = now()
    for run_id, output in zip(ids, outputs, strict=True):
        subject.check_done(run_id, output)
    after_disk = await _settled_usage(d)
    after_bytes = await asyncio.to_thread(_restate_bytes, d)
    by_service = {
        service: {kind: counts[kind] - before_bytes.get(service, {}).get(kind, 0) for kind in ("journal", "state")}
        for service, counts in after_bytes.items()
        if owns(subject, service)
    }
    kept = sum(c["journal"] + c["state"] for c in by_service.values())
    return {
        "runs": runs,
        "decisions_per_second": round(runs / (drained - t0), 2),
        "decide_seconds": round(last_decision - t0, 3),
        "drain_seconds": round(drained - t0, 3),
        "backlog_after_last_decision_s": round(max(drained, quiet) - last_decision, 3),
        "runs_done_after_last_decision_s": round(drained - last_decision, 3),
        "bookkeeping_after_last_run_s": round(max(0.0, quiet - drained), 3),
        "cpu_ms_per_decision": cpu.ms_per_op(runs),
        "restate_bytes_per_completed_run": round(kept / runs, 1),
        "disk_bytes_per_completed_run": round(max(0, after_disk - before_disk) / runs, 1),
        "restate_bytes_by_service": by_service,
    }


def _cpu(figures: dict[str, Any]) -> float:
    return float(figures["cpu_ms_per_decision"]["restate"] + figures["cpu_ms_per_decision"]["app"])


async def fleet_runs(d: Driver, runs: int | None = None) -> dict[str, Any]:
    """Metrics `fleet_drain`, `fleet_cpu`, `fleet_backlog` and `fleet_completed_bytes`."""
    runs = runs or d.plan.fleet_runs
    found = {subject.name: await _one(d, subject, runs) for subject in d.subjects}
    fl, cs = found["floor"], found["countersign"]
    how = (
        f"{runs} runs per system wait at once (Countersign and the library path: the README demo run, all for "
        "finance@example.com and issue_refund; product floor: the same look-up and gated refund; bare floor: one "
        f"step, notify, wait), then {d.plan.concurrency} workers decide them (all but the bare floor through their "
        "approval page); drained = last run's output attached. Backlog: from the last decision until "
        "no invocation is in flight but suspended ones. CPU (restate-server + handlers) per decision covers "
        "decide -> backlog cleared. Bytes: growth of Restate's journal+state count of the system's services, and "
        "of `du` of the data dir (single node: the log is never trimmed), once the dir stopped changing."
    )
    drain: dict[str, Any] = {name: f["decisions_per_second"] for name, f in found.items()}
    drain |= {
        "ratio": ratio(cs["decisions_per_second"], fl["decisions_per_second"]),
        "target": f"countersign >= {DRAIN_TARGET}x floor decisions/s at c={d.plan.concurrency}, one approver, one tool",
        "how": how,
        "detail": found,
    }
    drain["met"] = drain["ratio"] >= DRAIN_TARGET
    cpu: dict[str, Any] = {name: round(_cpu(f), 2) for name, f in found.items()}
    cpu["target"] = f"<= {CPU_TARGET}x floor"
    cpu["ratio"] = ratio(cpu["countersign"], cpu["floor"])
    cpu["met"] = cpu["ratio"] <= CPU_TARGET
    backlog: dict[str, Any] = {name: f["backlog_after_last_decision_s"] for name, f in found.items()}
    backlog |= {
        "ratio": None,
        "target": f"bookkeeping cleared within {BACKLOG_TARGET_S:.0f} s of the last of {runs} decisions",
    }
    backlog["met"] = cs["backlog_after_last_decision_s"] <= BACKLOG_TARGET_S
    kept: dict[str, Any] = {
        name: [f["disk_bytes_per_completed_run"], f["restate_bytes_per_completed_run"]] for name, f in found.items()
    }
    kept |= {
        "ratio": ratio(cs["restate_bytes_per_completed_run"], fl["restate_bytes_per_completed_run"])
        if fl["restate_bytes_per_completed_run"]
        else None,
        "target": f"countersign <= {BYTES_PER_COMPLETED_TARGET // 1024} KB per completed run (audit trail included)",
    }
    kept["met"] = cs["restate_bytes_per_completed_run"] <= BYTES_PER_COMPLETED_TARGET
    if "library" in found:
        lib = found["library"]
        drain["library_ratio"] = ratio(lib["decisions_per_second"], fl["decisions_per_second"])
        cpu["library_ratio"] = ratio(cpu["library"], cpu["floor"])
        if fl["restate_bytes_per_completed_run"]:
            kept["library_ratio"] = ratio(lib["restate_bytes_per_completed_run"], fl["restate_bytes_per_completed_run"])
    return {"fleet_drain": drain, "fleet_cpu": cpu, "fleet_backlog": backlog, "fleet_completed_bytes": kept}


HEADLINES = {
    "fleet_drain": "decisions/s at c=16, one approver, one tool",
    "fleet_cpu": "CPU ms per decision (restate + handlers)",
    "fleet_backlog": "s from the last decision to an empty backlog",
    "fleet_completed_bytes": "bytes per completed run: du / Restate's journal+state count",
}


def headlines(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fleet rows of the bench's headline table (see bench.report.headlines)."""
    keys = ("floor", "countersign", "ratio", "target", "met", "library", "library_ratio")
    return {
        name: {"unit": unit, **{k: metrics[name][k] for k in keys if k in metrics[name]}}
        for name, unit in HEADLINES.items()
        if name in metrics
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
            agent = Countersign(stack.countersign, stack.outbox, stack.db_path, pages)
            product = ProductFloor(stack.product, stack.product_outbox, stack.product_db, pages)
            d = Driver(stack, plan, ing, agent, Floor(stack.floor, stack.markers, ing), Library(agent), product)
            stop = asyncio.Event()
            # One watcher per folder: the agent and the library path share the outbox.
            watchers = [asyncio.create_task(w.run(stop)) for w in d.watchers]
            try:
                return await fleet_runs(d, runs)
            finally:
                stop.set()
                await asyncio.gather(*watchers)


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

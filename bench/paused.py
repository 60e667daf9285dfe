"""Runs that wait: how fast they can be started into the paused state, and what each one costs at rest.

Guarantee: runs are started by a closed loop of `concurrency` workers (each starts a run and waits for
its approval notification before starting the next), so the offered load is bounded; disk and memory
are read only once every run of the batch is suspended in Restate (no handler attempt open).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.driver import Driver, progress
from bench.probes import disk_usage, rss_bytes
from bench.stats import ratio
from bench.subjects import Subject, now

THROUGHPUT_TARGET = 0.5
DISK_TARGET_BYTES = 8 * 1024
RSS_FLAT_FRACTION = 0.2
"""The handler's RSS may grow by at most this fraction from the first to the last paused size."""


async def _closed_loop(d: Driver, subject: Subject, tasks: dict[str, dict[str, Any]]) -> float:
    """Start every run with `concurrency` in flight; seconds from the first start to the last notification."""
    pending = iter(tasks.items())

    async def worker() -> None:
        for run_id, task in pending:
            await d.send(subject, run_id, task)
            await subject.watcher.wait(run_id, d.plan.timeout)

    t0 = now()
    await asyncio.gather(*(worker() for _ in range(d.plan.concurrency)))
    return max(subject.watcher.times[run_id] for run_id in tasks) - t0


def _task(d: Driver, subject: Subject, run_id: str) -> dict[str, Any]:
    if subject is d.countersign:
        return d.countersign.demo_task(run_id)
    return subject.waiting_task(run_id, 2)


async def paused_runs(d: Driver) -> dict[str, Any]:
    """Metrics `start_to_paused_throughput` and `paused_cost`."""
    sizes = d.plan.paused_sizes
    throughput: dict[str, Any] = {}
    cost: dict[str, Any] = {"sizes": list(sizes)}
    base = {s.name: await d.count_suspended(s) for s in d.subjects}
    points: dict[str, list[dict[str, Any]]] = {s.name: [] for s in d.subjects}
    for subject in d.subjects:
        points[subject.name].append(_reading(d, subject, 0))

    previous = 0
    for size in sizes:
        for subject in (d.countersign, d.floor):
            batch = size - previous
            ids = d.run_ids(subject, f"p{size}", batch)
            if subject is d.countersign:
                d.countersign.new_orders(ids)
            tasks = {run_id: _task(d, subject, run_id) for run_id in ids}
            progress(f"paused: {subject.name} +{batch} runs at concurrency {d.plan.concurrency} (to {size})")
            disk_before = disk_usage(d.stack.restate_dir)
            cpu = d.cpu(subject)
            with cpu.block():
                seconds = await _closed_loop(d, subject, tasks)
                await _until_suspended(d, subject, base[subject.name] + size)
            reading = _reading(d, subject, size)
            reading["batch_disk_bytes"] = reading["disk_bytes"] - disk_before.allocated
            reading["batch_apparent_bytes"] = reading["apparent_bytes"] - disk_before.apparent
            points[subject.name].append(reading)
            if size == sizes[0]:
                throughput[subject.name] = {
                    "runs": batch,
                    "seconds": round(seconds, 3),
                    "per_second": round(batch / seconds, 2),
                    "cpu_ms_per_op": cpu.ms_per_op(batch),
                }
        previous = size

    throughput["ratio"] = ratio(throughput["countersign"]["per_second"], throughput["floor"]["per_second"])
    throughput["target"] = f"countersign >= {THROUGHPUT_TARGET:.0%} of floor runs/s"
    throughput["met"] = throughput["ratio"] >= THROUGHPUT_TARGET
    throughput["how"] = (
        f"closed loop, {d.plan.concurrency} workers: start (run/send) then wait for the run's notification file; "
        "runs/s = runs / (first start -> last notification mtime). CPU per run covers start -> suspended. "
        "Countersign: the README demo run (look-up, then a gated refund); floor: steps of one turn, notify, wait."
    )

    for subject in d.subjects:
        readings = points[subject.name]
        paused = readings[-1]["paused"]
        # Disk grows under both systems' batches; each system is charged only its own batches.
        own_bytes = sum(r["batch_disk_bytes"] for r in readings[1:])
        first = readings[1] if len(readings) > 2 else readings[0]
        cost[subject.name] = {
            "points": readings,
            "disk_bytes_per_run": round(max(0, own_bytes) / paused, 1),
            "rss_growth_fraction": round(max(0, readings[-1]["rss_app"] - first["rss_app"]) / first["rss_app"], 3),
        }
    cs = cost["countersign"]
    floor_bytes = cost["floor"]["disk_bytes_per_run"]
    cost["ratio_disk"] = ratio(cs["disk_bytes_per_run"], floor_bytes) if floor_bytes > 0 else None
    cost["target"] = (
        f"countersign <= {DISK_TARGET_BYTES // 1024} KB of restate data per paused run; handler RSS flat "
        f"(<= {RSS_FLAT_FRACTION:.0%} growth from the first to the last size, or from idle with one size)"
    )
    cost["met"] = cs["disk_bytes_per_run"] <= DISK_TARGET_BYTES and cs["rss_growth_fraction"] <= RSS_FLAT_FRACTION
    cost["how"] = (
        "`du` (allocated blocks) of the restate-server base dir and VmRSS of each process, read once every run "
        "of the batch is suspended; bytes per run = growth of the data dir during the system's own batches / its "
        "paused runs. RSS growth: app VmRSS at the last size vs the first (vs idle when there is one size)."
    )
    return {"start_to_paused_throughput": throughput, "paused_cost": cost}


async def _until_suspended(d: Driver, subject: Subject, total: int) -> None:
    deadline = asyncio.get_running_loop().time() + d.plan.timeout
    while await d.count_suspended(subject) < total:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{subject.name}: fewer than {total} runs suspended after {d.plan.timeout}s")
        await asyncio.sleep(0.25)


def _reading(d: Driver, subject: Subject, paused: int) -> dict[str, Any]:
    usage = disk_usage(d.stack.restate_dir)
    return {
        "paused": paused,
        "disk_bytes": usage.allocated,
        "apparent_bytes": usage.apparent,
        "rss_app": rss_bytes(subject.app.pid),
        "rss_restate": rss_bytes(d.stack.restate.pid),
    }

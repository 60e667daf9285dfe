"""Runs that wait: how fast they can be started into the paused state, and what each one costs at rest.

Guarantee: runs are started by a closed loop of `concurrency` workers (each starts a run and waits for
its approval notification before starting the next), so the offered load is bounded. They run on a
restate-server per system (every handler deployment registered; the agent and the library path are
two systems here, each on its own server), so a data dir holds nothing but
one system's paused runs and what they caused; disk, Restate's own byte counts and memory are read only once
every run of the batch is suspended, nothing else is in flight, and the data dir has stopped changing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import AsyncExitStack
from typing import Any

import httpx
from support.processes import RestateServer

from bench.driver import Driver, progress
from bench.probes import disk_usage, rss_bytes
from bench.stats import ratio
from bench.subjects import Countersign, ProductFloor, Subject, now, owns

THROUGHPUT_TARGET = 0.5
DISK_TARGET_BYTES = 8 * 1024
RSS_FLAT_FRACTION = 0.2
"""The handler's RSS may grow by at most this fraction from the first to the last paused size."""
SETTLE_LIMIT_S = 20.0
SETTLE_INTERVAL_S = 0.5
SERVER_LOG = (".log",)


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
    # The agent, the library path and the product floor: a look-up, then the gated refund.
    if isinstance(subject, Countersign | ProductFloor):
        return subject.demo_task(run_id)
    return subject.waiting_task(run_id, 2)


async def paused_runs(d: Driver) -> dict[str, Any]:
    """Metrics `start_to_paused_throughput` and `paused_cost`, each system on a restate-server of its own."""
    servers: list[RestateServer] = []
    try:
        async with AsyncExitStack() as clients:
            drivers: dict[str, Driver] = {}
            for subject in d.subjects:
                base_dir = d.stack.restate_dir.parent / f"restate-paused-{subject.name}"
                restate = await asyncio.to_thread(d.stack.second_restate, base_dir)
                servers.append(restate)
                ingress = await clients.enter_async_context(
                    httpx.AsyncClient(
                        base_url=restate.ingress_url,
                        timeout=d.plan.timeout,
                        trust_env=False,
                        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
                    )
                )
                own = dataclasses.replace(d.stack, restate=restate, restate_dir=base_dir)
                drivers[subject.name] = dataclasses.replace(d, stack=own, ingress=ingress)
            return await _measure(d, drivers)
    finally:
        await asyncio.gather(*(asyncio.to_thread(server.stop) for server in servers))


async def _measure(d: Driver, drivers: dict[str, Driver]) -> dict[str, Any]:
    sizes = d.plan.paused_sizes
    throughput: dict[str, Any] = {}
    points: dict[str, list[dict[str, Any]]] = {}
    for subject in d.subjects:
        points[subject.name] = [_for(subject, await _reading(drivers[subject.name]), 0)]

    previous = 0
    for size in sizes:
        for subject in (d.countersign, d.library, d.product, d.floor):
            own = drivers[subject.name]
            batch = size - previous
            ids = d.run_ids(subject, f"p{size}", batch)
            if isinstance(subject, Countersign | ProductFloor):
                subject.new_orders(ids)
            tasks = {run_id: _task(d, subject, run_id) for run_id in ids}
            progress(f"paused: {subject.name} +{batch} runs at concurrency {d.plan.concurrency} (to {size})")
            cpu = own.cpu(subject)
            with cpu.block():
                seconds = await _closed_loop(own, subject, tasks)
                await own.wait_suspended(subject, ids)
                await own.wait_quiet()
            point = _for(subject, await _reading(own), size)
            point["batch_seconds"] = round(seconds, 3)
            point["batch_per_second"] = round(batch / seconds, 2)
            points[subject.name].append(point)
            if size == sizes[0]:
                throughput[subject.name] = {
                    "runs": batch,
                    "seconds": round(seconds, 3),
                    "per_second": round(batch / seconds, 2),
                    "cpu_ms_per_op": cpu.ms_per_op(batch),
                }
        previous = size
    return {"start_to_paused_throughput": _throughput(d, throughput), "paused_cost": _cost(d, sizes, points)}


def _throughput(d: Driver, throughput: dict[str, Any]) -> dict[str, Any]:
    throughput["ratio"] = ratio(throughput["countersign"]["per_second"], throughput["floor"]["per_second"])
    throughput["target"] = f"countersign >= {THROUGHPUT_TARGET:.0%} of floor runs/s"
    throughput["met"] = throughput["ratio"] >= THROUGHPUT_TARGET
    throughput["library_ratio"] = ratio(throughput["library"]["per_second"], throughput["floor"]["per_second"])
    throughput["how"] = (
        f"closed loop, {d.plan.concurrency} workers: start (run/send) then wait for the run's notification file; "
        "runs/s = runs / (first start -> last notification mtime), first paused batch. CPU per run covers start "
        "-> suspended. Countersign: the README demo run (look-up, then a gated refund); floor: steps of one "
        "turn, notify, wait; library: the same look-up and gated refund from BenchLibrary through gated_call (its "
        "ratio: library_ratio). Later batches' rates are in paused_cost points (batch_per_second)."
    )
    return throughput


def _cost(d: Driver, sizes: tuple[int, ...], points: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    cost: dict[str, Any] = {"sizes": list(sizes)}
    for subject in d.subjects:
        readings = points[subject.name]
        paused = readings[-1]["paused"]
        own_bytes = readings[-1]["disk_bytes"] - readings[0]["disk_bytes"]
        first = readings[1] if len(readings) > 2 else readings[0]
        cost[subject.name] = {
            "points": readings,
            "disk_bytes_per_run": round(max(0, own_bytes) / paused, 1),
            "restate_bytes_per_run": round(readings[-1]["restate_bytes"] / paused, 1),
            "rss_growth_fraction": round(max(0, readings[-1]["rss_app"] - first["rss_app"]) / first["rss_app"], 3),
        }
    cs, floor = cost["countersign"], cost["floor"]
    cost["ratio_disk"] = (
        ratio(cs["disk_bytes_per_run"], floor["disk_bytes_per_run"]) if floor["disk_bytes_per_run"] else None
    )
    cost["ratio_restate_bytes"] = ratio(cs["restate_bytes_per_run"], floor["restate_bytes_per_run"])
    cost["library_ratio_restate_bytes"] = ratio(
        cost["library"]["restate_bytes_per_run"], floor["restate_bytes_per_run"]
    )
    cost["target"] = (
        f"countersign <= {DISK_TARGET_BYTES // 1024} KB of restate data per paused run; handler RSS flat "
        f"(<= {RSS_FLAT_FRACTION:.0%} growth from the first to the last size, or from idle with one size)"
    )
    cost["met"] = cs["disk_bytes_per_run"] <= DISK_TARGET_BYTES and cs["rss_growth_fraction"] <= RSS_FLAT_FRACTION
    cost["how"] = (
        "on a restate-server per system holding only its paused runs: `du` (allocated blocks, server log "
        "excluded) of the data dir once every run of the batch is suspended, no other invocation is in flight and "
        "the dir stopped changing; disk "
        "bytes per run = growth from the idle server / paused runs. restate_bytes = Restate's own count of "
        "journal bytes (sys_journal.raw_length) plus state bytes, of the system's services (Countersign: AgentRun "
        "and the objects its runs notify; library: BenchLibrary, Approval and those objects). RSS growth: "
        "handler VmRSS at the last size vs the first (vs idle with one size)."
    )
    return cost


async def _reading(d: Driver) -> dict[str, Any]:
    """Disk (after it settles), Restate's byte counts per service, and every process's RSS."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    usage = disk_usage(d.stack.restate_dir, skip=SERVER_LOG)
    while time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_INTERVAL_S)
        again = disk_usage(d.stack.restate_dir, skip=SERVER_LOG)
        if again.allocated == usage.allocated:
            break
        usage = again
    journal = await asyncio.to_thread(
        d.stack.restate.sql,
        "select i.target_service_name as s, sum(j.raw_length) as b from sys_journal j"
        " join sys_invocation i on j.id = i.id group by i.target_service_name",
    )
    state = await asyncio.to_thread(
        d.stack.restate.sql, "select service_name as s, sum(length(value)) as b from state group by service_name"
    )
    by_service: dict[str, dict[str, int]] = {}
    for kind, rows in (("journal", journal), ("state", state)):
        for row in rows:
            by_service.setdefault(str(row["s"]), {"journal": 0, "state": 0})[kind] = int(row["b"] or 0)
    return {
        "disk_bytes": usage.allocated,
        "apparent_bytes": usage.apparent,
        "by_service": by_service,
        "rss": {s.name: rss_bytes(s.app.pid) for s in d.subjects},
        "rss_restate": rss_bytes(d.stack.restate.pid),
    }


def _for(subject: Subject, reading: dict[str, Any], paused: int) -> dict[str, Any]:
    """One system's view of a reading: its services' bytes (see `subjects.owns`)."""
    mine = {name: counts for name, counts in reading["by_service"].items() if owns(subject, name)}
    return {
        "paused": paused,
        "disk_bytes": reading["disk_bytes"],
        "apparent_bytes": reading["apparent_bytes"],
        "restate_bytes": sum(c["journal"] + c["state"] for c in mine.values()),
        "by_service": mine,
        "rss_app": reading["rss"][subject.name],
        "rss_restate": reading["rss_restate"],
    }

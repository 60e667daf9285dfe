"""Recovery: kill -9 the handler process while runs are mid-flight, restart it, time the drain.

Guarantee: each system first runs the same batch without a crash (the reference drain time), then
again with a SIGKILL of its handler process at 30% of that time; every run must still complete, and
for Countersign every run's refund must exist exactly once with its order refunded exactly once
(checked in the SQLite business database), or the figure is reported as failed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.driver import Driver, progress
from bench.subjects import AUTONOMOUS_AMOUNT, BenchError, Subject, now

KILL_AT = 0.3
"""When to kill, as a fraction of the crash-free drain time."""
DRAIN_TARGET_S = 5.0


def _tasks(d: Driver, subject: Subject, ids: list[str]) -> dict[str, dict[str, Any]]:
    turns = d.plan.crash_turns
    if subject is d.countersign:
        d.countersign.new_orders(ids)
        before = turns // 2
        return {run_id: d.countersign.refund_steps_task(run_id, before, turns - before - 1) for run_id in ids}
    return {run_id: subject.steps_task(run_id, turns * d.floor.steps_per_turn) for run_id in ids}


async def _round(d: Driver, subject: Subject, kill_after: float | None) -> dict[str, Any]:
    ids = d.run_ids(subject, "crash" if kill_after is not None else "base", d.plan.crash_runs)
    tasks = _tasks(d, subject, ids)
    finished: dict[str, float] = {}
    outputs: dict[str, dict[str, Any]] = {}

    async def follow(run_id: str) -> None:
        outputs[run_id] = await d.attach(subject, run_id)
        finished[run_id] = now()

    t0 = now()
    await d.start_all(subject, tasks)
    followers = [asyncio.create_task(follow(run_id)) for run_id in ids]
    report: dict[str, Any] = {"runs": len(ids)}
    if kill_after is not None:
        await asyncio.sleep(max(0.0, t0 + kill_after - now()))
        killed = now()
        subject.app.kill9()
        report["completed_before_kill"] = len(finished)
        await asyncio.to_thread(subject.app.restart)
        healthy = now()
        report["kill_at_s"] = round(killed - t0, 3)
        report["restart_s"] = round(healthy - killed, 3)
    await asyncio.wait_for(asyncio.gather(*followers), d.plan.timeout)
    last = max(finished.values())
    report["total_s"] = round(last - t0, 3)
    if kill_after is not None:
        report["drain_after_restart_s"] = round(max(0.0, last - healthy), 3)
    if subject is d.countersign:
        report.update(_check_refunds(d, outputs))
    return report


def _check_refunds(d: Driver, outputs: dict[str, dict[str, Any]]) -> dict[str, int]:
    cents = int(float(AUTONOMOUS_AMOUNT) * 100)
    for run_id, output in outputs.items():
        if output.get("status") != "completed":
            raise BenchError(f"{run_id} did not complete after the crash: {str(output)[:300]}")
    found = d.countersign.refunds(list(outputs))
    missing = sum(1 for rows, _ in found.values() if rows == 0)
    duplicates = sum(max(0, rows - 1) for rows, _ in found.values())
    over_refunded = sum(1 for rows, refunded in found.values() if rows and refunded != cents)
    return {"missing_effects": missing, "duplicate_effects": duplicates + over_refunded}


async def crash_recovery(d: Driver) -> dict[str, Any]:
    """Metric `crash_recovery`."""
    metric: dict[str, Any] = {}
    for subject in d.pair:
        progress(f"crash: {subject.name}, {d.plan.crash_runs} runs of {d.plan.crash_turns} turns, reference round")
        reference = await _round(d, subject, None)
        progress(f"crash: {subject.name}, kill -9 of the handler at {KILL_AT:.0%} of {reference['total_s']}s")
        crashed = await _round(d, subject, KILL_AT * reference["total_s"])
        metric[subject.name] = {"reference": reference, "crashed": crashed}
    cs = metric["countersign"]["crashed"]
    metric["target"] = f"all runs complete <= {DRAIN_TARGET_S:g}s after the restarted handler is healthy; 0 duplicates"
    metric["met"] = (
        cs["drain_after_restart_s"] <= DRAIN_TARGET_S and cs["duplicate_effects"] == 0 and cs["missing_effects"] == 0
    )
    metric["how"] = (
        "all runs started at once (run/send), followed with attach; SIGKILL of the handler's process group, "
        "restart on the same port (time to /healthz = restart_s), drain = last completion - healthy. "
        "Countersign runs: look-ups around one autonomous $100 refund; floor: the same number of journaled steps."
    )
    return {"crash_recovery": metric}

"""Cost of one more step: run latency and CPU as a line over the number of steps, for both systems.

Guarantee: a Countersign "step" is one scripted autonomous tool call (a model turn, the policy, the
tool, the state update, the cancel check); how many journal entries that really is, is read back from
Restate's own journal (`sys_journal`) of runs held waiting on a gated refund after their steps (a
finished run keeps no journal), never assumed, so the per-journaled-step figure compares like
with like against the floor's one `ctx.run` per step.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.driver import Driver, progress, sql_literal
from bench.probes import CpuAccount
from bench.stats import fit_line, latency_summary, ratio
from bench.subjects import Subject

RATIO_TARGET = 1.3


async def _journal_counts(d: Driver, service: str, run_id: str) -> dict[str, int]:
    rows = await asyncio.to_thread(
        d.stack.restate.sql,
        "select j.entry_type as t, count(*) as n from sys_journal j join sys_invocation i on j.id = i.id"  # noqa: S608
        f" where i.target_service_name = {sql_literal(service)} and i.target_service_key = {sql_literal(run_id)}"
        " and i.target_handler_name = 'run' group by j.entry_type",
    )
    return {str(row["t"]): int(row["n"]) for row in rows}


async def _waiting_journals(d: Driver, low: int, high: int) -> tuple[dict[str, int], dict[str, int]]:
    """The journal entry counts of two Countersign runs of `low` and `high` steps, read while each
    waits on a gated refund after its steps: a finished run keeps no journal (countersign.retention).
    The gate's own entries are the same in both and drop out of the difference. The runs are then
    approved and run to their end, so they leave nothing waiting behind."""
    cs = d.countersign
    ids = {n: d.run_ids(cs, f"sj{n}", 1)[0] for n in (low, high)}
    for n, run_id in ids.items():
        await d.send(cs, run_id, cs.waiting_task(run_id, n + 1))
    await d.wait_notified(cs, ids.values())
    await d.wait_suspended(cs, list(ids.values()))
    counts = {n: await _journal_counts(d, cs.service, run_id) for n, run_id in ids.items()}
    for run_id in ids.values():
        await cs.decide(await cs.prepare(run_id))
        cs.check_done(run_id, await d.attach(cs, run_id))
    return counts[low], counts[high]


def _per_step(low: dict[str, int], high: dict[str, int], steps: int) -> dict[str, float]:
    def count(counts: dict[str, int], prefix: str, exclude: tuple[str, ...] = ()) -> int:
        return sum(n for t, n in counts.items() if t.startswith(prefix) and t not in exclude)

    boundary = ("Command: Input", "Command: Output")
    return {
        "run_steps": (count(high, "Command: Run") - count(low, "Command: Run")) / steps,
        "awaited_commands": (count(high, "Notification:") - count(low, "Notification:")) / steps,
        "all_commands": (count(high, "Command:", boundary) - count(low, "Command:", boundary)) / steps,
    }


async def step_overhead(d: Driver) -> dict[str, Any]:
    """Metric `step_overhead`; also sets the floor's steps per model turn from the journal."""
    counts = sorted(d.plan.step_counts)
    latencies: dict[str, dict[int, list[float]]] = {s.name: {n: [] for n in counts} for s in d.pair}
    accounts: dict[str, dict[int, CpuAccount]] = {s.name: {n: d.cpu(s) for n in counts} for s in d.pair}
    progress(f"step overhead: {counts} steps, {d.plan.step_samples} runs each per system")
    for n in counts:
        for _ in range(d.plan.step_samples):
            for subject in d.pair:
                [run_id] = d.run_ids(subject, f"st{n}", 1)
                task = subject.steps_task(run_id, n)
                with accounts[subject.name][n].block():
                    t0 = time.perf_counter()
                    await d.call(subject, run_id, task)
                    latencies[subject.name][n].append((time.perf_counter() - t0) * 1000)

    metric: dict[str, Any] = {"steps": counts}
    for subject in d.pair:
        metric[subject.name] = _line(subject, counts, latencies[subject.name], accounts[subject.name])
    low, high = counts[0], counts[-1]
    journal_low, journal_high = await _waiting_journals(d, low, high)
    per_step = _per_step(journal_low, journal_high, high - low)
    cs = metric["countersign"]
    cs["journal_entries_per_step"] = {k: round(v, 3) for k, v in per_step.items()}
    cs["slope_ms_per_journaled_step"] = round(cs["slope_ms_per_step"] / per_step["awaited_commands"], 3)
    cs["cpu_ms_per_journaled_step"] = {
        k: round(v / per_step["awaited_commands"], 3) for k, v in cs["cpu_ms_per_step"].items()
    }
    metric["ratio"] = ratio(cs["slope_ms_per_journaled_step"], metric["floor"]["slope_ms_per_step"])
    metric["ratio_per_script_step"] = ratio(cs["slope_ms_per_step"], metric["floor"]["slope_ms_per_step"])
    metric["target"] = f"countersign slope per journaled step <= {RATIO_TARGET:g}x floor slope per step"
    metric["met"] = metric["ratio"] <= RATIO_TARGET
    metric["how"] = (
        "slope of the p50 of a whole run (POST /<service>/<id>/run, blocking) over the step count. Countersign "
        "step = one scripted autonomous lookup_order call; journaled step = a journal command the handler awaits "
        "(counted in sys_journal: Run and PeekPromise), so per-journaled-step = per-step slope / that count. "
        "Floor step = one no-op ctx.run."
    )
    d.floor.steps_per_turn = max(1, round(per_step["awaited_commands"]))
    return {"step_overhead": metric}


def _line(
    subject: Subject, counts: list[int], latencies: dict[int, list[float]], accounts: dict[int, CpuAccount]
) -> dict[str, Any]:
    points = []
    for n in counts:
        summary = latency_summary(latencies[n])
        points.append({"steps": n, **summary, "cpu_ms_per_run": accounts[n].ms_per_op(len(latencies[n]))})
    slope, intercept = fit_line(counts, [p["p50"] for p in points])
    cpu_slopes = {}
    for proc in ("restate", "app"):
        cpu_slopes[proc] = round(max(fit_line(counts, [p["cpu_ms_per_run"][proc] for p in points])[0], 0.0), 3)
    return {
        "slope_ms_per_step": round(max(slope, 0.0), 3),
        "intercept_ms": round(max(intercept, 0.0), 3),
        "cpu_ms_per_step": cpu_slopes,
        "points": points,
    }

"""Latency of the approval path, one run at a time: start -> notification handed over, approver's
POST -> action done and recorded, and the same POST after long journals (resume after N model turns).

Start -> notification is measured twice. Back to back (`start_to_email`), each start follows the
previous run's notification at once, so it meets whatever that run still does after it (Countersign:
the bookkeeping call and the start of the approval's workflow; the floor: nothing). With a think
time (`start_to_email_alone`), each start waits `plan.think_ms` after the previous notification, the
way approvals arrive from people rather than from a loop, so the figure is one run's own path.

Guarantee: the systems (bare floor, product floor, agent, library path; resume: bare floor and
agent) are measured in alternating blocks of the same size, so load from other processes on the
machine hits them alike; CPU is accounted per block (the approver's page view before
the timed POST is outside both the timing and the CPU figures); every run is checked to have
completed with its action executed before its sample counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from bench.driver import Driver, progress
from bench.probes import CpuAccount
from bench.stats import latency_summary, ratio
from bench.subjects import Approval, Subject, now


def _blocks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def _notify_one(d: Driver, subject: Subject, run_id: str, turns: int) -> float:
    task = subject.waiting_task(run_id, turns)
    t0 = now()
    await d.send(subject, run_id, task)
    return (await subject.watcher.wait(run_id, d.plan.timeout) - t0) * 1000


async def _approve_one(d: Driver, subject: Subject, run_id: str, approval: Approval) -> tuple[float, float, float]:
    """(POST -> run completed, POST -> action ran, POST -> page answered), in ms."""
    t0 = now()
    attach = asyncio.create_task(d.attach(subject, run_id))
    await asyncio.sleep(0)  # let the attach request go out first
    await subject.decide(approval)
    answered = now()
    output = await attach
    done = now()
    acted = subject.check_done(run_id, output)
    return (done - t0) * 1000, (acted - t0) * 1000, (answered - t0) * 1000


async def approve_samples(
    d: Driver, ids: dict[str, list[str]], accounts: dict[str, CpuAccount], subjects: tuple[Subject, ...]
) -> dict[str, list[tuple[float, float, float]]]:
    """Approve every run, alternating blocks of the systems; the page view is done before each block."""
    samples: dict[str, list[tuple[float, float, float]]] = {s.name: [] for s in subjects}
    blocks = {s.name: list(_blocks(ids[s.name], d.plan.block)) for s in subjects}
    for i in range(max(len(b) for b in blocks.values())):
        for subject in subjects:
            if i >= len(blocks[subject.name]):
                continue
            prepared = [await subject.prepare(run_id) for run_id in blocks[subject.name][i]]
            with accounts[subject.name].block():
                for approval in prepared:
                    samples[subject.name].append(await _approve_one(d, subject, approval.run_id, approval))
    return samples


async def warm_up(d: Driver) -> None:
    for subject in d.subjects:
        for run_id in d.run_ids(subject, "warm", d.plan.warmup):
            await _notify_one(d, subject, run_id, 1)
            await _approve_one(d, subject, run_id, await subject.prepare(run_id))


async def _start_to_email(d: Driver, ids: dict[str, list[str]], think_ms: float) -> dict[str, Any]:
    """start -> notification for `ids`, in alternating blocks; per system the summary and CPU per run."""
    cpu = {s.name: d.cpu(s) for s in d.subjects}
    took: dict[str, list[float]] = {s.name: [] for s in d.subjects}
    blocks = {s.name: list(_blocks(ids[s.name], d.plan.block)) for s in d.subjects}
    for i in range(len(blocks["floor"])):
        for subject in d.subjects:
            with cpu[subject.name].block():
                for run_id in blocks[subject.name][i]:
                    took[subject.name].append(await _notify_one(d, subject, run_id, 1))
                    if think_ms:  # load shape, not synchronisation: nothing is waited for (untimed)
                        await asyncio.sleep(think_ms / 1000)
    n = len(ids["floor"])
    return {s: {**latency_summary(took[s]), "cpu_ms_per_op": cpu[s].ms_per_op(n)} for s in took}


async def approval_path(d: Driver) -> dict[str, Any]:
    """Metrics `start_to_email`, `start_to_email_alone` and `approve_to_done` (the runs of both
    start passes are approved)."""
    n = d.plan.latency_samples
    ids = {s.name: d.run_ids(s, "lat", n) for s in d.subjects}
    alone_ids = {s.name: d.run_ids(s, "alone", n) for s in d.subjects}
    d.countersign.new_orders(ids["countersign"] + ids["library"] + alone_ids["countersign"] + alone_ids["library"])
    d.product.new_orders(ids["product_floor"] + alone_ids["product_floor"])
    progress(f"start -> email: {n} runs per system, back to back, blocks of {d.plan.block}")
    email_metric = await _start_to_email(d, ids, 0.0)
    progress(f"start -> email: {n} runs per system, {d.plan.think_ms:g} ms think time after each email")
    alone_metric = await _start_to_email(d, alone_ids, d.plan.think_ms)

    progress("waiting for every run to suspend, then approving one at a time")
    every = {name: ids[name] + alone_ids[name] for name in ids}
    for subject in d.subjects:
        await d.wait_suspended(subject, every[subject.name])
    approve_cpu = {s.name: d.cpu(s) for s in d.subjects}
    approved = await approve_samples(d, every, approve_cpu, d.subjects)

    done_metric: dict[str, Any] = {}
    for subject in d.subjects:
        name = subject.name
        done, acted, answered = zip(*approved[name], strict=True)
        done_metric[name] = {
            **latency_summary(done),
            "cpu_ms_per_op": approve_cpu[name].ms_per_op(len(every[name])),
            "to_action": latency_summary(acted),
            "post_answered": latency_summary(answered),
        }
    for metric, limit in ((email_metric, 2.0), (alone_metric, 2.0), (done_metric, 2.0)):
        metric["ratio_p50"] = ratio(metric["countersign"]["p50"], metric["floor"]["p50"])
        metric["library_ratio_p50"] = ratio(metric["library"]["p50"], metric["floor"]["p50"])
        metric["target"] = f"countersign p50 <= {limit:g}x floor p50"
        metric["met"] = metric["ratio_p50"] <= limit
    email_metric["how"] = (
        "client clock before POST /<service>/<id>/run/send -> mtime of the notification file written inside the "
        "journaled mail step (Countersign: the outbox .eml; floor: a marker written the same way). Countersign "
        "runs a one-step script whose refund is gated; the library path (a user's workflow, BenchLibrary) calls "
        "gated_call for the same refund. ratio_p50 is the agent's, library_ratio_p50 the library path's. Back to "
        "back: each start follows the previous notification at once."
    )
    alone_metric["how"] = (
        f"as start_to_email, with {d.plan.think_ms:g} ms of think time after each notification before the next "
        "start: each run meets a system no longer busy with the previous one (Countersign's work after the email, "
        "its bookkeeping call and the approval workflow's start, is not on this run's path)."
    )
    alone_metric["think_ms"] = d.plan.think_ms
    done_metric["how"] = (
        "client clock before the approver's POST (Countersign: the approval page's form, after an untimed page "
        "view, for the agent and the library path alike; floor: POST /BenchFloor/<id>/decide) -> the attach "
        "call returns the run's output; every run was suspended before. to_action: -> the action's own "
        "timestamp (refund row created_at / journaled time). The runs of both start -> email passes. The product "
        "floor is decided like the agent, on its own emailed page (GET untimed, POST timed)."
    )
    return {"start_to_email": email_metric, "start_to_email_alone": alone_metric, "approve_to_done": done_metric}


async def resume_after_turns(d: Driver) -> dict[str, Any]:
    """Metric `resume_after_turns`: approver POST -> done, after N model turns of journal."""
    result: dict[str, Any] = {}
    n = d.plan.resume_samples
    ids = {turns: {s.name: d.run_ids(s, f"res{turns}", n) for s in d.pair} for turns in d.plan.resume_turns}
    progress(f"resume after {', '.join(map(str, d.plan.resume_turns))} turns: {n} runs each per system")
    for turns, by_system in ids.items():
        d.countersign.new_orders(by_system["countersign"])
        for subject in d.pair:
            tasks = {run_id: subject.waiting_task(run_id, turns) for run_id in by_system[subject.name]}
            await d.start_all(subject, tasks)
    for subject in d.pair:
        everyone = [run_id for by_system in ids.values() for run_id in by_system[subject.name]]
        await d.wait_notified(subject, everyone)
        await d.wait_suspended(subject, everyone)
    for turns, by_system in ids.items():
        cpu = {s.name: d.cpu(s) for s in d.pair}
        approved = await approve_samples(d, by_system, cpu, d.pair)
        for subject in d.pair:
            done = [sample[0] for sample in approved[subject.name]]
            entry = {**latency_summary(done), "cpu_ms_per_op": cpu[subject.name].ms_per_op(n)}
            result.setdefault(subject.name, {})[str(turns)] = entry
    low, high = str(min(d.plan.resume_turns)), str(max(d.plan.resume_turns))
    metric: dict[str, Any] = {
        **result,
        "turns": list(d.plan.resume_turns),
        "floor_steps_per_turn": d.floor.steps_per_turn,
        "ratio_p50": ratio(result["countersign"][high]["p50"], result["countersign"][low]["p50"]),
        "floor_ratio_p50": ratio(result["floor"][high]["p50"], result["floor"][low]["p50"]),
        "target": f"countersign p50 after {high} turns <= 3x p50 after {low} turns",
        "how": (
            "runs of N-1 autonomous look-ups then a gated refund (N model turns before the approval); the floor "
            "journals (N-1) x floor_steps_per_turn bare steps first. Approver POST -> output, all runs suspended."
        ),
    }
    metric["met"] = metric["ratio_p50"] <= 3.0
    slope = (result["countersign"][high]["p50"] - result["countersign"][low]["p50"]) / (int(high) - int(low))
    metric["ms_per_turn_of_journal"] = round(max(slope, 0.0), 3)
    if int(high) < 100:
        projected = result["countersign"][low]["p50"] + slope * (100 - int(low))
        metric["projected_ratio_p50_at_100"] = round(max(projected, 0.0) / result["countersign"][low]["p50"], 3)
    return {"resume_after_turns": metric}

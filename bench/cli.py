"""`python -m bench [--quick] [--out DIR] [size knobs]`: run the benchmarks and write the results.

Guarantee: the processes the bench starts are stopped on every exit path (success, error, Ctrl-C,
SIGTERM); the exit code is 0 when every scenario produced its figures (targets missed or not: that
is reported, not an error), 1 when a scenario could not be measured, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from bench import REPO
from bench.crash import crash_recovery
from bench.driver import Driver, progress
from bench.fleet import fleet_runs
from bench.latency import approval_path, resume_after_turns, warm_up
from bench.paused import paused_runs
from bench.plan import Plan, full_plan, quick_plan
from bench.report import table, write
from bench.stack import Stack
from bench.steps import step_overhead
from bench.subjects import Countersign, Floor, Library, ProductFloor

Scenario = Callable[[Driver], Awaitable[dict[str, Any]]]
# Order matters: `steps` measures how many journal entries a model turn is, which `resume` and `crash`
# use for the floor; `paused` leaves thousands of waiting runs behind, so it goes last.
SCENARIOS: dict[str, Scenario] = {
    "approval": approval_path,
    "steps": step_overhead,
    "resume": resume_after_turns,
    "crash": crash_recovery,
    "fleet": fleet_runs,
    "paused": paused_runs,
}


def _ints(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from None


def _scenarios(value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = set(names) - set(SCENARIOS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown scenario(s) {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench", description="What durability costs Countersign, vs bare Restate."
    )
    p.add_argument("--quick", action="store_true", help="small sizes (under a minute); checks figures are produced")
    p.add_argument("--out", type=Path, help="results folder (default: bench/results, or .bench/quick with --quick)")
    p.add_argument("--only", type=_scenarios, help=f"comma-separated subset of: {', '.join(SCENARIOS)}")
    p.add_argument("--keep-work", action="store_true", help="keep the servers' data dirs and logs (path is printed)")
    knobs = p.add_argument_group("sizes (override the mode's defaults)")
    knobs.add_argument("--warmup", type=int, help="unmeasured approve cycles per system")
    knobs.add_argument("--samples", dest="latency_samples", type=int, help="runs per system for the approval path")
    knobs.add_argument("--block", type=int, help="samples per block before switching systems")
    knobs.add_argument(
        "--think-ms", type=float, help="pause after each email before the next start, for start_to_email_alone"
    )
    knobs.add_argument("--step-counts", type=_ints, help="e.g. 1,10,25,50")
    knobs.add_argument("--step-samples", type=int, help="runs per step count per system")
    knobs.add_argument("--resume-turns", type=_ints, help="e.g. 10,100 (at most the longest script AgentTask accepts)")
    knobs.add_argument("--resume-samples", type=int, help="runs per turn count per system")
    knobs.add_argument("--concurrency", type=int, help="workers for start -> paused")
    knobs.add_argument("--paused", dest="paused_sizes", type=_ints, help="cumulative paused runs, e.g. 1000,10000")
    knobs.add_argument("--crash-runs", type=int, help="runs in flight when the handler is killed")
    knobs.add_argument("--crash-turns", type=int, help="model turns per crash-test run")
    knobs.add_argument("--fleet-runs", type=int, help="runs per system in the fleet burst")
    knobs.add_argument("--timeout", type=float, help="upper bound on any single wait, seconds")
    return p


def _plan(args: argparse.Namespace) -> Plan:
    base = quick_plan() if args.quick else full_plan()
    knobs = (
        "warmup",
        "latency_samples",
        "block",
        "think_ms",
        "step_counts",
        "step_samples",
        "resume_turns",
        "resume_samples",
        "concurrency",
        "paused_sizes",
        "crash_runs",
        "crash_turns",
        "fleet_runs",
        "timeout",
    )
    return base.with_overrides({k: getattr(args, k) for k in knobs})


def _meta(plan: Plan, scenarios: tuple[str, ...]) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "countersign", "bench"], cwd=REPO, capture_output=True, text=True
    )
    return {
        "mode": plan.mode,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else ""),
        "scenarios": list(scenarios),
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(plan).items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
        "versions": {pkg: metadata.version(pkg) for pkg in ("restate-sdk", "hypercorn", "pydantic")},
        "loadavg_start": list(os.getloadavg()),
    }


async def _run(stack: Stack, plan: Plan, scenarios: tuple[str, ...]) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(
            base_url=stack.restate.ingress_url, timeout=plan.timeout, trust_env=False, limits=limits
        ) as ingress,
        httpx.AsyncClient(timeout=plan.timeout, trust_env=False, limits=limits) as pages,
    ):
        agent = Countersign(stack.countersign, stack.outbox, stack.db_path, pages)
        product = ProductFloor(stack.product, stack.product_outbox, stack.product_db, pages)
        d = Driver(stack, plan, ingress, agent, Floor(stack.floor, stack.markers, ingress), Library(agent), product)
        stop = asyncio.Event()
        watchers = [asyncio.create_task(w.run(stop)) for w in d.watchers]
        try:
            progress(f"warm-up: {plan.warmup} approval cycles per system")
            await warm_up(d)
            metrics: dict[str, Any] = {}
            for name in SCENARIOS:
                if name in scenarios:
                    metrics.update(await SCENARIOS[name](d))
            for subject in d.pair:  # the library path shares the agent's outbox watcher
                if subject.watcher.duplicates:
                    metrics.setdefault("anomalies", {})[f"{subject.name}_duplicate_notifications"] = (
                        subject.watcher.duplicates
                    )
            return metrics
        finally:
            stop.set()
            await asyncio.gather(*watchers)


def _terminate(signum: int, _: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        plan = _plan(args)
    except ValueError as exc:
        parser().error(str(exc))
    scenarios = args.only or tuple(SCENARIOS)
    out = args.out or (REPO / ".bench" / "quick" if args.quick else REPO / "bench" / "results")
    signal.signal(signal.SIGTERM, _terminate)
    meta = _meta(plan, scenarios)
    work = Path(tempfile.mkdtemp(prefix="countersign-bench-"))
    started = time.monotonic()
    try:
        with ExitStack() as cleanup:
            progress(f"starting restate-server and the three handler processes ({plan.mode} run) in {work}")
            stack = Stack.start(work, cleanup)
            metrics = asyncio.run(_run(stack, plan, scenarios))
    except Exception as exc:
        progress(f"FAILED: {type(exc).__name__}: {exc}")
        progress(f"servers stopped; their logs and data are kept in {work}")
        return 1
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    meta["seconds"] = round(time.monotonic() - started, 1)
    meta["loadavg_end"] = list(os.getloadavg())
    write(out, meta, metrics)
    print(table(metrics))
    progress(f"done in {meta['seconds']}s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

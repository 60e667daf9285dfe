"""`python -m bench --quick` runs end to end and produces every figure (no speed is asserted), for the
floor, the agent and the library path (a user's workflow calling `gated_call`) where it is measured,
and for the product floor (bare Restate doing the same product work) on every figure of the approval
path, each also reported as a ratio to the product floor.

The bench starts its own restate-server and handler processes; this test runs it as a subprocess
into a temporary folder and checks the files and the numbers it wrote, then that it left no process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from support.processes import REPO

BENCH_DEADLINE = 240.0
LATENCY_METRICS = ("start_to_email", "start_to_email_alone", "approve_to_done")
ALL_METRICS = (
    *LATENCY_METRICS,
    "step_overhead",
    "start_to_paused_throughput",
    "paused_cost",
    "crash_recovery",
    "resume_after_turns",
    "fleet_drain",
    "fleet_cpu",
    "fleet_backlog",
    "fleet_completed_bytes",
)
PERCENTILES = ("p50", "p90", "p99")
PROCESSES = ("restate", "app")
MARKER_ENV = "COUNTERSIGN_BENCH_TEST_RUN"
FLEET_METRICS = ("fleet_drain", "fleet_cpu", "fleet_backlog", "fleet_completed_bytes")
LIBRARY_METRICS = (*LATENCY_METRICS, "start_to_paused_throughput", "paused_cost", *FLEET_METRICS)
"""Where the library path (a user's workflow calling the gate) is measured beside the agent."""
PRODUCT_METRICS = LIBRARY_METRICS
"""Where the product floor is measured: the approval path's figures."""
PRODUCT_FIGURES = {
    "start_to_email",
    "start_to_email_alone",
    "approve_to_done",
    "fleet_cpu",
    "fleet_drain",
    "paused_cost",
    "fleet_completed_bytes",
}
"""The metrics the product-floor table draws the issue's figures from (latencies, CPU per decision, drain
at concurrency 16, storage per paused and per completed run)."""


def numbers(value: Any) -> list[float]:
    """Every number in a JSON value (booleans excluded)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    if isinstance(value, dict):
        return [n for item in value.values() for n in numbers(item)]
    return []


def assert_latency(stats: dict[str, Any], where: str) -> None:
    for key in PERCENTILES:
        assert isinstance(stats[key], float | int) and stats[key] > 0, f"{where}.{key} = {stats.get(key)!r}"
    assert stats["p50"] <= stats["p90"] <= stats["p99"], where
    assert len(stats["samples"]) == stats["n"] > 0, where


def assert_cpu(cpu: dict[str, Any], where: str) -> None:
    for proc in PROCESSES:
        assert isinstance(cpu[proc], float | int) and cpu[proc] >= 0, f"{where}.{proc} = {cpu.get(proc)!r}"


def bench_processes(marker: str) -> set[int]:
    """PIDs of the processes of one bench run: its servers inherit the bench's environment, which
    carries `marker` (so another run on the machine, another worker's say, is not counted)."""
    tag = f"{MARKER_ENV}={marker}".encode()
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if tag in environ.read_bytes().split(b"\0"):
                found.add(int(environ.parent.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_quick_bench_produces_every_metric(tmp_path: Path) -> None:
    out = tmp_path / "out"
    marker = uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", MARKER_ENV: marker},
    )
    try:
        output, _ = proc.communicate(timeout=BENCH_DEADLINE)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the bench stops its servers on SIGTERM
        output, _ = proc.communicate(timeout=60)
        pytest.fail(f"bench --quick took over {BENCH_DEADLINE}s:\n{output.decode()[-4000:]}")
    log = output.decode(errors="replace")
    assert proc.returncode == 0, log[-4000:]

    document = json.loads((out / "results.json").read_text())
    assert document["meta"]["mode"] == "quick"
    metrics, headline = document["metrics"], document["headline"]
    assert set(ALL_METRICS) <= set(metrics), sorted(metrics)
    assert set(ALL_METRICS) <= set(headline), sorted(headline)
    for name in ALL_METRICS:
        row = headline[name]
        assert isinstance(row["met"], bool), name
        assert numbers(row["countersign"]) and numbers(row["floor"]), name
        assert all(n >= 0 for n in numbers([row["countersign"], row["floor"], row["ratio"]])), (name, row)

    for name in LIBRARY_METRICS:
        row = headline[name]
        assert numbers(row["library"]), (name, row)
        assert name == "fleet_backlog" or row["library_ratio"] > 0, (name, row)
    for name in PRODUCT_METRICS:
        assert numbers(headline[name]["product_floor"]), (name, headline[name])

    table = document["product_floor"]
    assert {row["metric"] for row in table} == PRODUCT_FIGURES, table
    for row in table:
        where = f"product_floor table: {row['figure']}"
        for system in ("floor", "product_floor", "countersign", "library"):
            assert isinstance(row[system], float) and row[system] >= 0, where
        if row["product_floor"] > 0 and "du of" not in row["figure"]:  # a quick run's du moves by whole blocks
            assert row["countersign_vs_product_floor"] > 0 and row["library_vs_product_floor"] > 0, where
            assert isinstance(row["met"], bool), where
    assert {"approve_to_done", "fleet_cpu", "fleet_drain"} <= {r["metric"] for r in table if r["product_floor"] > 0}
    product = metrics["start_to_paused_throughput"]["product_floor"]
    assert product["per_second"] > 0 and product["runs"] > 0
    assert metrics["paused_cost"]["product_floor"]["restate_bytes_per_run"] > 0
    assert metrics["fleet_completed_bytes"]["product_floor"][1] > 0

    for name in LATENCY_METRICS:
        for system in ("floor", "product_floor", "countersign", "library"):
            assert_latency(metrics[name][system], f"{name}.{system}")
            assert_cpu(metrics[name][system]["cpu_ms_per_op"], f"{name}.{system}")
        assert_latency(metrics["approve_to_done"]["library"]["to_action"], "approve_to_done.library.to_action")
        assert_latency(metrics["approve_to_done"]["product_floor"]["to_action"], "approve_to_done.product.to_action")
    library = metrics["start_to_paused_throughput"]["library"]
    assert library["per_second"] > 0 and library["runs"] > 0
    assert_cpu(library["cpu_ms_per_op"], "start_to_paused_throughput.library")
    assert metrics["paused_cost"]["library"]["restate_bytes_per_run"] > 0
    for system in ("floor", "countersign"):
        assert_latency(metrics["approve_to_done"][system]["to_action"], f"approve_to_done.{system}.to_action")
        for turns in metrics["resume_after_turns"]["turns"]:
            entry = metrics["resume_after_turns"][system][str(turns)]
            assert_latency(entry, f"resume_after_turns.{system}.{turns}")
            assert_cpu(entry["cpu_ms_per_op"], f"resume_after_turns.{system}.{turns}")
        steps = metrics["step_overhead"][system]
        assert steps["slope_ms_per_step"] >= 0
        assert_cpu(steps["cpu_ms_per_step"], f"step_overhead.{system}")
        for point in steps["points"]:
            assert_latency(point, f"step_overhead.{system}.{point['steps']}")
        throughput = metrics["start_to_paused_throughput"][system]
        assert throughput["per_second"] > 0 and throughput["runs"] > 0
        assert_cpu(throughput["cpu_ms_per_op"], f"start_to_paused_throughput.{system}")
        cost = metrics["paused_cost"][system]
        assert cost["disk_bytes_per_run"] >= 0 and cost["rss_growth_fraction"] >= 0
        assert all(p["rss_app"] > 0 and p["disk_bytes"] > 0 for p in cost["points"])
        crashed = metrics["crash_recovery"][system]["crashed"]
        assert crashed["runs"] > 0 and crashed["restart_s"] > 0 and crashed["drain_after_restart_s"] >= 0
    journal = metrics["step_overhead"]["countersign"]["journal_entries_per_step"]
    assert journal["run_steps"] >= 1, journal
    assert metrics["crash_recovery"]["countersign"]["crashed"]["missing_effects"] == 0
    assert metrics["crash_recovery"]["countersign"]["crashed"]["duplicate_effects"] == 0

    assert (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert all(name in report for name in ALL_METRICS)
    assert "Against the product floor" in report and "| product floor |" in report
    assert "| metric |" in log, "the table is printed"
    left = bench_processes(marker)
    assert not left, f"the bench left processes running: {sorted(left)}"

"""Presenting a bench run: a table on stdout, `results.json`, `report.md` and `latency.png`.

Guarantee: the JSON holds every figure the table and chart show (plus raw samples), and each metric's
`headline` numbers are the ones the table prints; the chart is drawn headless (Agg) from the JSON alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: chosen before pyplot is imported
import matplotlib.pyplot as plt
import numpy as np

from bench import fleet

SYSTEMS = ("floor", "countersign")
COLORS = {"floor": "#7f7f7f", "countersign": "#1f77b4", "library": "#2ca02c"}
LIBRARY = "library"
"""The library path (a user's workflow calling the gate): measured where it has the agent's shape."""


LATENCY = ("start_to_email", "start_to_email_alone", "approve_to_done")
"""The latency metrics: each a p50/p90/p99 per system, the library path's included."""


def _systems(metric: dict[str, Any]) -> tuple[str, ...]:
    return (*SYSTEMS, LIBRARY) if LIBRARY in metric else SYSTEMS


def headlines(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """metric -> {unit, floor, countersign, ratio, target, met, and where measured library, library_ratio}:
    the one line each metric is judged by."""
    rows: dict[str, dict[str, Any]] = {}
    for name in LATENCY:
        if name in metrics:
            m = metrics[name]
            rows[name] = {
                "unit": "ms p50/p90/p99",
                "floor": [m["floor"][k] for k in ("p50", "p90", "p99")],
                "countersign": [m["countersign"][k] for k in ("p50", "p90", "p99")],
                "ratio": m["ratio_p50"],
            }
            if LIBRARY in m:
                rows[name][LIBRARY] = [m[LIBRARY][k] for k in ("p50", "p90", "p99")]
                rows[name]["library_ratio"] = m["library_ratio_p50"]
    if "step_overhead" in metrics:
        m = metrics["step_overhead"]
        rows["step_overhead"] = {
            "unit": "ms per journaled step (slope of p50)",
            "floor": m["floor"]["slope_ms_per_step"],
            "countersign": m["countersign"]["slope_ms_per_journaled_step"],
            "ratio": m["ratio"],
        }
    if "start_to_paused_throughput" in metrics:
        m = metrics["start_to_paused_throughput"]
        rows["start_to_paused_throughput"] = {
            "unit": "runs/s",
            "floor": m["floor"]["per_second"],
            "countersign": m["countersign"]["per_second"],
            "ratio": m["ratio"],
        }
        if LIBRARY in m:
            library = {LIBRARY: m[LIBRARY]["per_second"], "library_ratio": m["library_ratio"]}
            rows["start_to_paused_throughput"] |= library
    if "paused_cost" in metrics:
        m = metrics["paused_cost"]
        rows["paused_cost"] = {
            "unit": "bytes per paused run: du of the data dir / Restate's journal+state count",
            "floor": [m["floor"]["disk_bytes_per_run"], m["floor"]["restate_bytes_per_run"]],
            "countersign": [m["countersign"]["disk_bytes_per_run"], m["countersign"]["restate_bytes_per_run"]],
            "ratio": m["ratio_restate_bytes"],
        }
        if LIBRARY in m:
            rows["paused_cost"] |= {
                LIBRARY: [m[LIBRARY]["disk_bytes_per_run"], m[LIBRARY]["restate_bytes_per_run"]],
                "library_ratio": m["library_ratio_restate_bytes"],
            }
    if "crash_recovery" in metrics:
        m = metrics["crash_recovery"]
        rows["crash_recovery"] = {
            "unit": "s from healthy restart to the last run done",
            "floor": m["floor"]["crashed"]["drain_after_restart_s"],
            "countersign": m["countersign"]["crashed"]["drain_after_restart_s"],
            "ratio": None,
        }
    if "resume_after_turns" in metrics:
        m = metrics["resume_after_turns"]
        low, high = (str(t) for t in (min(m["turns"]), max(m["turns"])))
        rows["resume_after_turns"] = {
            "unit": f"ms p50 after {low} / {high} turns",
            "floor": [m["floor"][low]["p50"], m["floor"][high]["p50"]],
            "countersign": [m["countersign"][low]["p50"], m["countersign"][high]["p50"]],
            "ratio": m["ratio_p50"],
        }
    rows.update(fleet.headlines(metrics))
    for name, row in rows.items():
        row["target"] = metrics[name]["target"]
        row["met"] = bool(metrics[name]["met"])
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return " / ".join(_fmt(v) for v in value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return "-" if value is None else str(value)


def table(metrics: dict[str, Any]) -> str:
    """The headline table (target and met judge the agent, `countersign`; `library` is the library path,
    '-' where it is not measured), then CPU per operation."""
    lines = [
        "| metric | unit | floor | countersign | ratio | library | library ratio | target | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in headlines(metrics).items():
        lines.append(
            f"| {name} | {row['unit']} | {_fmt(row['floor'])} | {_fmt(row['countersign'])} | {_fmt(row['ratio'])} "
            f"| {_fmt(row.get(LIBRARY))} | {_fmt(row.get('library_ratio'))} "
            f"| {row['target']} | {'yes' if row['met'] else 'NO'} |"
        )
    lines += ["", "| CPU ms per operation | process | floor | countersign | library |", "|---|---|---|---|---|"]
    for name, m in metrics.items():
        for op, floor_cpu, cs_cpu, lib_cpu in _cpu_rows(name, m):
            for proc in ("restate", "app"):
                lib = _fmt(lib_cpu[proc]) if lib_cpu else "-"
                lines.append(f"| {op} | {proc} | {_fmt(floor_cpu[proc])} | {_fmt(cs_cpu[proc])} | {lib} |")
    return "\n".join(lines)


CpuRow = tuple[str, dict[str, float], dict[str, float], dict[str, float] | None]


def _cpu_rows(name: str, m: dict[str, Any]) -> list[CpuRow]:
    if name in (*LATENCY, "start_to_paused_throughput"):
        lib = m[LIBRARY]["cpu_ms_per_op"] if LIBRARY in m else None
        return [(name, m["floor"]["cpu_ms_per_op"], m["countersign"]["cpu_ms_per_op"], lib)]
    if name == "step_overhead":
        return [
            (
                f"{name} (per step; countersign per journaled step)",
                m["floor"]["cpu_ms_per_step"],
                m["countersign"]["cpu_ms_per_journaled_step"],
                None,
            )
        ]
    if name == "resume_after_turns":
        return [
            (
                f"{name} ({t} turns)",
                m["floor"][str(t)]["cpu_ms_per_op"],
                m["countersign"][str(t)]["cpu_ms_per_op"],
                None,
            )
            for t in m["turns"]
        ]
    return []


def write(out: Path, meta: dict[str, Any], metrics: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "headline": headlines(metrics), "metrics": metrics}
    (out / "results.json").write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    (out / "report.md").write_text(
        f"# Bench run ({meta['mode']}, {meta['started']}, commit {meta['commit']})\n\n{table(metrics)}\n"
    )
    chart(metrics, out / "latency.png", title=f"Countersign vs bare Restate floor ({meta['mode']}, {meta['started']})")


def _ecdf(ax: Any, metric: dict[str, Any], title: str, alone: dict[str, Any] | None = None) -> None:
    """Each system's distribution; with `alone` (start -> email with think time), dashed beside it."""
    for m, style, how in ((metric, "-", ""), (alone, "--", " alone")):
        if m is None:
            continue
        for system in _systems(m):
            data = np.sort(np.asarray(m[system]["samples"]))
            ax.step(
                data,
                np.arange(1, len(data) + 1) / len(data),
                where="post",
                color=COLORS[system],
                linestyle=style,
                label=f"{system}{how} p50 {m[system]['p50']:.1f} ms",
            )
    library = f", library {metric['library_ratio_p50']:.2f}x" if LIBRARY in metric else ""
    also = f"; alone {alone['ratio_p50']:.2f}x" if alone is not None else ""
    ax.set_title(f"{title}\n(ratio of p50 {metric['ratio_p50']:.2f}x{library}{also})")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of runs")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)


def chart(metrics: dict[str, Any], path: Path, title: str) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(18, 10))
    panels = iter(axes.flat)
    if "start_to_email" in metrics:
        heading = "start -> approval email handed to the mailer (back to back; dashed: alone)"
        _ecdf(next(panels), metrics["start_to_email"], heading, metrics.get("start_to_email_alone"))
    if "approve_to_done" in metrics:
        _ecdf(next(panels), metrics["approve_to_done"], "approver POST -> action done and recorded")
    if "resume_after_turns" in metrics:
        m = metrics["resume_after_turns"]
        ax = next(panels)
        data, labels, colors = [], [], []
        for turns in m["turns"]:
            for system in SYSTEMS:
                data.append(m[system][str(turns)]["samples"])
                labels.append(f"{system}\n{turns} turns")
                colors.append(COLORS[system])
        box = ax.boxplot(data, tick_labels=labels, patch_artist=True, showfliers=True)
        for patch, color in zip(box["boxes"], colors, strict=True):
            patch.set_facecolor(color)
            patch.set_alpha(0.5)
        ax.set_title(f"resume (POST -> done) after N model turns\n(countersign ratio {m['ratio_p50']:.2f}x)")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
    if "step_overhead" in metrics:
        m = metrics["step_overhead"]
        ax = next(panels)
        for system in SYSTEMS:
            pts = m[system]["points"]
            xs = [p["steps"] for p in pts]
            ax.errorbar(
                xs,
                [p["p50"] for p in pts],
                yerr=[[0] * len(pts), [p["p90"] - p["p50"] for p in pts]],
                marker="o",
                color=COLORS[system],
                capsize=3,
                label=f"{system}: {m[system]['slope_ms_per_step']:.2f} ms/step",
            )
        ax.set_title(f"run latency vs steps (p50, bar to p90)\n(per journaled step: {m['ratio']:.2f}x floor)")
        ax.set_xlabel("steps (countersign: scripted tool calls)")
        ax.set_ylabel("ms")
        ax.legend()
        ax.grid(alpha=0.3)
    if "start_to_paused_throughput" in metrics:
        m = metrics["start_to_paused_throughput"]
        ax = next(panels)
        systems = _systems(m)
        ax.bar(list(systems), [m[s]["per_second"] for s in systems], color=[COLORS[s] for s in systems])
        for i, s in enumerate(systems):
            cpu = m[s]["cpu_ms_per_op"]
            ax.annotate(
                f"{m[s]['per_second']:.0f}/s\nCPU/run: restate {cpu['restate']:.1f} ms,\napp {cpu['app']:.1f} ms",
                (i, m[s]["per_second"]),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(f"start -> paused, concurrency 16\n(countersign {m['ratio']:.0%} of floor)")
        ax.set_ylabel("runs/s")
        ax.margins(y=0.3)
    if "paused_cost" in metrics:
        m = metrics["paused_cost"]
        ax = next(panels)
        for system in _systems(m):
            pts = m[system]["points"]
            ax.plot(
                [p["paused"] for p in pts],
                [p["rss_app"] / 2**20 for p in pts],
                marker="o",
                color=COLORS[system],
                label=f"{system} handler RSS ({m[system]['disk_bytes_per_run']:.0f} B/run disk)",
            )
        restate = m["countersign"]["points"]
        ax.plot(
            [p["paused"] for p in restate],
            [p["rss_restate"] / 2**20 for p in restate],
            marker="s",
            color="#d62728",
            label="restate-server RSS",
        )
        ax.set_title("memory while runs are paused")
        ax.set_xlabel("paused runs of the system")
        ax.set_ylabel("MiB")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    for ax in panels:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)

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
from bench.stats import against_floors, ratio

SYSTEMS = ("floor", "countersign")
COLORS = {"floor": "#7f7f7f", "countersign": "#1f77b4", "library": "#2ca02c", "product_floor": "#ff7f0e"}
LIBRARY = "library"
"""The library path (a user's workflow calling the gate): measured where it has the agent's shape."""
PRODUCT = "product_floor"
"""The product floor (bare Restate doing the same product work, `bench.product_floor`)."""
PRODUCT_TARGET = 1.3
"""The issue's line: Countersign within 1.3x of the product floor on every figure."""


LATENCY = ("start_to_email", "start_to_email_alone", "approve_to_done")
"""The latency metrics: each a p50/p90/p99 per system, the library path's included."""


def _systems(metric: dict[str, Any]) -> tuple[str, ...]:
    return tuple(s for s in ("floor", PRODUCT, "countersign", LIBRARY) if s in metric)


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
            if PRODUCT in m:
                rows[name][PRODUCT] = [m[PRODUCT][k] for k in ("p50", "p90", "p99")]
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
        if PRODUCT in m:
            rows["start_to_paused_throughput"][PRODUCT] = m[PRODUCT]["per_second"]
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
        if PRODUCT in m:
            rows["paused_cost"][PRODUCT] = [m[PRODUCT]["disk_bytes_per_run"], m[PRODUCT]["restate_bytes_per_run"]]
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
    for name, row in fleet.headlines(metrics).items():
        if PRODUCT in metrics[name]:
            row[PRODUCT] = metrics[name][PRODUCT]
        rows[name] = row
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
        "| metric | unit | floor | product floor | countersign | ratio | library | library ratio | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in headlines(metrics).items():
        lines.append(
            f"| {name} | {row['unit']} | {_fmt(row['floor'])} | {_fmt(row.get(PRODUCT))} | {_fmt(row['countersign'])} "
            f"| {_fmt(row['ratio'])} | {_fmt(row.get(LIBRARY))} | {_fmt(row.get('library_ratio'))} "
            f"| {row['target']} | {'yes' if row['met'] else 'NO'} |"
        )
    lines += [
        "",
        "| CPU ms per operation | process | floor | product floor | countersign | library |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in metrics.items():
        for op, floor_cpu, product_cpu, cs_cpu, lib_cpu in _cpu_rows(name, m):
            for proc in ("restate", "app"):
                lib = _fmt(lib_cpu[proc]) if lib_cpu else "-"
                product = _fmt(product_cpu[proc]) if product_cpu else "-"
                lines.append(f"| {op} | {proc} | {_fmt(floor_cpu[proc])} | {product} | {_fmt(cs_cpu[proc])} | {lib} |")
    rows = floor_table(metrics)
    if rows:
        lines += ["", *floor_table_lines(rows)]
    return "\n".join(lines)


CpuRow = tuple[str, dict[str, float], dict[str, float] | None, dict[str, float], dict[str, float] | None]


def _cpu_rows(name: str, m: dict[str, Any]) -> list[CpuRow]:
    if name in (*LATENCY, "start_to_paused_throughput"):
        lib = m[LIBRARY]["cpu_ms_per_op"] if LIBRARY in m else None
        product = m[PRODUCT]["cpu_ms_per_op"] if PRODUCT in m else None
        return [(name, m["floor"]["cpu_ms_per_op"], product, m["countersign"]["cpu_ms_per_op"], lib)]
    if name == "step_overhead":
        return [
            (
                f"{name} (per step; countersign per journaled step)",
                m["floor"]["cpu_ms_per_step"],
                None,
                m["countersign"]["cpu_ms_per_journaled_step"],
                None,
            )
        ]
    if name == "resume_after_turns":
        return [
            (
                f"{name} ({t} turns)",
                m["floor"][str(t)]["cpu_ms_per_op"],
                None,
                m["countersign"][str(t)]["cpu_ms_per_op"],
                None,
            )
            for t in m["turns"]
        ]
    return []


def _cpu_total(cpu: dict[str, float]) -> float:
    return round(cpu["restate"] + cpu["app"], 3)


FloorFigure = tuple[str, str, bool, Any]
"""(metric it comes from, the figure's label, whether lower is better, system's metric entry -> value)."""

FLOOR_FIGURES: tuple[FloorFigure, ...] = (
    ("start_to_email", "start -> paused (request email written), ms p50, back to back", True, lambda e: e["p50"]),
    ("start_to_email_alone", "start -> paused, ms p50, alone (think time between runs)", True, lambda e: e["p50"]),
    ("approve_to_done", "decision (approver's POST) -> completed, ms p50", True, lambda e: e["p50"]),
    (
        "approve_to_done",
        "CPU ms per decision, restate-server + handler, one at a time",
        True,
        lambda e: _cpu_total(e["cpu_ms_per_op"]),
    ),
    ("fleet_cpu", "CPU ms per decision, restate-server + handler, burst at c=16", True, lambda e: e),
    ("fleet_drain", "decisions drained at concurrency 16, per s", False, lambda e: e),
    (
        "paused_cost",
        "storage per paused run, bytes (Restate's journal + state count)",
        True,
        lambda e: e["restate_bytes_per_run"],
    ),
    ("paused_cost", "storage per paused run, bytes (du of the data dir)", True, lambda e: e["disk_bytes_per_run"]),
    (
        "fleet_completed_bytes",
        "storage per completed run, bytes (Restate's journal + state count)",
        True,
        lambda e: e[1],
    ),
    ("fleet_completed_bytes", "storage per completed run, bytes (du of the data dir)", True, lambda e: e[0]),
)


def floor_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's figures for every system, each as a ratio to the product floor and to the bare floor.
    `met`: Countersign within PRODUCT_TARGET of the product floor (for a rate: at least 1/PRODUCT_TARGET of it)."""
    rows = []
    for name, label, lower_is_better, value_of in FLOOR_FIGURES:
        m = metrics.get(name)
        if m is None or PRODUCT not in m:
            continue
        values = {s: float(value_of(m[s])) for s in ("floor", PRODUCT, "countersign", LIBRARY) if s in m}
        versus = against_floors(values)
        cs_vs_product = versus["vs_product_floor"].get("countersign")
        row: dict[str, Any] = {"metric": name, "figure": label, "lower_is_better": lower_is_better, **values}
        row["countersign_vs_product_floor"] = cs_vs_product
        row["library_vs_product_floor"] = versus["vs_product_floor"].get(LIBRARY)
        row["product_floor_vs_floor"] = versus["product_floor_vs_floor"]
        row["countersign_vs_floor"] = ratio(values["countersign"], values["floor"]) if values["floor"] else None
        if cs_vs_product is None:
            row["met"] = None
        else:
            row["met"] = cs_vs_product <= PRODUCT_TARGET if lower_is_better else cs_vs_product >= 1 / PRODUCT_TARGET
        rows.append(row)
    return rows


def floor_table_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"Against the product floor (Countersign within {PRODUCT_TARGET:g}x; a rate: at least 1/{PRODUCT_TARGET:g}):",
        "",
        "| figure | bare Restate | product floor | Countersign (AgentRun) | library path "
        "| Countersign / product floor | library / product floor | Countersign / bare | product floor / bare "
        f"| within {PRODUCT_TARGET:g}x |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        lines.append(
            f"| {r['figure']} | {_fmt(r['floor'])} | {_fmt(r[PRODUCT])} | {_fmt(r['countersign'])} "
            f"| {_fmt(r.get(LIBRARY))} | {_fmt(r['countersign_vs_product_floor'])} "
            f"| {_fmt(r['library_vs_product_floor'])} | {_fmt(r['countersign_vs_floor'])} "
            f"| {_fmt(r['product_floor_vs_floor'])} | {met} |"
        )
    return lines


def write(out: Path, meta: dict[str, Any], metrics: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "headline": headlines(metrics), "product_floor": floor_table(metrics), "metrics": metrics}
    (out / "results.json").write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    (out / "report.md").write_text(
        f"# Bench run ({meta['mode']}, {meta['started']}, commit {meta['commit']})\n\n{table(metrics)}\n"
    )
    chart(
        metrics,
        out / "latency.png",
        title=f"Countersign vs the bare Restate and product floors ({meta['mode']}, {meta['started']})",
    )


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

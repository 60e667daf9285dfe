"""Draw a still picture of the Grafana dashboard from one /metrics scrape (for the docs).

Run with: python deploy/grafana/preview.py METRICS_URL_OR_FILE OUT.png

Guarantee: the layout (grid positions, titles, units) is read from countersign.json itself; each
panel shows, for its queries, the current value of the series it names, summed by the labels of its
`by (...)` clause (a histogram_quantile panel: the quantiles of the cumulated buckets). It is a
snapshot of totals, not Grafana's rendering over time: rates are shown as totals so far.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import httpx
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).with_name("countersign.json")
Series = dict[str, list[tuple[dict[str, str], float]]]


def read(source: str) -> Series:
    text = httpx.get(source, timeout=10).text if source.startswith("http") else Path(source).read_text()
    series: Series = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[sample.name].append((sample.labels, sample.value))
    return series


def evaluate(expr: str, legend: str, series: Series) -> list[tuple[str, float]]:
    """`expr`'s value(s) now, labelled by `legend` (a small subset of PromQL: see the module doc)."""
    name = re.findall(r"countersign_[a-z_]+", expr)[0]
    matchers = re.findall(r'(\w+)(!=|=)"([^"]*)"', expr)  # =~ (the $tool and $tenant filters) matches all

    def kept(labels: dict[str, str]) -> bool:
        return all((labels.get(k) == w) == (op == "=") for k, op, w in matchers)

    samples = [(labels, v) for labels, v in series.get(name, []) if kept(labels)]
    if expr.startswith("histogram_quantile("):
        q = float(expr.split("(", 1)[1].split(",", 1)[0])
        buckets: dict[float, float] = defaultdict(float)
        for labels, v in samples:
            buckets[float(labels["le"])] += v
        ordered = sorted(buckets.items())
        total = ordered[-1][1] if ordered else 0.0
        found = next((le for le, count in ordered if total and count >= q * total), float("nan"))
        return [(legend, found)]
    by = re.search(r"by \(([^)]*)\)", expr)
    keys = [k.strip() for k in by.group(1).split(",")] if by else []
    grouped: dict[str, float] = defaultdict(float)
    for labels, v in samples:
        label = legend
        for key in keys:
            label = label.replace("{{" + key + "}}", labels.get(key, ""))
        grouped[label] += v
    if not grouped and not keys:
        grouped[legend] = 0.0
    return sorted(grouped.items())


def draw(series: Series, out: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    fig = plt.figure(figsize=(16, height * 0.42))
    fig.patch.set_facecolor("#111217")
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        box = (
            g["x"] / 24 + 0.004,
            1 - (g["y"] + g["h"]) / height + 0.01,
            g["w"] / 24 - 0.008,
            g["h"] / height - 0.02,
        )
        ax = fig.add_axes(box)
        ax.set_facecolor("#181b1f")
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.tick_params(colors="#ccccdc", labelsize=7)
        ax.set_title(panel["title"], color="#ccccdc", fontsize=9, loc="left")
        if panel["type"] == "row":
            ax.set_axis_off()
            ax.set_title(panel["title"], color="#ccccdc", fontsize=11, loc="left", fontweight="bold")
            continue
        values = [pair for t in panel["targets"] for pair in evaluate(t["expr"], t["legendFormat"], series)]
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        if panel["type"] == "stat":
            v = values[0][1] if values else float("nan")
            ax.text(
                0.5,
                0.45,
                f"{v:,.0f}{' s' if unit == 's' else ''}",
                ha="center",
                va="center",
                fontsize=26,
                color="#73bf69",
                transform=ax.transAxes,
            )
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        labels = [label or "(none)" for label, _ in values] or ["(no data)"]
        numbers = [v for _, v in values] or [0.0]
        ax.barh(range(len(numbers)), numbers, color="#5794f2", height=0.6)
        ax.set_yticks([])
        for i, (label, number) in enumerate(zip(labels, numbers, strict=True)):
            ax.text(
                0.01,
                i,
                f"{label}: {number:g}",
                color="#ffffff",
                fontsize=8,
                va="center",
                transform=ax.get_yaxis_transform(),
            )
        ax.set_xlabel("seconds" if unit == "s" else "total so far", color="#8e8e8e", fontsize=7)
    fig.savefig(out, dpi=110, facecolor=fig.get_facecolor())


if __name__ == "__main__":
    draw(read(sys.argv[1]), Path(sys.argv[2]))

"""Summaries of measured samples: percentiles of latencies and the slope of a line through points.

Guarantee: pure functions of their inputs; percentiles use linear interpolation between closest
ranks (numpy's default), so a p99 of 30 samples is an interpolation, not an invented tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def latency_summary(samples_ms: Sequence[float]) -> dict[str, Any]:
    """n, p50, p90, p99, mean, min, max in milliseconds (rounded to 0.01 ms), plus the raw samples."""
    if not samples_ms:
        raise ValueError("no samples")
    data = np.asarray(samples_ms, dtype=float)
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return {
        "n": len(data),
        "p50": round(float(p50), 2),
        "p90": round(float(p90), 2),
        "p99": round(float(p99), 2),
        "mean": round(float(data.mean()), 2),
        "min": round(float(data.min()), 2),
        "max": round(float(data.max()), 2),
        "samples": [round(float(x), 3) for x in data],
    }


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y over x."""
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError("a line needs at least two distinct x values")
    slope, intercept = np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)
    return float(slope), float(intercept)


def ratio(numerator: float, denominator: float) -> float:
    if denominator <= 0:
        raise ValueError(f"ratio to a non-positive floor ({denominator})")
    return round(numerator / denominator, 3)


FLOOR, PRODUCT = "floor", "product_floor"


def against_floors(values: dict[str, float]) -> dict[str, Any]:
    """`vs_product_floor` (each other system's value over the product floor's) and
    `product_floor_vs_floor` (the product floor's over the bare floor's), None where a value is missing
    or a floor is zero."""
    product, floor = values.get(PRODUCT), values.get(FLOOR)
    vs = {
        name: ratio(value, product) if product else None
        for name, value in values.items()
        if name not in (PRODUCT, FLOOR) and value is not None
    }
    return {"vs_product_floor": vs, "product_floor_vs_floor": ratio(product, floor) if product and floor else None}

"""Options of the fault suite, and its report at the end of the test session.

`pytest tests/faults --runs 200 --seed 1234` (or `FAULT_RUNS=200 FAULT_SEED=1234 scripts/test`) sizes
and seeds the randomized session; without them CI runs a small session with a fresh seed. The seed,
the faults injected and the invariants checked are printed in the terminal summary, pass or fail.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

import pytest

DEFAULT_RUNS = 6


@dataclass(frozen=True)
class FaultOptions:
    runs: int
    seed: int


_REPORT = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("faults", "randomized fault runs (tests/faults)")
    group.addoption("--runs", type=int, default=None, help=f"agent runs per fault session (default {DEFAULT_RUNS})")
    group.addoption("--seed", type=int, default=None, help="seed of the fault session's plan (default: random)")


def _int(option: int | None, variable: str, default: int) -> int:
    if option is not None:
        return option
    raw = os.environ.get(variable, "").strip()
    return int(raw) if raw else default


@pytest.fixture(scope="session")
def fault_options(pytestconfig: pytest.Config) -> FaultOptions:
    runs = _int(pytestconfig.getoption("--runs", None), "FAULT_RUNS", DEFAULT_RUNS)
    seed = _int(pytestconfig.getoption("--seed", None), "FAULT_SEED", secrets.randbelow(10**9))
    if runs < 1:
        raise pytest.UsageError("--runs must be at least 1")
    return FaultOptions(runs=runs, seed=seed)


@pytest.fixture()
def fault_report(pytestconfig: pytest.Config) -> list[str]:
    """Lines for the terminal summary (shown whether the test passed or not)."""
    return pytestconfig.stash.setdefault(_REPORT, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("fault runs")
        for line in lines:
            terminalreporter.write_line(line)

"""Options of the fault suite, and its report at the end of the test session.

`pytest tests/faults --runs 200 --seed 1234` (or `FAULT_RUNS=200 FAULT_SEED=1234 scripts/test`) sizes
and seeds the randomized session; without them CI runs a small session with a fresh seed. The seed,
the faults injected and the invariants checked are printed in the terminal summary, pass or fail.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

DEFAULT_RUNS = 6


@dataclass(frozen=True)
class FaultOptions:
    runs: int
    seed: int


_REPORT_PROPERTY = "fault report"
_reported: list[str] = []
"""The report lines of every fault session that ended in this run (in the controller under xdist)."""


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
def fault_report(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Lines for the terminal summary (shown whether the test passed or not).

    They travel in the test's report (its user properties), so the summary has them also when the
    test ran in another worker process (pytest-xdist)."""
    lines: list[str] = []
    yield lines
    request.node.user_properties.extend((_REPORT_PROPERTY, line) for line in lines)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _reported.extend(str(value) for name, value in report.user_properties if name == _REPORT_PROPERTY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _reported:
        terminalreporter.section("fault runs")
        for line in _reported:
            terminalreporter.write_line(line)

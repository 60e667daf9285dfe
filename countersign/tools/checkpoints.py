"""Confidence-gated checkpoints: reasons to stop a call that its policy would let run alone.

Guarantee: pure (no clock, no I/O), so its answer is journaled with the policy's, inside the same
step, and a replay re-uses it. It only ever adds a stop, never removes one: a call its policy gates
stays gated whatever the confidence. It fails closed: a confidence that was not reported (or is not a
number in 0..1) counts as below the threshold, and a check that cannot be evaluated (no earlier result
of the tool it reads, a missing field, a type error) stops the call as a failed check would.

A check is a CEL expression over `args` (the validated arguments) and `results` (the latest result of
each tool that ran earlier in the same run, by tool name), e.g. the pair
`args.order_id == results.lookup_order.order_id` and
`args.amount_usd == double(results.lookup_order.amount_usd)`: `results.lookup_order` is whichever
order was looked up last, so a check on its amount alone would pass a refund of another order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from countersign.contract import ActionRecord, StopReason
from countersign.tools.conditions import program

MAX_CHECKS = 20
MAX_CHECK_LENGTH = 2000
_VARIABLES = frozenset({"args", "results"})
_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")


def check_expression(expression: str) -> None:
    """Raise ValueError unless `expression` compiles as CEL and reads only `args` and `results`."""
    if len(expression) > MAX_CHECK_LENGTH:
        raise ValueError(f"check is longer than {MAX_CHECK_LENGTH} characters")
    try:
        compiled = program(expression)
    except ValueError as exc:
        first = (str(exc).splitlines() or ["syntax error"])[0].rpartition("ERROR: ")[2]
        raise ValueError(f"check {expression!r} is not a valid CEL expression ({first})") from None
    unknown = sorted(set(compiled.variables()) - _VARIABLES)
    if unknown:
        raise ValueError(f"check {expression!r} reads {', '.join(unknown)}; a check reads only args and results")


def stops(
    *,
    below: float | None,
    checks: Sequence[str],
    args: Mapping[str, Any],
    results: Mapping[str, Any],
    confidence: float | None,
) -> list[StopReason]:
    """Every reason to stop this call (empty: none). `args` and `results` are CEL values already."""
    found: list[StopReason] = []
    if below is not None:
        reported = usable_confidence(confidence)
        if reported is None:
            found.append(StopReason(kind="confidence", text=f"the model reported no confidence (needs {below:.2f})"))
        elif reported < below:
            found.append(StopReason(kind="confidence", text=f"the model's confidence was {reported:.2f} < {below:.2f}"))
    scope = {"args": dict(args), "results": dict(results)}
    for expression in checks:
        try:
            held = program(expression).execute(scope)
        except Exception as exc:  # a missing result or field, no such overload: fail closed
            found.append(StopReason(kind="check", text=f"check `{expression}` could not be evaluated: {_why(exc)}"))
            continue
        if held is not True:
            found.append(StopReason(kind="check", text=f"check `{expression}` failed{_sides(expression, scope)}"))
    return found


def usable_confidence(value: object) -> float | None:
    """A reported confidence as a number in 0..1, or None (not reported, or not such a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if 0.0 <= number <= 1.0 else None


def _why(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!s} (no such earlier result or field in this run)"
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _sides(expression: str, scope: dict[str, Any]) -> str:
    """For a single comparison (`a == b`), what each side was: `: a is 500.0, b is 120.0`."""
    split = _one_comparison(expression)
    if split is None:
        return ""
    shown = []
    for side in split:
        try:
            value = program(side).execute(scope)
        except Exception:
            return ""
        shown.append(f"{side} is {value!r}")
    return ": " + ", ".join(shown)


def _one_comparison(expression: str) -> tuple[str, str] | None:
    """The two sides of an expression that is exactly one comparison at its top level, else None."""
    depth, quote, found = 0, "", []
    i = 0
    while i < len(expression):
        ch = expression[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and expression.startswith(("&&", "||", "?"), i):
            return None
        elif depth == 0:
            op = next((o for o in _COMPARISONS if expression.startswith(o, i)), None)
            if op is not None:
                found.append((i, op))
                i += len(op)
                continue
        i += 1
    if len(found) != 1:
        return None
    at, op = found[0]
    left, right = expression[:at].strip(), expression[at + len(op) :].strip()
    return (left, right) if left and right else None


RAN = frozenset({"autonomous", "approved", "approved_with_edits"})


def results_of(actions: Sequence[ActionRecord]) -> dict[str, Any]:
    """The latest result of each tool that ran among `actions` (by tool name): the `results` a
    check reads. A call that failed, was refused or did not run adds nothing."""
    found: dict[str, Any] = {}
    for action in actions:
        if action.outcome.value in RAN and action.result is not None and "error" not in action.result:
            found[action.tool] = action.result
    return found

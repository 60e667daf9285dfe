"""The condition language of policies and checkpoints: CEL expressions, a one-comparison form, or
callables in code.

Guarantee: conditions fail closed: a missing argument, a type error, a value CEL cannot hold or an
exception in a condition given in code counts as the condition holding (the call is gated); a string
condition is checked when the policy is built (syntax, length, functions CEL provides), so a typo is a
start-up error, not a gate that is always shut. Each expression is compiled once per process.
"""

from __future__ import annotations

import functools
import logging
import operator
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any, TypeAlias

import cel
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

log = logging.getLogger(__name__)

MAX_CONDITION_LENGTH = 2000


# Today's one-comparison form (`amount_usd > 500`): evaluated exactly as it always was, in Decimal
# arithmetic on the argument's value; every other condition is a CEL expression.
_CONDITION = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?)\s*$")


# The standard CEL functions the runtime provides (macros such as `has` and `exists` expand to operators).
_CEL_FUNCTIONS = frozenset(
    {"size", "matches", "startsWith", "endsWith", "contains", "int", "uint", "double", "string", "bytes", "dyn"}
    | {"type", "timestamp", "duration", "getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek"}
    | {"getDayOfYear", "getHours", "getMinutes", "getSeconds", "getMilliseconds"}
)


_CEL_OPERATOR = re.compile(r"^([^A-Za-z0-9]+|@in|@not_strictly_false)$")


_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


Condition: TypeAlias = str | Callable[[Any], bool]
"""A CEL expression over the arguments (`amount_usd > 500 && region in ["eu", "uk"]`), or a callable
that receives the validated arguments and returns True when the call needs approval."""


def condition_holds(when: Condition, args: BaseModel | Mapping[str, Any]) -> bool:
    """Whether the call meets the condition; True (gated) on any doubt."""
    if callable(when):
        try:
            result = when(args)
        except Exception as exc:
            log.warning("condition %s raised %r: the call is gated", describe_condition(when), exc)
            return True
        return result if isinstance(result, bool) else True
    legacy = _CONDITION.match(when)
    if legacy is not None:
        field, op, threshold = legacy.groups()
        return _comparison_holds(field, op, threshold, args)
    try:
        result = program(when).execute(cel_arguments(args))
    except Exception:  # an undefined field, no such overload, a value CEL cannot hold: fail closed
        return True
    return result if isinstance(result, bool) else True


def _comparison_holds(field: str, op: str, threshold: str, args: BaseModel | Mapping[str, Any]) -> bool:
    if isinstance(args, BaseModel):
        if field not in type(args).model_fields:
            return True
        value = getattr(args, field)
    elif field in args:
        value = args[field]
    else:
        return True  # a condition on a missing field cannot clear the gate: fail closed
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return True
    if not number.is_finite():
        return True
    return _OPERATORS[op](number, Decimal(threshold))


def check_condition(when: str) -> None:
    """Raise ValueError unless `when` is a condition this module can evaluate."""
    if len(when) > MAX_CONDITION_LENGTH:
        raise ValueError(f"condition is longer than {MAX_CONDITION_LENGTH} characters")
    if _CONDITION.match(when):
        return
    try:
        compiled = program(when)
    except ValueError as exc:
        first = (str(exc).splitlines() or ["syntax error"])[0]
        raise ValueError(
            f"condition {when!r} is not a valid CEL expression ({first.rpartition('ERROR: ')[2]}); "
            'e.g. \'amount_usd > 500 && region in ["eu", "uk"]\''
        ) from None
    unknown = sorted(f for f in compiled.functions() if f not in _CEL_FUNCTIONS and not _CEL_OPERATOR.match(f))
    if unknown:
        # It would fail (closed) on every call: a mistake to report now, not a gate that is always shut.
        raise ValueError(f"condition {when!r} calls {', '.join(unknown)}, not a CEL function")


def condition_variables(when: Condition) -> list[str]:
    """The names a string condition refers to (including names bound inside macros); [] for a callable."""
    if callable(when):
        return []
    legacy = _CONDITION.match(when)
    return [legacy.group(1)] if legacy else list(program(when).variables())


@functools.lru_cache(maxsize=512)
def program(when: str) -> cel.Program:
    return cel.compile(when)


def cel_arguments(args: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as CEL values, each named directly: Decimals become doubles (so `amount_usd > 500`
    compares numbers), nested models become maps (`address.country == "DE"`), enums their values."""
    if isinstance(args, BaseModel):
        return {name: _cel_value(getattr(args, name)) for name in type(args).model_fields}
    return {str(k): _cel_value(v) for k, v in args.items()}


def _cel_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, Enum):
        return _cel_value(value.value)
    if isinstance(value, BaseModel):
        return {name: _cel_value(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, Mapping):
        return {str(k): _cel_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_cel_value(v) for v in value]
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return _cel_value(to_jsonable_python(value))


def describe_condition(when: Condition) -> str:
    return when if isinstance(when, str) else name_of(when, "a condition in code")


def name_of(source: Callable[..., Any], anonymous: str) -> str:
    name = str(getattr(source, "__qualname__", None) or type(source).__name__)
    return anonymous if name.endswith("<lambda>") else f"{name}()"

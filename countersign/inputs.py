"""How a handler reachable through the Restate ingress reads its input.

Guarantee: a handler whose input serde is `Body(Model)` never runs with a missing, empty or
mis-shaped input. The SDK hands a handler `None` for an empty body (it would fail inside and be
retried until the invocation pauses); `Body` refuses it instead, and refuses a body that does not
validate, with a message that names what is wrong. The SDK turns that into a terminal error, and the
services' `clean_failures` makes it a 400 (see `countersign.security.redact`): nothing is retried,
nothing is left backing off.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError
from restate.serde import Serde

M = TypeVar("M", bound=BaseModel)


class InputRefused(ValueError):
    """A handler's input that is missing or does not fit its model; the message says which."""


def validation_summary(model: str, exc: ValidationError) -> str:
    """One line naming each problem of an input (at most eight), without the values given."""
    problems = []
    for err in exc.errors()[:8]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        problems.append(f"{where}: {err['msg']}")
    return f"invalid {model}: " + "; ".join(problems)


class Body(Serde[M], Generic[M]):
    """The input of a handler the ingress reaches: a JSON object of `model`, required."""

    def __init__(self, model: type[M]) -> None:
        self.model = model

    def deserialize(self, buf: bytes) -> M | None:
        if not bytes(buf).strip():
            raise InputRefused(f"a JSON body is required ({self.model.__name__}); none was given")
        try:
            return self.model.model_validate_json(buf)
        except ValidationError as exc:
            raise InputRefused(validation_summary(self.model.__name__, exc)) from None

    def serialize(self, obj: M | None) -> bytes:
        return obj.model_dump_json().encode() if obj is not None else b""

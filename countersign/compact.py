"""How the large pydantic values of the gate are written to Restate's journal: without the fields
that are at their default.

Guarantee: a value reads back equal to what was written (a field left out takes its default, which
is what it held), and a value written in full, by an earlier release, reads the same; so a step's
result, a call's parameter or a handler's input costs the journal what it says, not the size of its
schema. The same rule `RunBook.save` applies to the state it stores.

The rule that keeps it so: never change the default of a field of a model journaled this way (or of
a model inside one); add a field instead. A value left out is read with the reader's default, and
during an upgrade a run pinned to the old deployment exchanges these values with approvals on the
new one. `tests/unit/test_compact.py` holds the defaults and fails when one changes.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel
from restate.serde import Serde

M = TypeVar("M", bound=BaseModel)


class Compact(Serde[M], Generic[M]):
    """JSON of `model` with `exclude_defaults`; an empty buffer is None (as the SDK's own serde)."""

    def __init__(self, model: type[M]) -> None:
        self.model = model

    def serialize(self, obj: M | None) -> bytes:
        return obj.model_dump_json(exclude_defaults=True).encode() if obj is not None else b""

    def deserialize(self, buf: bytes) -> M | None:
        return self.model.model_validate_json(buf) if buf else None

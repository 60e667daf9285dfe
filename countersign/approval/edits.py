"""Edits an approver makes before approving: only declared fields, only within their rules.

Guarantee: `apply_edits` returns arguments that validate against the tool's own pydantic model and
respect every field's rule, or raises `EditRejected` with a message for the approver; the frozen
arguments are never changed in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import ValidationError

from countersign.tools.registry import Tool, validation_message


class EditRejected(ValueError):
    pass


def apply_edits(
    tool: Tool, frozen: Mapping[str, Any], edits: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(executed arguments, the fields that actually changed) for `edits` on `frozen`."""
    for name in edits:
        if name not in tool.editable:
            raise EditRejected(f"{name} cannot be edited")
    try:
        executed = tool.validate({**frozen, **edits}).model_dump(mode="json")
        # What runs is this dump, validated again at execution: a model that normalises a value (rounds
        # it, say) must accept its own output, or the approval would fail later instead of here.
        tool.validate(executed)
    except ValidationError as exc:
        raise EditRejected(f"the edited values are not valid: {validation_message(exc)}") from None
    changed = {name: executed[name] for name in edits if executed[name] != frozen.get(name)}
    for name, value in changed.items():
        if tool.editable[name].direction == "decrease_only" and not _lower(value, frozen.get(name)):
            raise EditRejected(f"{name} may only be lowered (was {frozen.get(name)})")
    return executed, changed


def _lower(new: Any, old: Any) -> bool:
    try:
        return Decimal(str(new)) < Decimal(str(old))
    except InvalidOperation:
        return False

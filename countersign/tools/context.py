"""Facts for the approver: a tool's read-only `context` function, read once per gated call.

Guarantee: the facts are read in a journaled step, so a replay shows the approver exactly what was
read the first time. They are read inside the step that asks the policy about the call (the model
turn's step for the agent, `ask policy <tool> #<index>` for `gated_call` and `request_approval`),
which costs no round trip before the request email, when nothing else of the caller runs between
that step and the approval: otherwise (a turn with a call that runs alone before the approvals are
asked, a call under an approved plan) in a step of their own (`context <tool> #<index>`) right before
the approval is frozen, after those calls. Never for a call that runs without a person. The reading
never fails its step: a function that raises, returns something that is not a mapping, or takes
longer than TOOL_CONTEXT_TIMEOUT_SECONDS yields no facts and a reason instead ("the facts could not
be read"), and the approval goes out as it would have without them. Labels and values are bounded
in number and length; values are plain text (rendered, escaped, by the pages and emails).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field
from restate import Context, RunOptions, TerminalError

from countersign.contract import Fact
from countersign.errors import is_cancellation
from countersign.security.redact import scrub
from countersign.settings import get_settings
from countersign.tools import default_registry
from countersign.tools.execute import _call, effect_context
from countersign.tools.registry import Tool

MAX_FACTS = 12
MAX_LABEL = 60
MAX_VALUE = 300
# The body below catches every failure of the user's function, so a retry could only repeat a
# failure of our own (serialisation); one more attempt, then the approval goes out without facts.
_CONTEXT_STEP = RunOptions[Any](max_attempts=2, initial_retry_interval=timedelta(milliseconds=100))


class ActionContext(BaseModel):
    """What the step journals: the facts, or why there are none."""

    facts: list[Fact] = Field(default_factory=list)
    error: str | None = None


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split()) if limit <= MAX_LABEL else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def facts_of(value: Any) -> list[Fact]:
    """The labelled facts of a context function's answer; ValueError when it is not a mapping."""
    if not isinstance(value, Mapping):
        raise ValueError(f"returned a {type(value).__name__}, not a mapping of label to value")
    facts = [Fact(label=_short(str(k), MAX_LABEL), value=_short(_text(v), MAX_VALUE)) for k, v in value.items()]
    return facts[:MAX_FACTS]


async def _read(tool: Tool, raw: dict[str, Any], index: int, run_id: str, tenant: str, requester: str) -> ActionContext:
    assert tool.context is not None
    timeout = get_settings().tool_context_timeout_seconds
    ctx = effect_context(run_id, index, tenant=tenant, requester=requester)
    try:
        answer = await asyncio.wait_for(_call(tool.context, tool.validate(raw), ctx), timeout)
        return ActionContext(facts=facts_of(answer))
    except TimeoutError:
        return ActionContext(error=f"reading them took longer than {timeout:g} s")
    except Exception as exc:  # the user's code failed: the approval goes out without its facts
        first = (str(exc).splitlines() or [""])[0]
        return ActionContext(error=scrub(_short(f"{type(exc).__name__}: {first}".rstrip(": "), MAX_VALUE)))


async def read_facts(
    tool_name: str, args: dict[str, Any], index: int, *, run_id: str, tenant: str, requester: str
) -> ActionContext:
    """The tool's facts for the approver of call `index` (validated `args`), read in the caller's
    own step; nothing for a tool without a `context` function. Never raises for the user's code."""
    tool = default_registry().get(tool_name)
    if tool is None or tool.context is None:
        return ActionContext()
    return await _read(tool, args, index, run_id, tenant, requester)


async def read_context(
    ctx: Context, tool_name: str, args: dict[str, Any], index: int, *, run_id: str, tenant: str, requester: str
) -> ActionContext:
    """The facts as a step of their own, for a call whose policy step did not read them (see the
    module); nothing for a tool without a `context` function (and then no step at all)."""
    tool = default_registry().get(tool_name)
    if tool is None or tool.context is None:
        return ActionContext()

    async def read() -> ActionContext:
        return await _read(tool, args, index, run_id, tenant, requester)

    try:
        result: ActionContext = await ctx.run_typed(f"context {tool_name} #{index}", read, _CONTEXT_STEP)
    except TerminalError as exc:
        if is_cancellation(exc):
            raise
        return ActionContext(error=f"the step failed: {scrub(exc.message)}")
    return result

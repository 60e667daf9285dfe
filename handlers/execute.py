"""Executing a tool call as one journaled step.

Guarantee: the effect runs inside `ctx.run_typed` with the idempotency key `<run_id>/<index>`, so
a step re-run after a crash hits the tool's own dedupe; business refusals come back as a result the
model can read, and a tool that keeps failing ends as `failed` after bounded retries, never a loop.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from restate import Context, RunOptions, TerminalError

from handlers.faults import crash_point, fail_point
from handlers.redact import scrubbed
from handlers.settings import get_settings
from handlers.tools import default_registry
from handlers.tools.registry import EffectContext, ToolError
from handlers.verdict import is_cancellation

TOOL_RETRIES = RunOptions[Any](
    max_attempts=5, initial_retry_interval=timedelta(milliseconds=200), max_duration=timedelta(minutes=5)
)


class ToolRun(BaseModel):
    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None


def idempotency_key(run_id: str, index: int) -> str:
    return f"{run_id}/{index}"


@scrubbed
def _effect(tool_name: str, args: dict[str, Any], key: str) -> ToolRun:
    tool = default_registry().get(tool_name)
    if tool is None:
        return ToolRun(ok=False, error=f"unknown tool {tool_name}")
    try:
        fail_point(f"fail-in-effect:{tool_name}", f"{tool_name} failed for {args}")
        result = tool.effect(tool.validate(args), EffectContext(get_settings().demo_db, key))
    except ToolError as exc:
        return ToolRun(ok=False, error=str(exc))
    crash_point(f"crash-after-effect:{tool_name}")
    return ToolRun(ok=True, result=result)


async def run_tool(ctx: Context, tool_name: str, args: dict[str, Any], index: int, *, run_id: str) -> ToolRun:
    key = idempotency_key(run_id, index)
    try:
        return await ctx.run_typed(f"tool {tool_name} #{index}", _effect, TOOL_RETRIES, tool_name, args, key)
    except TerminalError as exc:
        if is_cancellation(exc):
            raise
        return ToolRun(ok=False, error=f"the tool kept failing and was given up: {exc}")


@scrubbed
def _precondition(tool_name: str, args: dict[str, Any], key: str) -> str | None:
    tool = default_registry().get(tool_name)
    if tool is None or tool.precondition is None:
        return None
    change: str | None = tool.precondition(tool.validate(args), EffectContext(get_settings().demo_db, key))
    return change


class Recheck(BaseModel):
    change: str | None


async def recheck(ctx: Context, tool_name: str, args: dict[str, Any], index: int, *, run_id: str) -> str | None:
    """The tool's precondition, as its own step right before execution: what changed, or None."""

    def check() -> Recheck:
        return Recheck(change=_precondition(tool_name, args, idempotency_key(run_id, index)))

    try:
        result: Recheck = await ctx.run_typed(f"recheck {tool_name} #{index}", check, TOOL_RETRIES)
    except TerminalError as exc:
        if is_cancellation(exc):
            raise
        return f"could not re-check {tool_name} before running it: {exc.message}"
    return result.change

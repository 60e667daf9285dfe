"""Executing a tool call as one journaled step.

Guarantee: the effect runs inside `ctx.run_typed` with the idempotency key `<run_id>/<index>`, so
a step re-run after a crash hits the tool's own dedupe; business refusals come back as a result the
model can read, and a tool that keeps failing ends as `failed` after bounded retries, never a loop.
An `async def` effect is awaited on the event loop; a plain one runs in a worker thread, off it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from restate import Context, RunOptions, TerminalError

from countersign.errors import is_cancellation
from countersign.faults import crash_point, fail_point
from countersign.observability import metrics, tracing
from countersign.security.redact import scrubbed
from countersign.tools import default_registry
from countersign.tools.registry import EffectContext, ToolError, is_async

TOOL_RETRIES = RunOptions[Any](
    max_attempts=5, initial_retry_interval=timedelta(milliseconds=200), max_duration=timedelta(minutes=5)
)


class ToolRun(BaseModel):
    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    at: float | None = None
    """When the effect finished (journaled with it; None in older journals)."""


def idempotency_key(run_id: str, index: int) -> str:
    return f"{run_id}/{index}"


async def _call(function: Callable[..., Any], *args: Any) -> Any:
    if is_async(function):
        return await function(*args)
    result = await asyncio.to_thread(function, *args)
    return await result if inspect.isawaitable(result) else result


@scrubbed
async def _effect(tool_name: str, args: dict[str, Any], ctx: EffectContext) -> ToolRun:
    tool = default_registry().get(tool_name)
    if tool is None:
        return ToolRun(ok=False, error=f"unknown tool {tool_name}")
    try:
        fail_point(f"fail-in-effect:{tool_name}", f"{tool_name} failed for {args}")
        result = await _call(tool.effect, tool.validate(args), ctx)
    except ToolError as exc:
        return ToolRun(ok=False, error=str(exc), at=time.time())
    except Exception:
        metrics.effect_attempt_failed(tool_name)  # this attempt ran and raised: Restate retries it
        raise
    crash_point(f"crash-after-effect:{tool_name}")
    return ToolRun(ok=True, result=result, at=time.time())


def effect_context(
    run_id: str,
    index: int,
    *,
    tenant: str = "",
    requester: str = "",
    approval_id: str | None = None,
    approved_by: Sequence[str] = (),
    edits: dict[str, Any] | None = None,
) -> EffectContext:
    return EffectContext(
        idempotency_key=idempotency_key(run_id, index),
        run_id=run_id,
        tenant=tenant,
        requester=requester,
        approval_id=approval_id,
        approved_by=tuple(approved_by),
        edits=dict(edits) if edits else None,
    )


async def run_tool(
    ctx: Context,
    tool_name: str,
    args: dict[str, Any],
    index: int,
    *,
    run_id: str,
    tenant: str = "",
    requester: str = "",
    approval_id: str | None = None,
    approved_by: Sequence[str] = (),
    edits: dict[str, Any] | None = None,
) -> ToolRun:
    """Run the tool's effect once as step `tool <name> #<index>`; the keywords reach its EffectContext."""
    context = effect_context(
        run_id,
        index,
        tenant=tenant,
        requester=requester,
        approval_id=approval_id,
        approved_by=approved_by,
        edits=edits,
    )
    ids = {"tool": tool_name, "approval_id": approval_id, "run_id": run_id, "tenant": tenant}
    with tracing.step("effect", **ids) as span:
        try:
            run: ToolRun = await ctx.run_typed(
                f"tool {tool_name} #{index}", _effect, TOOL_RETRIES, tool_name, args, context
            )
        except TerminalError as exc:
            if is_cancellation(exc):
                raise
            run = ToolRun(ok=False, error=f"the tool kept failing and was given up: {exc}")
            outcome = "failed"
        else:
            outcome = "succeeded" if run.ok else "refused"
        tracing.annotate(span, outcome=outcome)
    metrics.record_effect(tool_name, outcome)
    return run


@scrubbed
async def _precondition(tool_name: str, args: dict[str, Any], ctx: EffectContext) -> str | None:
    tool = default_registry().get(tool_name)
    if tool is None or tool.precondition is None:
        return None
    change: str | None = await _call(tool.precondition, tool.validate(args), ctx)
    return change


class Recheck(BaseModel):
    change: str | None


async def recheck(
    ctx: Context,
    tool_name: str,
    args: dict[str, Any],
    index: int,
    *,
    run_id: str,
    tenant: str = "",
    requester: str = "",
    approval_id: str | None = None,
    edits: dict[str, Any] | None = None,
) -> str | None:
    """The tool's precondition, as its own step right before execution: what changed, or None."""
    context = effect_context(run_id, index, tenant=tenant, requester=requester, approval_id=approval_id, edits=edits)

    async def check() -> Recheck:
        return Recheck(change=await _precondition(tool_name, args, context))

    ids = {"tool": tool_name, "approval_id": approval_id, "run_id": run_id, "tenant": tenant}
    with tracing.step("recheck", **ids) as span:
        try:
            result: Recheck = await ctx.run_typed(f"recheck {tool_name} #{index}", check, TOOL_RETRIES)
        except TerminalError as exc:
            if is_cancellation(exc):
                raise
            tracing.annotate(span, outcome="failed")
            return f"could not re-check {tool_name} before running it: {exc.message}"
        tracing.annotate(span, outcome="changed" if result.change else "unchanged")
    return result.change

"""One proposed tool call: validate it, ask the policy, then run it or hand it to the gate.

Guarantee: an unknown tool or invalid arguments become an `invalid` outcome the model can read,
never a crash; the policy's answer is journaled, so a policy-file change cannot re-route a replay.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from handlers.contract import ActionRecord, Outcome
from handlers.execute import idempotency_key, run_tool
from handlers.gate import approval_round
from handlers.llm.base import ToolCall
from handlers.policy import PolicyVerdict, evaluate
from handlers.run_state import RunBook
from handlers.tools import default_registry
from handlers.tools.registry import validation_message


def _policy_for(tool_name: str, args: dict[str, Any]) -> PolicyVerdict:
    tool = default_registry().get(tool_name)
    assert tool is not None
    return evaluate(tool_name, tool.policy, args)


async def handle_call(book: RunBook, call: ToolCall, index: int) -> ActionRecord:
    tool = default_registry().get(call.name)
    if tool is None:
        known = ", ".join(default_registry().names())
        return book.record_action(_invalid(call, index, f"unknown tool {call.name!r}; available: {known}"))
    try:
        validated = tool.validate(call.args)
    except ValidationError as exc:
        return book.record_action(_invalid(call, index, f"invalid arguments: {validation_message(exc)}"))
    args = validated.model_dump(mode="json")

    policy = await book.ctx.run_typed(f"policy {call.name} #{index}", _policy_for, tool_name=call.name, args=args)
    if policy.gated:
        gated = await approval_round(book, tool, call, args, index, policy, tool.summarize(validated))
        book.record_action(gated.action)
        if gated.fail_run:
            raise RunMustFail(f"{call.name} #{index}: {gated.action.reason}")
        return gated.action

    run = await run_tool(book.ctx, call.name, args, index)
    return book.record_action(
        ActionRecord(
            index=index,
            tool=call.name,
            proposed_args=args,
            args=args,
            outcome=Outcome.AUTONOMOUS if run.ok else Outcome.FAILED,
            result=run.result if run.ok else {"error": run.error},
            idempotency_key=idempotency_key(book.state.run_id, index),
        )
    )


class RunMustFail(Exception):
    """A tool's policy says an unanswered approval fails the whole run."""


def _invalid(call: ToolCall, index: int, message: str) -> ActionRecord:
    return ActionRecord(
        index=index,
        tool=call.name,
        proposed_args=call.args,
        outcome=Outcome.INVALID,
        result={"error": message},
    )

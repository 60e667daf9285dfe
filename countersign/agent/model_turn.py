"""One model turn of an agent run, journaled as one step: the model's reply and the policy's answer
for each of its tool calls (and, for the calls the policy gates, their tools' facts).

Guarantee: the model, the policy and the facts are read inside the step, so a replay re-asks
nothing and routes the same way; final provider refusals end the step, the rest are retried with
bounded exponential backoff (or the provider's retry-after); a retired model is an answer, not a failure.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from restate import RunOptions, TerminalError
from restate.exceptions import RetryableError

from countersign.agent.retirement import Retired, retired_choice
from countersign.agent.turn import PolicyAnswer, ask_policy, read_gated_facts
from countersign.compact import Compact
from countersign.contract import (
    AgentTask,
    Successor,
)
from countersign.events import emit as events
from countersign.llm import ModelUnavailable, check_model, confidence, load_model
from countersign.llm.base import (
    AssistantTurn,
    ModelRetired,
    ProviderBusy,
    ProviderRefused,
    ToolSpec,
    Transcript,
    bounded,
)
from countersign.llm.planning import PlanReply, ask_for_plan
from countersign.security.redact import scrubbed
from countersign.settings import get_settings
from countersign.tools import default_registry


def tool_specs() -> list[ToolSpec]:
    specs = []
    for t in default_registry():
        # A tool whose policy gates on the model's confidence asks the model for it (an optional argument).
        asked = confidence.asking(t.schema()) if t.policy.gate_below_confidence is not None else None
        specs.append(
            ToolSpec(
                name=t.name,
                description=t.description,
                parameters=asked or t.schema(),
                approval=t.policy.describe(t.name),
                gated=t.policy.gated,
                confidence=asked is not None,
            )
        )
    return specs


def model_retries() -> RunOptions[Any]:
    """How one model turn is journaled (compactly: see countersign.compact) and retried: exponential
    from 1 s (or the provider's retry-after), bounded."""
    return RunOptions[Any](
        serde=Compact(Turn),
        max_attempts=get_settings().model_max_attempts,
        initial_retry_interval=timedelta(seconds=1),
        max_retry_interval=timedelta(seconds=30),
        max_duration=timedelta(minutes=15),
    )


class Turn(BaseModel):
    """One journaled model turn: the model that answered (pinned by the first turn), its reply, and
    the policy's answer for each of the reply's tool calls; or, when the run asks for a plan first,
    the model's plan (`plan`, and an empty reply); or, when the model was gone, `retired`."""

    model: str
    reply: AssistantTurn
    policies: list[PolicyAnswer | None]
    plan: PlanReply | None = None
    retired: Retired | None = None
    webhooks: bool = True
    """Whether the tenant had webhook endpoints then (decides whether the run's end is sent)."""


def wants_plan(task: AgentTask) -> bool:
    """Post-plan gating: asked for by the task, or by the policy of a loaded tool."""
    return task.plan is not None or any(t.policy.plan is not None for t in default_registry())


def pick_model(requested: str | None) -> str:
    return requested or get_settings().model


@scrubbed
def model_turn(
    model_id: str | None,
    task: AgentTask,
    transcript: Transcript,
    results: dict[str, Any] | None = None,
    last_gated: str | None = None,
    planning: bool = False,
) -> Turn:
    """One model turn (the body of a journaled step): final refusals end the step, the rest retry.
    A retired model is an answer, not a failure: the choice of what follows is journaled with it.
    With `planning`, a run that wants a plan (decided here, so a replay takes the same branch) asks
    the model for one instead. The turn also journals whether the tenant has webhooks now."""
    model_id = model_id or pick_model(task.model)
    webhooks = events.wanted(task.tenant)
    try:
        specs = tool_specs()
        if planning and wants_plan(task):
            model = load_model(model_id, task.script, task.plan.script if task.plan else None)
            plan = ask_for_plan(model, transcript, specs)
            return Turn(model=model_id, reply=AssistantTurn(), policies=[], plan=plan, webhooks=webhooks)
        reply = bounded(confidence.take(load_model(model_id, task.script).next_turn(transcript, specs), specs))
        return Turn(
            model=model_id,
            reply=reply,
            policies=ask_policy(reply.tool_calls, requester=task.requester, tenant=task.tenant, results=results),
            webhooks=webhooks,
        )
    except ModelRetired as exc:
        choice = retired_choice(task.on_model_retired, last_gated)
        problem = None
        if isinstance(choice, Successor):
            try:
                check_model(choice.successor)
            except ModelUnavailable as unavailable:
                problem = str(unavailable)
        return Turn(
            model=model_id,
            reply=AssistantTurn(),
            policies=[],
            retired=Retired(detail=exc.message, choice=choice, successor_problem=problem),
            webhooks=webhooks,
        )
    except (ProviderRefused, ModelUnavailable) as exc:
        raise TerminalError(str(exc), 400) from None
    except ProviderBusy as exc:
        if exc.retry_after:
            raise RetryableError(exc.message, 503, timedelta(seconds=exc.retry_after)) from None
        raise


async def turn_step(run_id: str, base: int, planned: bool, task: AgentTask, **turn: Any) -> Turn:
    """The body of a model turn's journaled step: the turn (in a thread: the model clients block),
    then, on the event loop where a tool's async functions run, the facts of the calls the policy
    gates (see `read_gated_facts`; `planned`: the run has an approved plan). Call `i` of the reply
    gets index `base + i`."""
    taken = await asyncio.to_thread(model_turn, task=task, **turn)
    await read_gated_facts(
        taken.reply.tool_calls,
        taken.policies,
        run_id=run_id,
        base=base,
        tenant=task.tenant,
        requester=task.requester,
        planned=planned,
    )
    return taken

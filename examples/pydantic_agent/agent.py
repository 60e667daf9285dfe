"""Acme Billing's collections agent on Pydantic AI, served beside Countersign with
`COUNTERSIGN_SERVICES=examples.pydantic_agent.agent:services` and the billing example's tools and
policy (`COUNTERSIGN_TOOLS=examples.billing.tools:TOOLS`, `APPROVALS_POLICY_FILE=examples/billing/policy.toml`).

`AgentCollection` (key = invoice id) runs a Pydantic AI agent wrapped in `RestateAgent`. Its tools
are the Countersign tools `lookup_invoice` and `charge_card`; the same policies that govern
`InvoiceCollection` (`gated_call`) and `AgentRun` govern it: the charge over $250 (or to a test
card) waits for the tenant's account manager, who may lower it, and runs once under `agent-<invoice>/<n>`.

The model is `ACME_AGENT_MODEL`: `scripted` (the default: offline, looks the invoice up and charges
what is due) or any Pydantic AI model string, e.g. `openai:gpt-4.1-mini` (OPENAI_API_KEY),
`openai-chat:llama3.1` with OPENAI_BASE_URL for a local OpenAI-compatible server, `ollama:llama3.1`
with OLLAMA_BASE_URL.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import restate
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, infer_model
from pydantic_ai.models.function import AgentInfo, FunctionModel
from restate.ext.pydantic import RestateAgent

from countersign.integrations.pydantic_ai import Countersign, CountersignToolset

MODEL_SETTING = "ACME_AGENT_MODEL"

INSTRUCTIONS = (
    "You collect overdue invoices for Acme Billing. Look the invoice up with lookup_invoice, then charge "
    "the amount due to the card on file with charge_card, saying in one sentence why. A charge may need a "
    "person's approval; if it is denied, do not try it again: report what happened and why."
)


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The offline model: look the invoice up, charge what is due, then report what happened."""
    prompt = " ".join(
        str(part.content)
        for m in messages
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, UserPromptPart)
    )
    found = re.search(r"inv_[0-9]+", prompt)
    invoice_id = found.group(0) if found else "inv_0"
    results = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
    if not results:
        return ModelResponse(parts=[ToolCallPart("lookup_invoice", {"invoice_id": invoice_id})])
    invoice: Any = results[0].content
    if len(results) == 1 and isinstance(invoice, dict) and "due_usd" in invoice:
        why = f"Invoice {invoice_id} is {invoice['days_overdue']} days overdue."
        charge = {"invoice_id": invoice_id, "amount_usd": invoice["due_usd"], "card": invoice["card"]}
        return ModelResponse(parts=[TextPart(why), ToolCallPart("charge_card", charge)])
    return ModelResponse(parts=[TextPart(f"{results[-1].tool_name}: {json.dumps(results[-1].content)}")])


def model() -> Model:
    """The model `ACME_AGENT_MODEL` names; a bad name or a missing key stops the start, naming the setting."""
    name = os.environ.get(MODEL_SETTING, "scripted").strip()
    if name == "scripted":
        return FunctionModel(scripted, model_name="scripted")
    try:
        return infer_model(name)
    except Exception as exc:
        raise RuntimeError(f"{MODEL_SETTING}={name!r}: {exc}") from None


agent = RestateAgent(
    Agent(model(), instructions=INSTRUCTIONS, toolsets=[CountersignToolset(["lookup_invoice", "charge_card"])])
)


class Collect(BaseModel):
    requester: str = Field(description="Who asks for the collection (told of the outcome)")
    tenant: str = "default"


class Collected(BaseModel):
    invoice_id: str
    summary: str
    actions: list[dict[str, Any]] = Field(default_factory=list)
    """The gate's record of each call: outcome, arguments run, who approved, why."""


collection = restate.Workflow("AgentCollection")


@collection.main()
async def run(ctx: restate.WorkflowContext, collect: Collect) -> Collected:
    invoice_id = ctx.key()
    gate = Countersign(requester=collect.requester, tenant=collect.tenant, run_id=f"agent-{invoice_id}")
    result = await agent.run(f"Collect invoice {invoice_id}.", capabilities=[gate])
    actions = [a.model_dump(mode="json", include={"outcome", "args", "approved_by", "reason"}) for a in gate.actions]
    return Collected(invoice_id=invoice_id, summary=str(result.output), actions=actions)


services = [collection]

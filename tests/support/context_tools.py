"""Tools whose `context` function fails, for COUNTERSIGN_TOOLS=tests.support.context_tools:TOOLS.

The demo tools, plus two gated copies of `email_customer` whose facts cannot be read: one raises,
one never answers (within TOOL_CONTEXT_TIMEOUT_SECONDS). Their approvals must still go out.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from countersign.tools.registry import EffectContext
from handlers.demo.tools import DEMO_TOOLS, EmailCustomerArgs

_EMAIL = next(t for t in DEMO_TOOLS if t.name == "email_customer")


def broken_facts(args: EmailCustomerArgs, ctx: EffectContext) -> dict[str, Any]:
    raise RuntimeError(f"crm is down for {args.customer_id}")


async def slow_facts(args: EmailCustomerArgs, ctx: EffectContext) -> dict[str, Any]:
    await asyncio.sleep(120)  # cancelled by the timeout long before
    return {"never": "shown"}


TOOLS = [
    *DEMO_TOOLS,
    replace(_EMAIL, name="email_broken_facts", context=broken_facts),
    replace(_EMAIL, name="email_slow_facts", context=slow_facts),
]

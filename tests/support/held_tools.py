"""A gated tool whose effect waits for the test, for COUNTERSIGN_TOOLS=tests.support.held_tools:TOOLS.

The demo tools, plus `email_held`: `email_customer`'s arguments and policy, whose effect writes
`<HELD_TOOLS_DIR>/<run id>.started` and then waits (30 s at most) for `<run id>.go`, so a test can act
while an approved action is running (tests/integration/test_durability.py).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from countersign.tools.registry import EffectContext
from handlers.demo.tools import DEMO_TOOLS, EmailCustomerArgs

HELD_WAIT_SECONDS = 30.0


async def held_email(args: EmailCustomerArgs, ctx: EffectContext) -> dict[str, Any]:
    folder = Path(os.environ["HELD_TOOLS_DIR"])
    (folder / f"{ctx.run_id}.started").touch()
    deadline = time.monotonic() + HELD_WAIT_SECONDS
    while not (folder / f"{ctx.run_id}.go").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return {"sent_to": args.customer_id}


_EMAIL = next(t for t in DEMO_TOOLS if t.name == "email_customer")
TOOLS = [*DEMO_TOOLS, replace(_EMAIL, name="email_held", effect=held_email, precondition=None)]

"""A user's app with Restate services of its own that do not use the gate (the Service `Greeter`, the
Virtual Object `Counter`: `both`), and two values `COUNTERSIGN_SERVICES` must refuse: `NOT_A_SERVICE`,
and `clash`, a Service named like one of Countersign's.

Used by tests/integration/test_user_services.py: served as `myapp.services:both` (tests/support/user_code
on the app's PYTHONPATH), and named in bad settings from `serve` started in tests/support/user_code."""

import restate

greeter = restate.Service("Greeter")


@greeter.handler()
async def greet(ctx: restate.Context, name: str) -> str:
    return await ctx.run_typed("greeting", lambda: f"hello {name}")


counter = restate.VirtualObject("Counter")


@counter.handler()
async def add(ctx: restate.ObjectContext, n: int) -> int:
    total = (await ctx.get("total", type_hint=int) or 0) + n
    ctx.set("total", total)
    return total


both = [greeter, counter]
NOT_A_SERVICE = 42
clash = restate.Service("AgentRun")

"""The floor: a bare Restate workflow doing the durable operations of a Countersign run, and nothing else.

Guarantee: `BenchFloor.run` journals `steps` no-op `ctx.run` steps, then (with `wait`) one "notify"
step that writes a marker file the way a mailer hands over a message, a durable-promise wait, and one
"act" step whose journaled timestamp is the moment the action ran; `decide` resolves the promise.
It is served like the handlers' Restate endpoint (same hypercorn config, a Starlette shape) so the two
differ only by Countersign's own logic. Run it with `python -m bench.floor --bind HOST:PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import restate
from pydantic import BaseModel, Field
from restate import WorkflowContext, WorkflowSharedContext
from restate.server_types import RestateAppT
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route

from countersign.runtime.server import Listener, restate_config, serve

SERVICE = "BenchFloor"
MARKERS_ENV = "BENCH_FLOOR_MARKERS"
DECISION = "decision"


class FloorTask(BaseModel):
    steps: int = Field(default=0, ge=0, le=10_000)
    wait: bool = False


class FloorDecision(BaseModel):
    verdict: str = "approve"


class FloorResult(BaseModel):
    steps: int
    notified_at: float | None = None
    acted_at: float | None = None


async def _noop() -> None:
    return None


def _write_marker(folder: Path, name: str) -> float:
    """Write `<name>.notify` atomically (temp file, then rename), as the outbox mailer does."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".notify")
    with os.fdopen(fd, "wb") as f:
        f.write(b"notify " + name.encode() + b"\n")
    os.replace(tmp, folder / f"{name}.notify")
    return time.time()


def _now() -> float:
    return time.time()


def make_floor(markers: Path) -> restate.Workflow:
    floor = restate.Workflow(SERVICE, description="Bench floor: bare durable steps and one promise wait.")

    @floor.main(name="run")
    async def run(ctx: WorkflowContext, task: FloorTask) -> FloorResult:
        for i in range(task.steps):
            await ctx.run_typed(f"step {i}", _noop)
        if not task.wait:
            return FloorResult(steps=task.steps)
        notified = await ctx.run_typed("notify", _write_marker, folder=markers, name=ctx.key())
        await ctx.promise(DECISION, type_hint=FloorDecision).value()
        acted = await ctx.run_typed("act", _now)
        return FloorResult(steps=task.steps, notified_at=notified, acted_at=acted)

    @floor.handler(name="decide")
    async def decide(ctx: WorkflowSharedContext, decision: FloorDecision) -> str:
        await ctx.promise(DECISION, type_hint=FloorDecision).resolve(decision)
        return "ok"

    return floor


def create_app(markers: Path) -> Starlette:
    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    endpoint: RestateAppT = restate.app(services=[make_floor(markers)])
    return Starlette(routes=[Route("/healthz", healthz, methods=["GET"]), Mount("/restate", app=endpoint)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="127.0.0.1:9082", help="HOST:PORT")
    parser.add_argument("--markers", type=Path, default=os.environ.get(MARKERS_ENV), help="folder for notify markers")
    args = parser.parse_args(argv)
    if args.markers is None:
        parser.error(f"--markers (or ${MARKERS_ENV}) is required")
    args.markers.mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(Listener(create_app(args.markers), restate_config(args.bind), "--bind")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

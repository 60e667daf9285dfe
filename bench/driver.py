"""What every scenario drives the stack with: ingress calls, waits, CPU accounts and fresh run ids.

Guarantee: every request and wait has a timeout (the plan's), every run id is new (a random prefix
per bench run), and a run that answers anything but success raises `BenchError` at once.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from bench.plan import Plan
from bench.probes import CpuAccount
from bench.stack import Stack
from bench.subjects import BenchError, Countersign, Floor, Library, ProductFloor, Subject
from bench.watch import MarkerWatcher

T = TypeVar("T")
_JSON = {"content-type": "application/json"}


@dataclass
class Driver:
    stack: Stack
    plan: Plan
    ingress: httpx.AsyncClient
    countersign: Countersign
    floor: Floor
    library: Library
    product: ProductFloor
    prefix: str = field(default_factory=lambda: "b" + secrets.token_hex(3))
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def subjects(self) -> tuple[Subject, ...]:
        """Every system: the bare floor, the product floor, the agent, the library path."""
        return (self.floor, self.product, self.countersign, self.library)

    @property
    def pair(self) -> tuple[Subject, Subject]:
        """The floor and the agent: the scenarios that measure the agent's own shape (steps per model
        turn, resume after N turns, a crash mid-script) leave the library path out."""
        return (self.floor, self.countersign)

    @property
    def watchers(self) -> list[MarkerWatcher]:
        """One per folder (the agent and the library path share the outbox)."""
        return list({id(s.watcher): s.watcher for s in self.subjects}.values())

    def run_ids(self, subject: Subject, tag: str, count: int) -> list[str]:
        return [f"{self.prefix}-{tag}-{subject.name[:2]}-{next(self._ids)}" for _ in range(count)]

    def cpu(self, subject: Subject) -> CpuAccount:
        restate, app = self.stack.restate, subject.app
        return CpuAccount({"restate": lambda: restate.pid, "app": lambda: app.pid, "bench": os.getpid})

    async def send(self, subject: Subject, run_id: str, task: dict[str, Any]) -> None:
        response = await self.ingress.post(
            f"/{subject.service}/{run_id}/run/send", content=subject.body(task), headers=_JSON
        )
        if response.status_code != 202:
            raise BenchError(f"starting {run_id} answered {response.status_code}: {response.text[:300]}")

    async def call(self, subject: Subject, run_id: str, task: dict[str, Any]) -> dict[str, Any]:
        """Run to completion through the ingress and return the output."""
        response = await self.ingress.post(
            f"/{subject.service}/{run_id}/run", content=subject.body(task), headers=_JSON, timeout=self.plan.timeout
        )
        if response.status_code != 200:
            raise BenchError(f"{run_id} answered {response.status_code}: {response.text[:300]}")
        return subject.read(response.content)

    async def attach(self, subject: Subject, run_id: str) -> dict[str, Any]:
        """Wait for the run to complete and return its output."""
        response = await self.ingress.get(
            f"/restate/workflow/{subject.service}/{run_id}/attach", timeout=self.plan.timeout
        )
        if response.status_code != 200:
            raise BenchError(f"{run_id} ended with {response.status_code}: {response.text[:300]}")
        return subject.read(response.content)

    async def start_all(self, subject: Subject, tasks: dict[str, dict[str, Any]]) -> None:
        await bounded_gather((self.send(subject, run_id, task) for run_id, task in tasks.items()), 16)

    async def wait_notified(self, subject: Subject, run_ids: Iterable[str]) -> None:
        for run_id in run_ids:
            await subject.watcher.wait(run_id, self.plan.timeout)

    async def wait_suspended(self, subject: Subject, run_ids: list[str]) -> None:
        """Until every run is suspended in restate (its handler attempt has ended while it waits)."""
        wanted = set(run_ids)
        deadline = time.monotonic() + self.plan.timeout
        query = (
            "select target_service_key as k from sys_invocation where target_service_name = "  # noqa: S608
            f"{sql_literal(subject.service)} and target_handler_name = 'run' and status = 'suspended'"
            f" and target_service_key like {sql_literal(self.prefix + '-%')}"
        )
        while True:
            rows = await asyncio.to_thread(self.stack.restate.sql, query)
            missing = wanted - {row["k"] for row in rows}
            if not missing:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"{len(missing)} {subject.name} runs did not suspend within {self.plan.timeout}s")
            await asyncio.sleep(0.2)

    async def wait_quiet(self) -> None:
        """Until nothing is in flight but suspended runs (e.g. the inbox and audit calls they sent)."""
        deadline = time.monotonic() + self.plan.timeout
        query = "select count(*) as n from sys_invocation where status not in ('suspended', 'completed')"
        while int((await asyncio.to_thread(self.stack.restate.sql, query))[0]["n"]):
            if time.monotonic() > deadline:
                raise BenchError(f"invocations still in flight after {self.plan.timeout}s")
            await asyncio.sleep(0.2)

    async def count_suspended(self, subject: Subject) -> int:
        query = (
            "select count(*) as n from sys_invocation where target_service_name = "  # noqa: S608
            f"{sql_literal(subject.service)} and target_handler_name = 'run' and status = 'suspended'"
        )
        rows = await asyncio.to_thread(self.stack.restate.sql, query)
        return int(rows[0]["n"])


async def bounded_gather(jobs: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """Await all jobs with at most `limit` in flight; results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Awaitable[T]) -> T:
        async with gate:
            return await job

    return await asyncio.gather(*(one(job) for job in jobs))


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sql_literal(value: str) -> str:
    """A quoted SQL string for restate's admin query API (which takes no bind parameters)."""
    return "'" + value.replace("'", "''") + "'"

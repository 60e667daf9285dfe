"""Approvers and operators as the fault runner simulates them: they open the emailed link, think,
press a button, and keep trying (as a person would) while the stack is down.

Guarantee: every attempt is bounded (`PERSISTENCE` seconds); a final answer is any 2xx/4xx, while
connection errors and 5xx ("not confirmed", "try again") are retried with the same form, which the
ingress idempotency key turns into the same decision; every answer is recorded for the invariants.
"""

from __future__ import annotations

import html
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
from support.approver import CSRF
from support.processes import Ingress, wait_until

PERSISTENCE = 120.0
_BATCH_ITEM = re.compile(r'name="verdict\.(\d+)" value="approve"')
_CONFIRM = re.compile(r'<code>([^<]*)</code></label>\s*<input id="confirm[^"]*" name="(confirm(?:\.\d+)?)"')
_MAIN = re.compile(r"<main[^>]*>(.*?)</main>", re.S)
_TAG = re.compile(r"<[^>]+>")


def _gist(page: str) -> str:
    """What a page says, as text (its <main>, tags and runs of whitespace removed), for the report."""
    found = _MAIN.search(page)
    return " ".join(html.unescape(_TAG.sub(" ", found.group(1) if found else page)).split())[:300]


@dataclass
class Click:
    """One approver's decision on one email (single or batch), and what the page answered."""

    run_id: str
    person: str
    link: str
    verdict: str
    reason: str
    batch: bool
    csrf: str | None = None
    items: list[int] = field(default_factory=list)
    confirm: dict[str, str] = field(default_factory=dict)
    """What a high-stakes page asks the approver to retype, by field name, as the page shows it."""
    opened: int | None = None
    """The page's status when the approver opened it (a closed approval shows no form: no press)."""
    status: int | None = None
    """The answer to the press (the form's POST); None when they never pressed."""
    text: str = ""
    attempts: int = 0
    error: str | None = None


@dataclass
class Cancel:
    run_id: str
    reason: str
    receipt: dict[str, Any] | None = None
    attempts: int = 0
    error: str | None = None


def _final(response: httpx.Response) -> bool:
    return response.status_code < 500


def _attempt(call: Any, counter: list[int]) -> httpx.Response | None:
    counter[0] += 1
    try:
        response: httpx.Response = call()
    except httpx.TransportError:
        return None
    return response if _final(response) else None


class People:
    """Runs every person's action on its own thread; the fault runner only schedules them."""

    def __init__(self, origin: str, ingress: Ingress) -> None:
        self.origin = origin
        self.ingress = ingress
        self.clicks: list[Click] = []
        self.cancels: list[Cancel] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def busy(self) -> bool:
        with self._lock:
            return any(t.is_alive() for t in self._threads)

    def join(self, timeout: float) -> None:
        wait_until(lambda: not self.busy(), timeout, "every simulated person to get a final answer")

    def open(self, click: Click, think: threading.Event) -> None:
        """Open the page now (remembering its form, as a tab left open does), press when `think` is set."""
        with self._lock:
            self.clicks.append(click)
        self._spawn(self._open_then_press, click, think)

    def _open_then_press(self, click: Click, think: threading.Event) -> None:
        counter = [0]
        try:
            page = wait_until(
                lambda: _attempt(lambda: httpx.get(click.link, timeout=30), counter), PERSISTENCE, "the page to open"
            )
        except TimeoutError as exc:
            click.error = str(exc)
            return
        click.opened = page.status_code
        found = CSRF.search(page.text)
        if found is None:
            click.opened, click.text = page.status_code, "no form: " + _gist(page.text)
            return
        click.csrf = found.group(1)
        click.items = [int(i) for i in _BATCH_ITEM.findall(page.text)] if click.batch else []
        click.confirm = {name: html.unescape(value) for value, name in _CONFIRM.findall(page.text)}
        if click.batch and not click.items:
            click.opened, click.text = page.status_code, "nothing left to decide: " + _gist(page.text)
            return
        if not think.wait(PERSISTENCE):
            click.error = "never told to press"
            return
        if click.verdict == "leave":
            return
        self._press(click, counter)

    def _press(self, click: Click, counter: list[int]) -> None:
        data = {"csrf": click.csrf or ""}
        if click.verdict == "approve":
            data |= click.confirm
        if click.batch:
            for index in click.items:
                data[f"verdict.{index}"] = click.verdict
                data[f"reason.{index}"] = click.reason
        else:
            data |= {"verdict": click.verdict, "reason": click.reason}
        headers = {"Origin": self.origin}
        try:
            answer = wait_until(
                lambda: _attempt(lambda: httpx.post(click.link, data=data, headers=headers, timeout=30), counter),
                PERSISTENCE,
                f"a final answer to {click.person}'s {click.verdict} on {click.run_id}",
                interval=0.3,
            )
        except TimeoutError as exc:
            click.error = str(exc)
            return
        finally:
            click.attempts = counter[0]
        click.status, click.text = answer.status_code, answer.text

    def cancel(self, run_id: str, reason: str) -> None:
        record = Cancel(run_id, reason)
        with self._lock:
            self.cancels.append(record)
        self._spawn(self._cancel, record)

    def _cancel(self, record: Cancel) -> None:
        counter = [0]

        def call() -> httpx.Response:
            body, key = {"reason": record.reason}, {"idempotency-key": record.reason}
            return self.ingress.call("AgentRun", record.run_id, "cancel", body, headers=key)

        try:
            answer = wait_until(
                lambda: _attempt(call, counter), PERSISTENCE, f"cancel of {record.run_id}", interval=0.3
            )
        except TimeoutError as exc:
            record.error = str(exc)
            return
        finally:
            record.attempts = counter[0]
        record.receipt = answer.json() if answer.status_code == 200 else {"status": answer.status_code}

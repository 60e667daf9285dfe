"""Unit tests: the facts a tool reads for its approver, the run's trail, and the diff of an edited
long text; how the emails show them (escaped, fenced), and that older records still read."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import BaseModel
from support.injection import FORGED_LINES, our_lines_only, value_lines_outside_blocks
from support.records import approval_record

from countersign import textdiff as diff
from countersign.approval.trail import MAX_STEPS, trail_of
from countersign.contract import ActionRecord, ApprovalRecord, Fact, Outcome, TrailStep
from countersign.mail.approval_email import approval_request
from countersign.settings import Settings
from countersign.tools.context import MAX_FACTS, MAX_VALUE, _read, facts_of
from countersign.tools.policy import ToolPolicy
from countersign.tools.registry import EffectContext, Tool

SETTINGS = Settings(
    approvals_signing_keys="k1:" + "s" * 40,  # type: ignore[arg-type]
    approvals_public_url="https://approve.example.org",
)
EVIL = "<script>alert('x')</script>"


class Args(BaseModel):
    n: int


def tool(context: Any) -> Tool:
    return Tool(
        name="t",
        description="d",
        args_model=Args,
        effect=lambda a, c: {},
        policy=ToolPolicy(gated=True, approvers=("a@example.com",)),
        context=context,
    )


def read(context: Any, monkeypatch: pytest.MonkeyPatch, timeout: str = "5") -> Any:
    monkeypatch.setenv("TOOL_CONTEXT_TIMEOUT_SECONDS", timeout)
    from countersign.settings import get_settings

    get_settings.cache_clear()
    try:
        # In a thread of its own: Playwright's sync API may hold a running loop in this one.
        with ThreadPoolExecutor(1) as pool:
            reading = _read(tool(context), {"n": 1}, 0, "run-1", "default", "r@example.com")
            return pool.submit(asyncio.run, reading).result(timeout=60)
    finally:
        get_settings.cache_clear()


def test_facts_are_labelled_text_bounded_in_number_and_length() -> None:
    facts = facts_of({"Total": 612.4, "Tags": ["a", "b"], "Note": "x" * 1000, **{f"k{i}": i for i in range(20)}})
    assert len(facts) == MAX_FACTS
    assert facts[0] == Fact(label="Total", value="612.4")
    assert facts[1].value == '["a", "b"]'
    assert len(facts[2].value) == MAX_VALUE and facts[2].value.endswith("…")
    with pytest.raises(ValueError, match="not a mapping"):
        facts_of(["a"])


def test_a_sync_and_an_async_context_function_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    async def facts(args: Args, ctx: EffectContext) -> dict[str, str]:
        return {"Run": ctx.run_id, "n": str(args.n)}

    assert read(facts, monkeypatch).facts == [Fact(label="Run", value="run-1"), Fact(label="n", value="1")]
    assert read(lambda a, c: {"Plain": "yes"}, monkeypatch).facts == [Fact(label="Plain", value="yes")]


def test_a_failing_or_slow_context_function_gives_a_reason_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: Args, ctx: EffectContext) -> dict[str, str]:
        raise KeyError("customer c_17 for ops@example.com")

    async def slow(args: Args, ctx: EffectContext) -> dict[str, str]:
        await asyncio.sleep(30)
        return {}

    failed = read(broken, monkeypatch)
    assert failed.facts == [] and failed.error.startswith("KeyError: ")
    assert "ops@example.com" not in failed.error, "an address in the user's message is scrubbed"
    late = read(slow, monkeypatch, timeout="0.2")
    assert late.facts == [] and late.error == "reading them took longer than 0.2 s"
    assert read(lambda a, c: "text", monkeypatch).error == "ValueError: returned a str, not a mapping of label to value"


def test_a_tool_refuses_a_context_that_is_not_callable() -> None:
    with pytest.raises(ValueError, match="context must be a function"):
        tool("not callable")


def test_the_trail_is_the_last_calls_each_shortened() -> None:
    actions = [
        ActionRecord(index=i, tool="lookup_order", proposed_args={"order_id": i}, outcome=Outcome.AUTONOMOUS)
        for i in range(MAX_STEPS + 3)
    ]
    actions[-1] = ActionRecord(
        index=12,
        tool="issue_refund",
        proposed_args={"order_id": 1, "note": "y" * 500},
        outcome=Outcome.FAILED,
        result={"error": "order 1 has only $0.00 left to refund"},
    )
    trail = trail_of(actions)
    assert [t.index for t in trail] == list(range(3, MAX_STEPS + 3))
    assert trail[-1].outcome == "failed" and trail[-1].result == "error: order 1 has only $0.00 left to refund"
    assert len(trail[-1].args) <= 160 and trail[-1].args.endswith("…")
    assert trail_of([TrailStep(index=0, tool="x", outcome="ok", result="a\nb")])[0].result == "a b"


def test_older_records_without_facts_or_trail_still_read() -> None:
    old = approval_record().model_dump(exclude={"context", "context_error", "trail"})
    again = ApprovalRecord.model_validate(old)
    assert again.context == [] and again.context_error is None and again.trail == []


def test_the_email_escapes_and_fences_facts_and_trail() -> None:
    value = "\n".join(["fine", *FORGED_LINES])
    rec = approval_record(
        context=[Fact(label="Order total", value="$612.40"), Fact(label=EVIL, value=value)],
        trail=[TrailStep(index=0, tool="lookup_order", outcome="autonomous", args='{"order_id":1}', result=EVIL)],
    )
    mail = approval_request(rec, 0, "Refund it", SETTINGS)
    assert "    Order total: $612.40" in mail.text
    assert "#0 lookup_order: autonomous" in mail.text and f"        result: {EVIL}" in mail.text
    ours = SETTINGS.approvals_public_url
    approve = next(line for line in mail.text.splitlines() if line.startswith(ours) and line.endswith("=approve"))
    our_lines_only(mail.text, rec.digest[:12], approve)
    assert value_lines_outside_blocks(mail.text, value, ("      | ",)) == []
    assert EVIL not in mail.html and "&lt;script&gt;" in mail.html
    assert "$612.40" in mail.html and "lookup_order" in mail.html


def test_the_email_says_when_the_facts_could_not_be_read() -> None:
    mail = approval_request(approval_record(context_error="TimeoutError\nFingerprint: 0"), 0, "", SETTINGS)
    assert "Facts: the facts could not be read (TimeoutError ↵ Fingerprint: 0)." in mail.text
    assert "The facts could not be read (TimeoutError" in mail.html


def test_the_diff_marks_only_changed_lines_of_long_text() -> None:
    frozen = {"subject": "Hi", "body": "a\nb\nc"}
    assert diff.changes(frozen, {"subject": "Hello"}) == [], "a short field needs no review"
    assert diff.changes(frozen, {"body": "a\nb\nc"}) == []
    [change] = diff.changes(frozen, {"body": "a\nB\nc\nd"})
    assert [(r.sign, r.text) for r in change.lines] == [(" ", "a"), ("-", "b"), ("+", "B"), (" ", "c"), ("+", "d")]
    assert (change.removed, change.added) == (1, 2)
    assert diff.normalized("a\r\nb\rc") == "a\nb\nc"
    assert diff.marker({"body": "x"}) == diff.marker({"body": "x"}) != diff.marker({"body": "y"})


def test_the_batch_email_shows_each_items_facts() -> None:
    from countersign.mail.approval_email import batch_request

    first = approval_record(context=[Fact(label="Order total", value="$612.40")])
    second = approval_record(approval_id="run-1-a3", index=3, context_error="TimeoutError")
    mail = batch_request([first, second], [0, 0], "", SETTINGS)
    assert "   Facts read for you:\n       Order total: $612.40" in mail.text
    assert "   Facts: the facts could not be read (TimeoutError)." in mail.text
    assert "Order total" in mail.html and "could not be read (TimeoutError)" in mail.html

"""One gate path: the same calls, through AgentRun (a scripted model) and through `gated_call` from a
user's own Restate Service, end the same way: the same outcome, the same audit entry kinds and the
same number of refunds in the demo database, against the real restate-server, app and outbox."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from support.approver import submit, wait_for_email
from support.business import new_order, refunds_for
from support.processes import Ingress, RestateServer, make_app_env, start_registered_app, wait_until

from countersign.agent.turn import PolicyAnswer, _recalled
from countersign.approval import routing
from countersign.llm.base import ToolCall

USER_MODULE = """
from typing import Any

import restate
from pydantic import BaseModel

from countersign import Tool, ToolPolicy, gated_call, request_plan_approval
from handlers.demo.tools import DEMO_TOOLS, IssueRefundArgs, issue_refund


class Case(BaseModel):
    run_id: str
    tool: str
    args: dict[str, Any]
    plan: dict[str, Any] | None = None
    on_deviation: str | None = None


path = restate.Service("GatePath")


@path.handler()
async def call(ctx: restate.Context, case: Case) -> dict[str, Any]:
    plan, index = None, 0
    if case.plan is not None:
        plan = await request_plan_approval(
            ctx, plan=case.plan, requester="alice@example.com", run_id=case.run_id, index=0,
            why="the damaged orders", on_deviation=case.on_deviation,
        )
        index = 1
    record = await gated_call(
        ctx, tool=case.tool, args=case.args, requester="alice@example.com", run_id=case.run_id, index=index,
        plan=plan, why="the parcel arrived broken",
    )
    return record.model_dump(mode="json")


served = [path]

# A refund whose approvers come from a callable that names nobody: its policy cannot be resolved.
TOOLS = [
    *DEMO_TOOLS,
    Tool(
        name="refund_unowned",
        description="A refund nobody may approve.",
        args_model=IssueRefundArgs,
        effect=issue_refund,
        policy=ToolPolicy(gated=True, approvers_from=lambda context: []),
    ),
]
"""


@dataclass(frozen=True)
class Case:
    """One call and how it should end. `args` builds the arguments from the case's two fresh orders
    (the first is the one a plan names); `plan` asks a plan first ("ask" or "refuse": its deviation rule);
    `decide` is what the approver does with each request email after the plan's."""

    name: str
    tool: str
    args: Callable[[int, int], dict[str, Any]]
    outcome: str
    refunds: int
    plan: Literal["ask", "refuse"] | None = None
    decide: tuple[str, ...] = ()
    deviation: bool = False
    settles: tuple[tuple[int, str], ...] = ()
    """(index, kind): an audit entry that ends the case's trails (waited for before they are compared)."""


def refund(order: int, amount: str) -> dict[str, Any]:
    return {"order_id": order, "amount_usd": amount, "reason": "damaged in transit"}


PLAN_DECIDED = (0, "outcome")
CASES = [
    Case("unknown tool", "launch_rocket", lambda a, b: {"to": "moon"}, "invalid", 0),
    Case("invalid arguments", "issue_refund", lambda a, b: {"order_id": "x", "amount_usd": -5}, "invalid", 0),
    Case("policy failure", "refund_unowned", lambda a, b: refund(a, "100.00"), "failed", 0),
    Case("autonomous", "issue_refund", lambda a, b: refund(a, "100.00"), "autonomous", 1, settles=((0, "autonomous"),)),
    Case(
        "gated, approved",
        "issue_refund",
        lambda a, b: refund(a, "600.00"),
        "approved",
        1,
        decide=("approve",),
        settles=((0, "outcome"),),
    ),
    Case(
        "gated, rejected",
        "issue_refund",
        lambda a, b: refund(a, "600.00"),
        "rejected",
        0,
        decide=("reject",),
        settles=((0, "outcome"),),
    ),
    Case(
        "inside the plan",
        "issue_refund",
        lambda a, b: refund(a, "600.00"),
        "approved",
        1,
        plan="ask",
        settles=(PLAN_DECIDED, (0, "executed")),
    ),
    Case(
        "outside, refused",
        "issue_refund",
        lambda a, b: refund(b, "600.00"),
        "rejected",
        0,
        plan="refuse",
        deviation=True,
        settles=(PLAN_DECIDED,),
    ),
    Case(
        "outside, asked",
        "issue_refund",
        lambda a, b: refund(b, "600.00"),
        "approved",
        1,
        plan="ask",
        decide=("approve",),
        deviation=True,
        settles=(PLAN_DECIDED, (1, "outcome")),
    ),
]


@dataclass(frozen=True)
class Stack:
    ingress: Ingress
    outbox: Path
    db: Path


@pytest.fixture(scope="module")
def stack(deployment_protocol: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One private restate-server and app for the table: the user's Service and the extra tool loaded."""
    root = tmp_path_factory.mktemp("gate-path")
    (root / "gatepath").mkdir()
    (root / "gatepath" / "__init__.py").write_text("")
    (root / "gatepath" / "user.py").write_text(textwrap.dedent(USER_MODULE))
    with ExitStack() as cleanup:
        restate = RestateServer.start(root / "restate")
        cleanup.callback(restate.stop)
        (outbox := root / "outbox").mkdir()
        env = {
            **make_app_env(ingress_url=restate.ingress_url, outbox_dir=outbox, db_path=root / "business.db"),
            "COUNTERSIGN_SERVICES": "gatepath.user:served",
            "COUNTERSIGN_TOOLS": "gatepath.user:TOOLS",
            "PYTHONPATH": str(root),
        }
        app = start_registered_app(restate, env=env, log_path=root / "app.log", http1=deployment_protocol == "http1")
        cleanup.callback(app.stop)
        ingress = Ingress(restate.ingress_url, restate.journal_keys or None)
        cleanup.callback(ingress.close)
        yield Stack(ingress, outbox, root / "business.db")


def plan_of(order: int) -> dict[str, Any]:
    step = {"tool": "issue_refund", "one_of": {"order_id": [order]}, "at_most": {"amount_usd": 800}, "calls": 1}
    return {"steps": [{**step, "why": "Refund the damaged order."}]}


def decide(stack: Stack, run_id: str, case: Case) -> None:
    """Approve the plan (if any), then decide each request email as the case says."""
    asked = 0
    if case.plan is not None:
        [plan_mail] = wait_for_email(stack.outbox, run_id)
        assert submit(plan_mail.link, "approve").status_code == 200
        asked = 1
    for verdict in case.decide:
        asked += 1
        mail = wait_for_email(stack.outbox, run_id, count=asked)[-1]
        assert submit(mail.link, verdict, "not this one" if verdict == "reject" else "").status_code == 200


def through_the_agent(stack: Stack, run_id: str, case: Case, args: dict[str, Any], planned: int) -> dict[str, Any]:
    task: dict[str, Any] = {
        "goal": "Refund the damaged order",
        "requester": "alice@example.com",
        "script": [{"tool": case.tool, "args": args, "why": "the parcel arrived broken"}],
    }
    if case.plan is not None:
        task["plan"] = {"script": plan_of(planned), "on_deviation": case.plan}
    assert stack.ingress.start_run(run_id, task).status_code == 202
    decide(stack, run_id, case)
    result = stack.ingress.wait_output(run_id, timeout=60).json()
    action: dict[str, Any] = result["actions"][-1]
    return action


def through_gated_call(stack: Stack, run_id: str, case: Case, args: dict[str, Any], planned: int) -> dict[str, Any]:
    body: dict[str, Any] = {"run_id": run_id, "tool": case.tool, "args": args}
    if case.plan is not None:
        body |= {"plan": plan_of(planned), "on_deviation": case.plan}
    invocation = stack.ingress.send("GatePath", None, "call", body)
    decide(stack, run_id, case)
    record: dict[str, Any] = stack.ingress.wait_invocation(invocation, timeout=60).json()
    return record


def audit_kinds(stack: Stack, run_id: str, index: int) -> list[str]:
    entries = stack.ingress.call("ApprovalAudit", f"{run_id}-a{index}", "entries", None).json()["entries"]
    return sorted(entry["kind"] for entry in entries)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_call_ends_the_same_through_the_agent_and_through_gated_call(stack: Stack, case: Case) -> None:
    ends = {}
    for way, through in (("agent", through_the_agent), ("gated_call", through_gated_call)):
        run_id = f"path-{way}-{case.name.replace(' ', '-').replace(',', '')}"
        # The plan names the first order; a call outside it refunds the second.
        planned, other = new_order(stack.db, 100000), new_order(stack.db, 100000)
        record = through(stack, run_id, case, case.args(planned, other), planned)
        assert record["outcome"] == case.outcome, (way, record)
        assert (record.get("deviation") is not None) == case.deviation, (way, record)
        assert (record.get("plan_approval_id") == f"{run_id}-a0") == (case.plan is not None), (way, record)
        assert len(refunds_for(stack.db, run_id)) == case.refunds, way
        ends[way] = (run_id, record)

    (agent_run, agent), (user_run, user) = ends["agent"], ends["gated_call"]
    if case.outcome in ("invalid", "failed"):
        assert agent["result"] == user["result"], (agent, user)
    indexes = (0, 1) if case.plan is not None else (0,)

    def settled() -> bool:
        return all(kind in audit_kinds(stack, run, i) for run in (agent_run, user_run) for i, kind in case.settles)

    def trails() -> dict[int, tuple[list[str], list[str]]]:
        return {i: (audit_kinds(stack, agent_run, i), audit_kinds(stack, user_run, i)) for i in indexes}

    # The audit entries are sent as the calls end and recorded by the audit objects after: poll.
    wait_until(settled, 30, f"the audit entries {case.settles} on both paths")
    try:
        wait_until(lambda: all(a == u for a, u in trails().values()), 10, "the same audit entry kinds")
    except TimeoutError:
        raise AssertionError(f"audit kinds differ (agent, gated_call): {trails()}") from None


def test_a_model_turns_journaled_answers_read_back_as_the_gates_answers() -> None:
    """What an older model turn journaled (None, or a `PolicyAnswer` with a problem or a verdict) is
    read back as the answer `routing.ask` gives, so a paused run routes its calls as it would have."""
    call = ToolCall(id="c1", name="issue_refund", args=refund(7, "600.00"), why="broken")
    asked = routing.ask(call.name, call.args, "alice@example.com", "default")
    written = PolicyAnswer(verdict=asked.verdict, opening=asked.opening).model_dump_json()
    journaled = PolicyAnswer.model_validate_json(written)
    recalled = _recalled(call, journaled)
    assert recalled.model_dump(exclude={"context"}) == asked.model_dump(exclude={"context"})
    assert routing.route(recalled, call.name) == routing.route(asked, call.name) == routing.Route("gated")

    failed = _recalled(call, PolicyAnswer.model_validate({"problem": "approvers_from named nobody"}))
    assert routing.route(failed, call.name) == routing.Route("failed", "not run: approvers_from named nobody")
    assert _recalled(call, None).error == "the tool changed since this call was proposed; propose it again"
    unknown = ToolCall(id="c2", name="launch_rocket", args={})
    assert routing.route(_recalled(unknown, None), unknown.name).kind == "invalid"
    assert routing.route(routing.ask("issue_refund", ["not", "a", "mapping"], "a@example.com", "default"), "x") == (
        routing.Route("invalid", "invalid arguments: expected an object of argument names and values, not list")
    )

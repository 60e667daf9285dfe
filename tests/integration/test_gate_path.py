"""One gate path: the same calls, through AgentRun (a scripted model), through `gated_call` from a
user's own Restate Service and through the framework adapters (a Pydantic AI agent, an OpenAI Agents
SDK agent, a LangChain agent and a Google ADK agent, their models the frameworks' own OpenAI clients
talking to the fake server), end the same way: the same outcome, the same audit entry kinds and the
same number of refunds in the demo database, against the real restate-server, app and outbox. The
user's code is tests/support/gate_path."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from fakes import openai_server as oai
from fakes.fixtures import running
from support.approver import submit, wait_for_email
from support.business import new_order, refunds_for
from support.gate_path import WHY
from support.processes import (
    DEPLOYMENT_PROTOCOLS,
    REPO,
    Ingress,
    RestateServer,
    make_app_env,
    restate_env_of,
    start_registered_app,
    wait_until,
)

from countersign.agent.turn import PolicyAnswer, _recalled
from countersign.approval import routing
from countersign.llm.base import ToolCall

Path_ = Literal["agent", "gated_call", "pydantic_ai", "openai_agents", "langchain", "adk"]

# Why an adapter cannot express a case (the table's adapter columns; None: it runs the case).
PYDANTIC_AI_CHECKS_FIRST = (
    "Pydantic AI answers it before the gate: a tool the agent lacks, or arguments its schema refuses, "
    "go back to the model as a retry prompt"
)
SDK_FAILS_THE_RUN = "the Agents SDK fails the run on a tool the agent lacks (ModelBehaviorError) before the gate"
LANGCHAIN_ANSWERS_FIRST = (
    "LangChain answers a call of a tool the agent lacks itself (an error tool message naming the tools it "
    "has); the middleware gates the agent's Countersign tools only"
)
ADK_FAILS_THE_RUN = (
    "ADK fails the run on a call of a tool the agent lacks (ValueError: Tool not found) before any plugin"
)


@dataclass(frozen=True)
class Case:
    """One call and how it should end. `args` builds the arguments from the case's two fresh orders
    (the first is the one a plan names); `plan` asks a plan first ("ask" or "refuse": its deviation rule);
    `decide` is what the approver does with each request email after the plan's ("approve", "reject", or
    "answer=<value>" for a question's form); `answer` is the answer a question's call ends with. `pydantic_ai`,
    `openai_agents`, `langchain` and `adk`: why that adapter cannot express the case (None: it runs it too)."""

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
    answer: str | None = None
    pydantic_ai: str | None = None
    openai_agents: str | None = None
    langchain: str | None = None
    adk: str | None = None

    def paths(self) -> list[Path_]:
        adapters: list[Path_] = [
            p for p in ("pydantic_ai", "openai_agents", "langchain", "adk") if getattr(self, p) is None
        ]
        return ["agent", "gated_call", *adapters]


def refund(order: int, amount: str) -> dict[str, Any]:
    return {"order_id": order, "amount_usd": amount, "reason": "damaged in transit"}


PLAN_DECIDED = (0, "outcome")
QUESTION = {"question": "Which account should the refund go to?", "choices": ["DE89-3704", "FR76-3000"]}
CASES = [
    Case(
        "unknown tool",
        "launch_rocket",
        lambda a, b: {"to": "moon"},
        "invalid",
        0,
        pydantic_ai=PYDANTIC_AI_CHECKS_FIRST,
        openai_agents=SDK_FAILS_THE_RUN,
        langchain=LANGCHAIN_ANSWERS_FIRST,
        adk=ADK_FAILS_THE_RUN,
    ),
    Case(
        "invalid arguments",
        "issue_refund",
        lambda a, b: {"order_id": "x", "amount_usd": -5},
        "invalid",
        0,
        pydantic_ai=PYDANTIC_AI_CHECKS_FIRST,
    ),
    Case("policy failure", "refund_unowned", lambda a, b: refund(a, "100.00"), "failed", 0),
    Case(
        "autonomous",
        "issue_refund",
        lambda a, b: refund(a, "100.00"),
        "autonomous",
        1,
        settles=((0, "autonomous"),),
    ),
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
    Case(
        "a question, answered",
        "ask_a_person",
        lambda a, b: QUESTION,
        "approved",
        0,
        decide=("answer=FR76-3000",),
        settles=((0, "outcome"),),
        answer="FR76-3000",
    ),
    Case(
        "a question, declined",
        "ask_a_person",
        lambda a, b: QUESTION,
        "rejected",
        0,
        decide=("reject",),
        settles=((0, "outcome"),),
    ),
]


@dataclass(frozen=True)
class Stack:
    ingress: Ingress
    outbox: Path
    db: Path
    model: oai.OpenAIFake
    """The OpenAI-compatible server both adapters' models talk to: one script per run, named after it."""


@pytest.fixture(scope="module")
def stack(deployment_protocol: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One private restate-server and app for the table: the user's services and the extra tool loaded."""
    root = tmp_path_factory.mktemp("gate-path")
    with ExitStack() as cleanup:
        model = cleanup.enter_context(running(oai.OpenAIFake()))
        restate = RestateServer.start(root / "restate", extra_env=restate_env_of(deployment_protocol))
        cleanup.callback(restate.stop)
        (outbox := root / "outbox").mkdir()
        env = {
            **make_app_env(ingress_url=restate.ingress_url, outbox_dir=outbox, db_path=root / "business.db"),
            "COUNTERSIGN_SERVICES": "tests.support.gate_path:served",
            "COUNTERSIGN_TOOLS": "tests.support.gate_path:TOOLS",
            "PYTHONPATH": str(REPO),
            "OPENAI_API_KEY": oai.API_KEY,
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        }
        app = start_registered_app(
            restate, env=env, log_path=root / "app.log", http1=DEPLOYMENT_PROTOCOLS[deployment_protocol]
        )
        cleanup.callback(app.stop)
        ingress = Ingress(restate.ingress_url, restate.journal_keys or None)
        cleanup.callback(ingress.close)
        yield Stack(ingress, outbox, root / "business.db", model)


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
        if verdict.startswith("answer="):
            decided = submit(mail.link, "approve", edits={"answer": verdict.removeprefix("answer=")})
        else:
            decided = submit(mail.link, verdict, "not this one" if verdict == "reject" else "")
        assert decided.status_code == 200, decided.text


def through_the_agent(stack: Stack, run_id: str, case: Case, args: dict[str, Any], planned: int) -> dict[str, Any]:
    task: dict[str, Any] = {
        "goal": "Refund the damaged order",
        "requester": "alice@example.com",
        "script": [{"tool": case.tool, "args": args, "why": WHY}],
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


def told(stack: Stack, run_id: str) -> str:
    """What the model was told of its one call: the tool message of its last request (the fake's log)."""
    [message] = oai.tool_messages(stack.model.seen(run_id)[-1].body)
    return str(message["content"])


def through_an_adapter(
    service: str, stack: Stack, run_id: str, case: Case, args: dict[str, Any], planned: int, key: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The handler has the case's plan (if any) approved and hands it to the adapter; then the model
    (named after the run) proposes the case's call, and answers. Returns what the model was told of
    the call, and what the user's handler returned."""
    stack.model.script(run_id, oai.tool_calls(run_id, (case.tool, args), text=WHY), oai.answer(run_id, "Done."))
    task: dict[str, Any] = {"run_id": run_id}
    if case.plan is not None:
        task |= {"plan": plan_of(planned), "on_deviation": case.plan}
    invocation = stack.ingress.send(service, key, "run", task)
    decide(stack, run_id, case)
    done = stack.ingress.wait_invocation(invocation, timeout=60)
    assert done.status_code == 200, done.text
    assert len(stack.model.seen(run_id)) == 2, "one model call proposing the call, one hearing its outcome"
    output: dict[str, Any] = done.json()
    return told(stack, run_id), output


# What each adapter tells its model of a call that did not run (the gate's outcome, the opening of
# the message). Of a call that ran, Pydantic AI hands the model the tool's result; the Agents SDK
# adapter a report naming the outcome. A refusal outside a plan is the system's, not the approver's.
PYDANTIC_AI_DENIALS = (
    ("rejected", "Rejected by the approver: "),
    ("rejected", "Rejected: "),
    ("failed", "Not run (failed): "),
)
OPENAI_AGENTS_DENIALS = (*PYDANTIC_AI_DENIALS, ("invalid", "Not run (invalid): "))


def heard(text: str, denials: tuple[tuple[str, str], ...]) -> tuple[str | None, str]:
    """The gate's outcome a model was told of (None: it was not told of a denial) and the rest of it."""
    for outcome, opening in denials:
        if text.startswith(opening):
            return outcome, text.removeprefix(opening)
    return None, text


def through_pydantic_ai(stack: Stack, run_id: str, case: Case, args: dict[str, Any], planned: int) -> dict[str, Any]:
    text, output = through_an_adapter("PydanticGatePath", stack, run_id, case, args, planned)
    [reported] = output["actions"]  # the Countersign capability's answer, as the handler reads it
    outcome, rest = heard(text, PYDANTIC_AI_DENIALS)
    if outcome is None:  # it ran: the model holds the tool's result (ToolApproved, whoever approved)
        assert json.loads(text) == reported["result"], (reported, text)
        ran: dict[str, Any] = reported
        return ran
    assert reported["outcome"] == outcome, (reported, text)
    return {**reported, "outcome": outcome, "result": {"error": rest}}


def through_openai_agents(stack: Stack, run_id: str, case: Case, args: dict[str, Any], planned: int) -> dict[str, Any]:
    text, output = through_an_adapter("OpenAIGatePath", stack, run_id, case, args, planned)
    record: dict[str, Any]
    [record] = output["actions"]  # the gate's record, as countersign_actions gives it to the handler
    outcome, rest = heard(text, OPENAI_AGENTS_DENIALS)
    if outcome is None:  # it ran: the model is told the gate's outcome and the tool's result
        report = json.loads(text)
        assert (report["outcome"], report["result"]) == (record["outcome"], record["result"]), (record, text)
        return record
    assert record["outcome"] == outcome, (record, text)
    return {**record, "result": {"error": rest}}


TEXT_DENIALS = OPENAI_AGENTS_DENIALS
"""LangChain's and ADK's adapters tell the model of a denial in the gate's own words (the Agents SDK
adapter's openings too)."""


def through_langchain(stack: Stack, run_id: str, case: Case, args: dict[str, Any], planned: int) -> dict[str, Any]:
    text, output = through_an_adapter("LangChainGatePath", stack, run_id, case, args, planned)
    record: dict[str, Any]
    [record] = output["actions"]  # the gate's record, carried by the tool message the model read
    outcome, _ = heard(text, TEXT_DENIALS)
    if outcome is None:  # it ran: the model holds the tool's result
        assert json.loads(text) == record["result"], (record, text)
        outcome = record["outcome"]
    assert record["outcome"] == outcome, (record, text)
    return record


def through_adk(stack: Stack, run_id: str, case: Case, args: dict[str, Any], planned: int) -> dict[str, Any]:
    text, output = through_an_adapter("AdkGatePath", stack, run_id, case, args, planned, key=run_id)
    record: dict[str, Any]
    [record] = output["actions"]
    response = json.loads(text)  # ADK hands the model the tool's response dict as JSON
    outcome, _ = heard(response["error"], TEXT_DENIALS) if "error" in response else (None, "")
    if outcome is None:  # it ran: the model holds the tool's result
        assert response == record["result"], (record, text)
        outcome = record["outcome"]
    assert record["outcome"] == outcome, (record, text)
    return record


PATHS: dict[Path_, Callable[[Stack, str, Case, dict[str, Any], int], dict[str, Any]]] = {
    "agent": through_the_agent,
    "gated_call": through_gated_call,
    "pydantic_ai": through_pydantic_ai,
    "openai_agents": through_openai_agents,
    "langchain": through_langchain,
    "adk": through_adk,
}


def audit_kinds(stack: Stack, run_id: str, index: int) -> list[str]:
    entries = stack.ingress.call("ApprovalAudit", f"{run_id}-a{index}", "entries", None).json()["entries"]
    return sorted(entry["kind"] for entry in entries)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_a_call_ends_the_same_on_every_path_to_the_gate(stack: Stack, case: Case) -> None:
    ends = {}
    for way in case.paths():
        run_id = f"path-{way}-{case.name.replace(' ', '-').replace(',', '')}".replace("_", "-")
        # The plan names the first order; a call outside it refunds the second.
        planned, other = new_order(stack.db, 100000), new_order(stack.db, 100000)
        record = PATHS[way](stack, run_id, case, case.args(planned, other), planned)
        assert record["outcome"] == case.outcome, (way, record)
        assert (record.get("deviation") is not None) == case.deviation, (way, record)
        assert (record.get("plan_approval_id") == f"{run_id}-a0") == (case.plan is not None), (way, record)
        assert len(refunds_for(stack.db, run_id)) == case.refunds, way
        if case.answer is not None:
            assert record["result"]["answer"] == case.answer, (way, record)
        ends[way] = (run_id, record)

    _, agent = ends["agent"]
    if case.outcome in ("invalid", "failed"):
        for way, (_, record) in ends.items():
            assert record["result"]["error"] == agent["result"]["error"], (way, record, agent)
    indexes = (0, 1) if case.plan is not None else (0,)
    runs = {way: run for way, (run, _) in ends.items()}

    def settled() -> bool:
        return all(kind in audit_kinds(stack, run, i) for run in runs.values() for i, kind in case.settles)

    def trails() -> dict[str, list[list[str]]]:
        return {way: [audit_kinds(stack, run, i) for i in indexes] for way, run in runs.items()}

    def alike() -> bool:
        seen = trails()
        return all(kinds == seen["agent"] for kinds in seen.values())

    # The audit entries are sent as the calls end and recorded by the audit objects after: poll.
    wait_until(settled, 30, f"the audit entries {case.settles} on every path")
    try:
        wait_until(alike, 10, "the same audit entry kinds")
    except TimeoutError:
        raise AssertionError(f"audit kinds differ: {trails()}") from None


def test_request_approval_of_a_question_is_a_400_that_asks_nobody(stack: Stack) -> None:
    """A question is asked and answered through `gated_call` or `ask_person`; `request_approval`, which
    only decides whether a call may run, refuses it with a 400 that names them, and nobody is emailed."""
    case = {"run_id": "request-question", "tool": "ask_a_person", "args": QUESTION}
    refused = stack.ingress.call("GatePath", None, "request", case)
    assert refused.status_code == 400, refused.text
    assert "gated_call" in refused.text and "ask_person" in refused.text
    assert not list(stack.outbox.glob("*request-question*"))


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


ADAPTERS: dict[Path_, tuple[str, Callable[[str], str | None]]] = {
    "pydantic_ai": ("PydanticGatePath", lambda run_id: None),
    "openai_agents": ("OpenAIGatePath", lambda run_id: None),
    "langchain": ("LangChainGatePath", lambda run_id: None),
    "adk": ("AdkGatePath", lambda run_id: run_id),
}
"""Each adapter's service in tests/support/gate_path, and its key for a run."""


@pytest.mark.parametrize("way", list(ADAPTERS))
def test_an_adapter_hands_the_gate_one_plan_for_the_whole_run(stack: Stack, way: Path_) -> None:
    """The plan allows one refund; the model proposes two in one reply. The first runs inside the plan,
    the second is over the plan's count and refused: the adapter hands every call the same plan, whose
    count the gate keeps, and the model hears the refusal."""
    run_id = f"count-{way}".replace("_", "-")
    order = new_order(stack.db, 100000)
    calls = [("issue_refund", refund(order, "600.00")), ("issue_refund", refund(order, "700.00"))]
    stack.model.script(run_id, oai.tool_calls(run_id, *calls, text=WHY), oai.answer(run_id, "Done."))
    service, key = ADAPTERS[way]
    task = {"run_id": run_id, "plan": plan_of(order), "on_deviation": "refuse"}
    invocation = stack.ingress.send(service, key(run_id), "run", task)
    [plan_mail] = wait_for_email(stack.outbox, run_id)
    assert submit(plan_mail.link, "approve").status_code == 200
    done = stack.ingress.wait_invocation(invocation, timeout=60)
    assert done.status_code == 200, done.text

    inside, over = done.json()["actions"]
    assert (inside["outcome"], inside["plan_approval_id"], inside["deviation"]) == ("approved", f"{run_id}-a0", None)
    assert (over["outcome"], over["plan_approval_id"]) == ("rejected", f"{run_id}-a0"), over
    assert over["deviation"].startswith("more calls than the plan allows"), over
    assert len(refunds_for(stack.db, run_id)) == 1
    ran, refused = (str(m["content"]) for m in oai.tool_messages(stack.model.seen(run_id)[-1].body))
    assert "outside the approved plan" not in ran
    assert "refused: outside the approved plan (more calls than the plan allows" in refused, refused

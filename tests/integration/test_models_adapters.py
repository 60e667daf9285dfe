"""The provider adapters through the real `openai` and `anthropic` SDKs against local fake servers.

No Restate here: these check what one turn sends and how each reply or error is read. The runs
themselves (journaling, retries, approvals) are in test_models_runs.py and test_models_replay.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import pytest
from fakes import anthropic_server as anth
from fakes import openai_server as oai
from fakes.fixtures import running
from fakes.provider import Reply
from support.processes import REPO

from countersign.agent.model_turn import tool_specs as _tool_specs
from countersign.llm import ModelUnavailable, check_model, parse_model_id
from countersign.llm.anthropic_chat import AnthropicChat
from countersign.llm.base import (
    AssistantTurn,
    Feedback,
    ProviderBusy,
    ProviderRefused,
    ToolCall,
    ToolResult,
    ToolSpec,
    Transcript,
)
from countersign.llm.openai_chat import OpenAIChat
from countersign.llm.prompt import EMPTY_REPLY
from countersign.llm.provider_errors import retry_after_seconds
from countersign.settings import get_settings
from handlers.demo.tools import IssueRefundArgs, LookupOrderArgs


@pytest.fixture(scope="module")
def openai_fake() -> Iterator[oai.OpenAIFake]:
    with running(oai.OpenAIFake()) as fake:
        yield fake


@pytest.fixture(scope="module")
def anthropic_fake() -> Iterator[anth.AnthropicFake]:
    with running(anth.AnthropicFake()) as fake:
        yield fake


@pytest.fixture()
def model_name(request: pytest.FixtureRequest) -> str:
    return f"fake-{request.node.name[:40]}"


def gpt(fake: oai.OpenAIFake, name: str, timeout: float = 5.0, key: str = oai.API_KEY) -> OpenAIChat:
    return OpenAIChat(f"openai:{name}", name, api_key=key, base_url=fake.base_url, timeout=timeout)


def claude(fake: anth.AnthropicFake, name: str) -> AnthropicChat:
    return AnthropicChat(
        f"anthropic:{name}", name, api_key=anth.API_KEY, base_url=fake.base_url, timeout=5.0, max_tokens=1024
    )


def specs() -> list[ToolSpec]:
    return _tool_specs()


def transcript(*turns: AssistantTurn | ToolResult | Feedback) -> Transcript:
    return Transcript(goal="Refund order 1042 for $612.40", requester="alice@example.com", turns=list(turns))


REFUND = {"order_id": 1042, "amount_usd": "612.40", "reason": "damaged"}


def rejected_refund(call_id: str) -> list[AssistantTurn | ToolResult | Feedback]:
    return [
        AssistantTurn(text="Refunding as asked.", tool_calls=[ToolCall(id=call_id, name="issue_refund", args=REFUND)]),
        ToolResult(
            call_id=call_id,
            name="issue_refund",
            outcome="rejected",
            content={"outcome": "rejected", "reason": "Offer a replacement instead."},
        ),
    ]


# --- OpenAI-compatible ------------------------------------------------------------------------------


def test_openai_request_carries_prompt_schemas_and_the_transcript(openai_fake: oai.OpenAIFake, model_name: str) -> None:
    openai_fake.script(model_name, oai.answer(model_name, "I will not refund it again."))
    history = [*rejected_refund("call_r1"), Feedback(text=EMPTY_REPLY)]
    turn = gpt(openai_fake, model_name).next_turn(transcript(*history), specs())
    assert turn == AssistantTurn(text="I will not refund it again.")

    [seen] = openai_fake.seen(model_name)
    assert seen.path == "/v1/chat/completions"
    system, goal, assistant, tool, feedback = seen.body["messages"]
    assert system["role"] == "system"
    assert "- issue_refund: needs approval when amount_usd > 500" in system["content"]
    assert "- delete_customer: needs approval always" in system["content"]
    assert "A rejection is final for that exact call" in system["content"]
    assert "alice@example.com" in system["content"]
    assert goal == {"role": "user", "content": "Goal: Refund order 1042 for $612.40"}
    assert assistant["tool_calls"][0]["id"] == "call_r1"
    assert assistant["tool_calls"][0]["function"] == {
        "name": "issue_refund",
        "arguments": '{"order_id": 1042, "amount_usd": "612.40", "reason": "damaged"}',
    }
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_r1"
    assert "Offer a replacement instead." in tool["content"] and "final" in tool["content"]
    assert feedback == {"role": "user", "content": EMPTY_REPLY}

    tools = {t["function"]["name"]: t["function"] for t in seen.body["tools"]}
    assert set(tools) == {"lookup_order", "issue_refund", "delete_customer", "email_customer"}
    assert tools["issue_refund"]["parameters"] == IssueRefundArgs.model_json_schema()
    assert tools["lookup_order"]["parameters"] == LookupOrderArgs.model_json_schema()
    assert "Needs a person's approval (needs approval when amount_usd > 500)" in tools["issue_refund"]["description"]
    assert "approval" not in tools["lookup_order"]["description"]


def test_openai_tool_calls_are_read_with_their_ids_and_the_reason_text(
    openai_fake: oai.OpenAIFake, model_name: str
) -> None:
    openai_fake.script(
        model_name,
        oai.tool_calls(
            model_name, ("lookup_order", {"order_id": 1042}), ("issue_refund", REFUND), text="Check, then refund."
        ),
    )
    turn = gpt(openai_fake, model_name).next_turn(transcript(), specs())
    assert turn.text == "Check, then refund."
    assert [(c.name, c.args, c.why, c.problem) for c in turn.tool_calls] == [
        ("lookup_order", {"order_id": 1042}, "Check, then refund.", None),
        ("issue_refund", REFUND, "Check, then refund.", None),
    ]
    assert all(c.id.startswith("call_fake") for c in turn.tool_calls)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [('{"order_id": 10', "not valid JSON"), ("[1042]", "must be a JSON object"), ("", None)],
    ids=["truncated", "array", "empty"],
)
def test_openai_unreadable_arguments_become_a_problem_not_an_exception(
    openai_fake: oai.OpenAIFake, model_name: str, raw: str, expected: str | None
) -> None:
    openai_fake.script(model_name, oai.tool_calls(model_name, ("lookup_order", raw)))
    [call] = gpt(openai_fake, model_name).next_turn(transcript(), specs()).tool_calls
    assert call.args == {}
    if expected is None:
        assert call.problem is None
    else:
        assert call.problem is not None and expected in call.problem and raw in call.problem


def test_openai_empty_reply_is_an_empty_turn(openai_fake: oai.OpenAIFake, model_name: str) -> None:
    empty = oai.completion(model_name, {"role": "assistant", "content": "", "refusal": None}, "stop")
    openai_fake.script(model_name, empty)
    assert gpt(openai_fake, model_name).next_turn(transcript(), specs()).empty


def test_openai_errors_are_classified(openai_fake: oai.OpenAIFake, model_name: str) -> None:
    openai_fake.script(
        model_name,
        oai.rate_limited("7"),
        oai.error(503, "The server is overloaded.", "server_error"),
        oai.error(400, "Invalid 'messages[1].content': string too long.", "invalid_request_error"),
    )
    model = gpt(openai_fake, model_name)
    with pytest.raises(ProviderBusy) as busy:
        model.next_turn(transcript(), specs())
    assert busy.value.retry_after == 7.0 and "HTTP 429" in busy.value.message
    assert "rate_limit_exceeded: Rate limit reached" in busy.value.message
    with pytest.raises(ProviderBusy) as overloaded:
        model.next_turn(transcript(), specs())
    assert overloaded.value.retry_after is None and "HTTP 503" in overloaded.value.message
    with pytest.raises(ProviderRefused) as refused:
        model.next_turn(transcript(), specs())
    assert "HTTP 400" in refused.value.message and "string too long" in refused.value.message
    assert len(openai_fake.seen(model_name)) == 3, "the SDK's own retries are off"


def test_openai_wrong_key_is_final(openai_fake: oai.OpenAIFake, model_name: str) -> None:
    with pytest.raises(ProviderRefused, match=r"HTTP 401.*invalid_api_key"):
        gpt(openai_fake, model_name, key="sk-wrong").next_turn(transcript(), specs())


def test_openai_timeout_is_retryable(openai_fake: oai.OpenAIFake, model_name: str) -> None:
    slow = oai.answer(model_name, "too late")
    openai_fake.script(model_name, Reply(slow.status, slow.body, delay=5.0))
    with pytest.raises(ProviderBusy, match="did not answer within the timeout"):
        gpt(openai_fake, model_name, timeout=0.5).next_turn(transcript(), specs())


def test_unreachable_provider_is_retryable() -> None:
    model = OpenAIChat("openai:x", "x", api_key="k", base_url="http://127.0.0.1:9/v1", timeout=2.0)
    with pytest.raises(ProviderBusy, match="could not be reached"):
        model.next_turn(transcript(), specs())


# --- Anthropic ----------------------------------------------------------------------------------------


def test_anthropic_request_alternates_roles_and_answers_every_tool_use(
    anthropic_fake: anth.AnthropicFake, model_name: str
) -> None:
    anthropic_fake.script(model_name, anth.answer(model_name, "Not refunded: the approver wants a replacement."))
    history: list[AssistantTurn | ToolResult | Feedback] = [
        AssistantTurn(tool_calls=[ToolCall(id="toolu_a", name="lookup_order", args={"order_id": 1042})]),
        ToolResult(call_id="toolu_a", name="lookup_order", outcome="autonomous", content={"outcome": "autonomous"}),
        AssistantTurn(),
        Feedback(text=EMPTY_REPLY),
        *rejected_refund("toolu_b"),
        AssistantTurn(tool_calls=[ToolCall(id="toolu_c", name="launch", args={})]),
        ToolResult(call_id="toolu_c", name="launch", outcome="invalid", content={"error": "unknown tool 'launch'"}),
    ]
    turn = claude(anthropic_fake, model_name).next_turn(transcript(*history), specs())
    assert turn.text == "Not refunded: the approver wants a replacement." and not turn.tool_calls

    [seen] = anthropic_fake.seen(model_name)
    body = seen.body
    assert seen.headers.get("anthropic-version")
    assert body["max_tokens"] == 1024
    assert "A rejection is final for that exact call" in body["system"]
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert body["messages"][2]["content"][1] == {"type": "text", "text": EMPTY_REPLY}
    assert body["messages"][3]["content"] == [
        {"type": "text", "text": "Refunding as asked."},
        {"type": "tool_use", "id": "toolu_b", "name": "issue_refund", "input": REFUND},
    ]
    results = anth.tool_results(body)
    assert [r["tool_use_id"] for r in results] == ["toolu_a", "toolu_b", "toolu_c"]
    assert "Offer a replacement instead." in results[1]["content"] and "is_error" not in results[1]
    assert results[2]["is_error"] is True
    tools = {t["name"]: t for t in body["tools"]}
    assert tools["issue_refund"]["input_schema"] == IssueRefundArgs.model_json_schema()


def test_anthropic_tool_use_and_text_are_read(anthropic_fake: anth.AnthropicFake, model_name: str) -> None:
    anthropic_fake.script(
        model_name, anth.tool_use(model_name, ("issue_refund", REFUND), text="The customer sent photos.")
    )
    [call] = claude(anthropic_fake, model_name).next_turn(transcript(), specs()).tool_calls
    assert (call.name, call.args, call.why, call.problem) == ("issue_refund", REFUND, "The customer sent photos.", None)
    assert call.id.startswith("toolu_fake")


def test_anthropic_empty_content_is_an_empty_turn(anthropic_fake: anth.AnthropicFake, model_name: str) -> None:
    anthropic_fake.script(model_name, anth.message(model_name, [], "end_turn"))
    assert claude(anthropic_fake, model_name).next_turn(transcript(), specs()).empty


def test_anthropic_errors_are_classified(anthropic_fake: anth.AnthropicFake, model_name: str) -> None:
    anthropic_fake.script(
        model_name,
        anth.overloaded(),
        anth.error(429, "rate_limit_error", "Number of requests has exceeded your rate limit", {"retry-after": "3"}),
        anth.error(404, "not_found_error", f"model: {model_name}"),
    )
    model = claude(anthropic_fake, model_name)
    with pytest.raises(ProviderBusy, match="HTTP 529: overloaded_error: Overloaded"):
        model.next_turn(transcript(), specs())
    with pytest.raises(ProviderBusy) as limited:
        model.next_turn(transcript(), specs())
    assert limited.value.retry_after == 3.0
    with pytest.raises(ProviderRefused, match=f"HTTP 404.*not_found_error: model: {model_name}"):
        model.next_turn(transcript(), specs())


# --- choosing a model ---------------------------------------------------------------------------------


@pytest.fixture()
def provider_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Settings re-read from a controlled environment for the duration of one test."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_settings.cache_clear()


def test_model_ids_are_checked_with_a_message_that_says_what_to_do(provider_settings: pytest.MonkeyPatch) -> None:
    assert parse_model_id("openai:gpt-4.1-mini") == ("openai", "gpt-4.1-mini")
    assert parse_model_id("anthropic:claude-sonnet-4-5") == ("anthropic", "claude-sonnet-4-5")
    assert parse_model_id("openai:meta-llama/Llama-3.1-8B-Instruct")[1] == "meta-llama/Llama-3.1-8B-Instruct"
    check_model("scripted")
    for bad in ("gpt-4.1-mini", "openai:", "mistral:large", "openai: spaced"):
        with pytest.raises(ModelUnavailable, match="use scripted, openai:<model>"):
            check_model(bad)
    with pytest.raises(ModelUnavailable, match="needs OPENAI_API_KEY, which is not set"):
        check_model("openai:gpt-4.1-mini")
    with pytest.raises(ModelUnavailable, match="needs ANTHROPIC_API_KEY"):
        check_model("anthropic:claude-sonnet-4-5")
    provider_settings.setenv("ANTHROPIC_API_KEY", "sk-ant-x")
    get_settings.cache_clear()
    check_model("anthropic:claude-sonnet-4-5")


def test_a_missing_sdk_extra_names_the_extra(provider_settings: pytest.MonkeyPatch) -> None:
    provider_settings.setenv("OPENAI_API_KEY", "sk-x")
    get_settings.cache_clear()
    provider_settings.setitem(sys.modules, "openai", None)  # what `import openai` sees when it is not installed
    with pytest.raises(
        ModelUnavailable, match=r"needs the openai SDK, which is not installed: install Countersign's openai extra"
    ):
        check_model("openai:gpt-4.1-mini")


def _serve(env: dict[str, str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    serve = "sys.exit(main(['serve', '--bind', '127.0.0.1:9']))"
    code = f"{prelude}\nimport sys\nfrom countersign.ops.cli import main\n{serve}"
    full_env: dict[str, Any] = {
        **os.environ,
        "APPROVALS_SIGNING_KEYS": "k1:" + "s" * 40,
        "OPENAI_API_KEY": "",
        "ANTHROPIC_API_KEY": "",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=60
    )


def test_startup_refuses_a_model_it_cannot_use() -> None:
    no_key = _serve({"MODEL": "anthropic:claude-sonnet-4-5"})
    assert no_key.returncode == 1
    assert "MODEL: model provider 'anthropic' needs ANTHROPIC_API_KEY" in no_key.stderr
    assert "Traceback" not in no_key.stderr

    no_extra = _serve(
        {"MODEL": "openai:gpt-4.1-mini", "OPENAI_API_KEY": "sk-x"}, prelude="import sys; sys.modules['openai'] = None"
    )
    assert no_extra.returncode == 1
    assert "pip install -e '.[openai]' in a checkout" in no_extra.stderr


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "1.5", "retry-after-ms": "x"}, 1.5),
        ({"retry-after": "86400"}, 300.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_headers(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_seconds(headers) == expected


def test_retry_after_as_an_http_date() -> None:

    seconds = retry_after_seconds({"retry-after": formatdate(time.time() + 30, usegmt=True)})
    assert seconds is not None and 25 <= seconds <= 31

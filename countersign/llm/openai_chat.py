"""Any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, a LiteLLM proxy) via the `openai` SDK.

Guarantee: one `next_turn` is one HTTP request (the SDK's own retries are off: the agent loop's
journaled step retries instead); a reply whose tool arguments are not a JSON object comes back as a
`ToolCall` with `problem` set rather than an exception, so the model can be told and try again.
"""

from __future__ import annotations

import json
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from countersign.llm.base import AssistantTurn, Feedback, ProviderBusy, ToolCall, ToolResult, ToolSpec, Transcript
from countersign.llm.prompt import result_text, system_prompt, task_message, tool_description
from countersign.llm.provider_errors import classify

PROVIDER = "OpenAI-compatible endpoint"


class OpenAIChat:
    def __init__(self, model_id: str, name: str, *, api_key: str, base_url: str | None, timeout: float) -> None:
        self.model_id = model_id
        self.name = name
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)

    def next_turn(self, transcript: Transcript, tools: list[ToolSpec]) -> AssistantTurn:
        try:
            completion = self._client.chat.completions.create(
                model=self.name, messages=to_messages(transcript, tools), tools=[_tool(t) for t in tools]
            )
        except openai.APIStatusError as exc:
            raise classify(PROVIDER, exc.status_code, exc.body, exc.response.headers) from None
        except openai.APITimeoutError:
            raise ProviderBusy(f"{PROVIDER} did not answer within the timeout") from None
        except openai.APIConnectionError as exc:
            raise ProviderBusy(f"{PROVIDER} could not be reached: {exc.__cause__ or exc}") from None
        except openai.APIResponseValidationError as exc:
            raise ProviderBusy(f"{PROVIDER} sent a reply that is not a chat completion: {exc}") from None
        return from_completion(completion)


def to_messages(transcript: Transcript, tools: list[ToolSpec]) -> list[ChatCompletionMessageParam]:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": system_prompt(transcript, tools)},
        {"role": "user", "content": task_message(transcript)},
    ]
    for turn in transcript.turns:
        if isinstance(turn, ToolResult):
            messages.append({"role": "tool", "tool_call_id": turn.call_id, "content": result_text(turn)})
        elif isinstance(turn, Feedback):
            messages.append({"role": "user", "content": turn.text})
        elif turn.tool_calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": turn.text or None,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": json.dumps(call.args)},
                        }
                        for call in turn.tool_calls
                    ],
                }
            )
        elif not turn.empty:
            messages.append({"role": "assistant", "content": turn.text})
    return messages


def from_completion(completion: ChatCompletion) -> AssistantTurn:
    if not completion.choices:
        return AssistantTurn()
    message = completion.choices[0].message
    text = (message.content or message.refusal or "").strip()
    calls = []
    for i, raw in enumerate(message.tool_calls or []):
        if raw.type != "function":
            calls.append(ToolCall(id=raw.id, name=f"<{raw.type} tool>", why=text, problem="only function tools exist"))
            continue
        args, problem = _arguments(raw.function.arguments)
        calls.append(ToolCall(id=raw.id or f"call_{i}", name=raw.function.name, args=args, why=text, problem=problem))
    return AssistantTurn(text=text, tool_calls=calls)


def _arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    try:
        args = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        return {}, f"the arguments are not valid JSON ({exc.msg} at position {exc.pos}): {raw[:300]!r}"
    if not isinstance(args, dict):
        return {}, f"the arguments must be a JSON object, got: {raw[:300]!r}"
    return args, None


def _tool(tool: ToolSpec) -> ChatCompletionFunctionToolParam:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool_description(tool), "parameters": tool.parameters},
    }

"""Claude through the official `anthropic` SDK (Messages API with tool use).

Guarantee: one `next_turn` is one HTTP request (the SDK's own retries are off: the agent loop's
journaled step retries instead); the transcript is sent as strictly alternating user/assistant
messages, every `tool_use` answered by a `tool_result` with the same id in the next user message.
"""

from __future__ import annotations

from typing import Any, cast

import anthropic
from anthropic.types import Message, MessageParam, ToolParam

from countersign.llm.base import AssistantTurn, Feedback, ProviderBusy, ToolCall, ToolResult, ToolSpec, Transcript
from countersign.llm.prompt import is_error, result_text, system_prompt, task_message, tool_description
from countersign.llm.provider_errors import classify

PROVIDER = "Anthropic"


class AnthropicChat:
    def __init__(
        self, model_id: str, name: str, *, api_key: str, base_url: str | None, timeout: float, max_tokens: int
    ) -> None:
        self.model_id = model_id
        self.name = name
        self.max_tokens = max_tokens
        self._client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)

    def next_turn(self, transcript: Transcript, tools: list[ToolSpec]) -> AssistantTurn:
        try:
            message = self._client.messages.create(
                model=self.name,
                max_tokens=self.max_tokens,
                system=system_prompt(transcript, tools),
                messages=to_messages(transcript),
                tools=[_tool(t) for t in tools],
            )
        except anthropic.APIStatusError as exc:
            raise classify(PROVIDER, exc.status_code, exc.body, exc.response.headers) from None
        except anthropic.APITimeoutError:
            raise ProviderBusy(f"{PROVIDER} did not answer within the timeout") from None
        except anthropic.APIConnectionError as exc:
            raise ProviderBusy(f"{PROVIDER} could not be reached: {exc.__cause__ or exc}") from None
        except anthropic.APIResponseValidationError as exc:
            raise ProviderBusy(f"{PROVIDER} sent a reply that is not a message: {exc}") from None
        return from_message(message)


def to_messages(transcript: Transcript) -> list[MessageParam]:
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        # The API wants user and assistant to alternate: consecutive blocks of one role share a message.
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    add("user", {"type": "text", "text": task_message(transcript)})
    for turn in transcript.turns:
        if isinstance(turn, ToolResult):
            result = {"type": "tool_result", "tool_use_id": turn.call_id, "content": result_text(turn)}
            add("user", {**result, "is_error": True} if is_error(turn) else result)
        elif isinstance(turn, Feedback):
            add("user", {"type": "text", "text": turn.text})
        else:
            if turn.text.strip():
                add("assistant", {"type": "text", "text": turn.text})
            for call in turn.tool_calls:
                add("assistant", {"type": "tool_use", "id": call.id, "name": call.name, "input": call.args})
    return cast(list[MessageParam], messages)


def from_message(message: Message) -> AssistantTurn:
    texts = [block.text for block in message.content if block.type == "text"]
    text = "\n".join(t for t in texts if t.strip()).strip()
    calls = []
    for block in message.content:
        if block.type != "tool_use":
            continue
        if isinstance(block.input, dict):
            calls.append(ToolCall(id=block.id, name=block.name, args=dict(block.input), why=text))
        else:
            problem = f"the input must be a JSON object, got: {str(block.input)[:300]!r}"
            calls.append(ToolCall(id=block.id, name=block.name, why=text, problem=problem))
    return AssistantTurn(text=text, tool_calls=calls)


def _tool(tool: ToolSpec) -> ToolParam:
    return {"name": tool.name, "description": tool_description(tool), "input_schema": tool.parameters}

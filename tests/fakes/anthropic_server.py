"""A fake Anthropic Messages server (`POST /v1/messages`) with the real response shapes.

Guarantee: replies and errors are shaped like the real API's (`message` objects with `text` and
`tool_use` content blocks and a `stop_reason`; `{"type": "error", "error": {type, message}}` bodies;
529 `overloaded_error`), and a request without the expected key and an `anthropic-version`
header gets a real-looking 401 / 400 (the key may come as `x-api-key` or as a bearer token, as
this SDK version sends it).
"""

from __future__ import annotations

import itertools
from typing import Any

from fakes.provider import FakeProvider, JsonObject, Reply

API_KEY = "sk-ant-test-countersign-fake"
_ids = itertools.count(1)


class AnthropicFake(FakeProvider):
    path = "/v1/messages"

    @property
    def base_url(self) -> str:
        """What ANTHROPIC_BASE_URL is set to (the SDK appends /v1/messages)."""
        return self.url

    def refuse_unauthorised(self, headers: dict[str, str]) -> Reply | None:
        if API_KEY not in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")):
            return error(401, "authentication_error", "invalid x-api-key")
        if not headers.get("anthropic-version"):
            return error(400, "invalid_request_error", "anthropic-version: header is required")
        return None

    def model_gone(self, model: str) -> Reply:
        return error(404, "not_found_error", f"model: {model}")

    def no_script(self, model: str, count: int) -> Reply:
        return error(400, "invalid_request_error", f"fake: no reply scripted for request {count} to model {model!r}")


def message(model: str, content: list[JsonObject], stop_reason: str) -> Reply:
    return Reply(
        200,
        {
            "id": f"msg_fake{next(_ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 523,
                "output_tokens": 61,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        },
    )


def answer(model: str, text: str) -> Reply:
    return message(model, [{"type": "text", "text": text}], "end_turn")


def tool_use(model: str, *calls: tuple[str, Any], text: str | None = None) -> Reply:
    blocks: list[JsonObject] = [{"type": "text", "text": text}] if text else []
    blocks += [
        {"type": "tool_use", "id": f"toolu_fake{next(_ids):06d}", "name": name, "input": args} for name, args in calls
    ]
    return message(model, blocks, "tool_use")


def error(status: int, type_: str, text: str, headers: dict[str, str] | None = None) -> Reply:
    body = {"type": "error", "error": {"type": type_, "message": text}, "request_id": f"req_fake{next(_ids):06d}"}
    return Reply(status, body, headers or {})


def overloaded() -> Reply:
    return error(529, "overloaded_error", "Overloaded")


def tool_results(body: JsonObject) -> list[JsonObject]:
    """The `tool_result` blocks of a request's user messages, in order."""
    return [
        block
        for m in body.get("messages", [])
        if m.get("role") == "user" and isinstance(m.get("content"), list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    ]

"""A fake OpenAI Chat Completions server (`POST /v1/chat/completions`) with the real response shapes.

Guarantee: replies and errors are shaped like the real API's (chat.completion objects with
`tool_calls` whose `arguments` are JSON strings; `{"error": {message, type, param, code}}` bodies;
`retry-after` headers on 429s), and a request without the expected bearer key gets a real-looking 401.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from fakes.provider import FakeProvider, JsonObject, Reply

API_KEY = "sk-test-countersign-fake"
_ids = itertools.count(1)


class OpenAIFake(FakeProvider):
    path = "/v1/chat/completions"

    @property
    def base_url(self) -> str:
        """What OPENAI_BASE_URL is set to (the SDK appends /chat/completions)."""
        return f"{self.url}/v1"

    def refuse_unauthorised(self, headers: dict[str, str]) -> Reply | None:
        if headers.get("authorization") == f"Bearer {API_KEY}":
            return None
        return error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")

    def model_gone(self, model: str) -> Reply:
        message = f"The model `{model}` does not exist or you do not have access to it."
        return error(404, message, "invalid_request_error", "model_not_found")

    def no_script(self, model: str, count: int) -> Reply:
        return error(400, f"fake: no reply scripted for request {count} to model {model!r}", "invalid_request_error")


def completion(model: str, message: JsonObject, finish_reason: str) -> Reply:
    n = next(_ids)
    return Reply(
        200,
        {
            "id": f"chatcmpl-fake{n:06d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 412, "completion_tokens": 37, "total_tokens": 449},
            "system_fingerprint": "fp_fake",
            "service_tier": "default",
        },
    )


def answer(model: str, text: str) -> Reply:
    message: JsonObject = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
    return completion(model, message, "stop")


def tool_calls(model: str, *calls: tuple[str, dict[str, Any] | str], text: str | None = None) -> Reply:
    """Tool calls as the API sends them; a str instead of a dict is sent as the raw `arguments` text."""
    message: JsonObject = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": [],
        "tool_calls": [
            {
                "id": f"call_fake{next(_ids):06d}",
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for name, args in calls
        ],
    }
    return completion(model, message, "tool_calls")


def error(
    status: int, message: str, type_: str, code: str | None = None, headers: dict[str, str] | None = None
) -> Reply:
    return Reply(status, {"error": {"message": message, "type": type_, "param": None, "code": code}}, headers or {})


def rate_limited(retry_after: str = "1") -> Reply:
    return error(
        429,
        "Rate limit reached for requests. Limit: 3, Used: 3, Requested: 1. Please try again in 1s.",
        "requests",
        "rate_limit_exceeded",
        {"retry-after": retry_after, "x-ratelimit-remaining-requests": "0"},
    )


def tool_messages(body: JsonObject) -> list[JsonObject]:
    """The `role: tool` messages of a request, in order."""
    return [m for m in body.get("messages", []) if m.get("role") == "tool"]

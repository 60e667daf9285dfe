"""The model interface: a transcript in, one assistant turn out.

Guarantee: a turn is a plain pydantic value, so the agent loop journals it as one step and a replay
rebuilds the same transcript without calling the model again. Provider failures surface as
`ProviderBusy` (worth retrying) or `ProviderRefused` (final), never as an SDK's own exception.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field


class ToolCall(BaseModel):
    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    why: str = ""
    problem: str | None = None
    """Set when the provider's call could not be read (e.g. arguments that are not JSON); `args` is then empty."""


class AssistantTurn(BaseModel):
    role: Literal["assistant"] = "assistant"
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.tool_calls and not self.text.strip()


class ToolResult(BaseModel):
    """What the model is told about one of its calls: the outcome and, if it ran, the result."""

    role: Literal["tool"] = "tool"
    call_id: str
    name: str
    outcome: str
    content: dict[str, Any]


class Feedback(BaseModel):
    """A note from the run to the model about its previous reply (e.g. that it was empty)."""

    role: Literal["user"] = "user"
    text: str


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]
    approval: str
    """The policy in words, e.g. `issue_refund: needs approval when amount_usd > 500`."""
    gated: bool = False


class Transcript(BaseModel):
    goal: str
    requester: str
    turns: list[AssistantTurn | ToolResult | Feedback] = Field(default_factory=list)

    def results(self) -> list[ToolResult]:
        return [t for t in self.turns if isinstance(t, ToolResult)]


class ProviderBusy(Exception):
    """A failure worth retrying: rate limit, overload, server error, timeout, connection trouble."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def __repr__(self) -> str:
        # Restate reports an exhausted step with the repr of its last error.
        return self.message


class ProviderRefused(Exception):
    """A final answer from the provider (bad request, bad key, unknown model): retrying cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ChatModel(Protocol):
    model_id: str

    def next_turn(self, transcript: Transcript, tools: list[ToolSpec]) -> AssistantTurn: ...

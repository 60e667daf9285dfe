"""The model interface: a transcript in, one assistant turn out.

Guarantee: a turn is a plain pydantic value, so the agent loop journals it as one step and a replay
rebuilds the same transcript without calling the model again.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field


class ToolCall(BaseModel):
    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    why: str = ""


class AssistantTurn(BaseModel):
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ToolResult(BaseModel):
    """What the model is told about one of its calls: the outcome and, if it ran, the result."""

    role: Literal["tool"] = "tool"
    call_id: str
    name: str
    outcome: str
    content: dict[str, Any]


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]
    approval: str


class Transcript(BaseModel):
    goal: str
    requester: str
    turns: list[AssistantTurn | ToolResult] = Field(default_factory=list)

    def results(self) -> list[ToolResult]:
        return [t for t in self.turns if isinstance(t, ToolResult)]


class ChatModel(Protocol):
    model_id: str

    def next_turn(self, transcript: Transcript, tools: list[ToolSpec]) -> AssistantTurn: ...

"""The model interface: a transcript in, one assistant turn out.

Guarantee: a turn is a plain pydantic value, so the agent loop journals it as one step and a replay
rebuilds the same transcript without calling the model again. Provider failures surface as
`ProviderBusy` (worth retrying) or `ProviderRefused` (final), never as an SDK's own exception.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from countersign.contract import MAX_TOOL_ARGS_BYTES, MAX_WHY, args_size, clipped

MAX_TURN_BYTES = 1024 * 1024
"""The most one journaled model turn may weigh: far above what MODEL_MAX_TOKENS lets a provider say,
far below the 32 MiB message limit past which Restate refuses the journal entry and retries forever."""


class ToolCall(BaseModel):
    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    why: str = ""
    problem: str | None = None
    """Set when the provider's call could not be read (e.g. arguments that are not JSON); `args` is then empty."""
    confidence: float | None = None
    """The model's confidence in this call (0..1), when its tool asks for one; never part of `args`."""


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
    confidence: bool = False
    """`parameters` carry the optional `confidence` property the run added (see countersign.llm.confidence)."""


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


class ModelRetired(ProviderRefused):
    """The provider no longer serves the model (HTTP 404, model not found): the model was retired."""


def bounded(turn: AssistantTurn) -> AssistantTurn:
    """The turn as the run may journal it: each call's `why` cut to MAX_WHY (as a library caller's is);
    a call with oversized arguments keeps only a `problem` the model is told about; a reply still over
    MAX_TURN_BYTES is refused as final."""
    calls = [
        ToolCall(
            id=call.id,
            name=call.name,
            why=clipped(call.why, MAX_WHY),
            confidence=call.confidence,
            problem=f"the arguments are {size} bytes of JSON; at most {MAX_TOOL_ARGS_BYTES} are accepted",
        )
        if (size := args_size(call.args)) > MAX_TOOL_ARGS_BYTES
        else call.model_copy(update={"why": clipped(call.why, MAX_WHY)})
        for call in turn.tool_calls
    ]
    turn = turn.model_copy(update={"tool_calls": calls})
    if (size := len(turn.model_dump_json().encode())) > MAX_TURN_BYTES:
        raise ProviderRefused(f"the model's reply is {size / 2**20:.1f} MiB; one turn may hold at most 1 MiB")
    return turn


class ChatModel(Protocol):
    model_id: str

    def next_turn(self, transcript: Transcript, tools: list[ToolSpec]) -> AssistantTurn: ...

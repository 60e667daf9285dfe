"""What every provider is told: the system prompt, the task message, tool descriptions and results.

Guarantee: the text is a pure function of the transcript and the tool specs, so a replayed run asks
a provider exactly what the original run asked; the prompt names every tool that needs a person's
approval and says that a rejection is final for that exact call.
"""

from __future__ import annotations

import json

from countersign.llm.base import ToolResult, ToolSpec, Transcript

EMPTY_REPLY = "Your last reply was empty. Call one of the tools, or answer in plain text if the goal is done."

OUTCOME_NOTES = {
    "approved": "This exact call was approved and has run.",
    "approved_with_edits": (
        "The approver changed some arguments before approving (see `edited_by_approver`); "
        "the call ran with the changed values, not the ones you proposed."
    ),
    "rejected": (
        "This exact call was rejected. That is final: do not propose the same call again. "
        "Read the reason; propose something different only if the reason invites it, otherwise answer."
    ),
    "expired": "Nobody decided before the deadline, so the action did not run.",
    "cancelled": "The run was cancelled; the action did not run.",
    "superseded": "The situation changed while waiting for approval; the action did not run.",
    "undeliverable": "No approver could be reached, so the action did not run.",
    "invalid": "The call could not run as written (see `error`). Fix it and call again if it is still needed.",
    "failed": "The tool refused or failed (see `error`); it took no effect.",
}


def system_prompt(transcript: Transcript, tools: list[ToolSpec]) -> str:
    gated = [f"- {t.name}: {_approval_text(t)}" for t in tools if t.gated]
    autonomous = [t.name for t in tools if not t.gated]
    lines = [
        "You are an operations agent. You act only through the tools provided, for the person who asked.",
        f"The request comes from {transcript.requester}.",
        "",
        "Some tools need a person's approval before they run:",
        *(gated or ["- none"]),
        f"These run without approval: {', '.join(autonomous) or 'none'}.",
        *_confidence_lines(tools),
        "",
        "When you call a tool that needs approval, the run pauses until an approver decides, which may take "
        "hours. Say in a sentence or two why the call is needed, in the same reply: the approver reads it. "
        "Each tool result has an `outcome`:",
        *(f"- {name}: {note}" for name, note in OUTCOME_NOTES.items()),
        "- autonomous: the tool ran without needing approval.",
        "",
        "A rejection is final for that exact call: never repeat a rejected call, and never split or reword it "
        "to get around the approval.",
        "When the goal is done, or cannot be done, answer in plain text without calling a tool: say what "
        "happened, including any rejection and its reason.",
    ]
    return "\n".join(lines)


def _confidence_lines(tools: list[ToolSpec]) -> list[str]:
    """Only when a tool asks for the model's confidence (so other prompts stay as they were)."""
    asked = [t.name for t in tools if t.confidence]
    if not asked:
        return []
    return [
        f"When you call {', '.join(asked)}, give `confidence`: how sure you are (0 to 1) that this exact call "
        "is right. Be honest: a low value stops the call for a person's review; it is not passed to the tool."
    ]


def task_message(transcript: Transcript) -> str:
    return f"Goal: {transcript.goal}"


def tool_description(tool: ToolSpec) -> str:
    if tool.gated:
        return f"{tool.description} Needs a person's approval ({_approval_text(tool)}); the run waits for it."
    return tool.description


def result_text(result: ToolResult) -> str:
    """The tool result as the model reads it: the outcome's facts plus what the outcome means."""
    content = dict(result.content)
    note = OUTCOME_NOTES.get(result.outcome)
    if note:
        content["meaning"] = note
    return json.dumps(content, ensure_ascii=False, default=str)


def is_error(result: ToolResult) -> bool:
    return result.outcome in ("invalid", "failed")


def _approval_text(tool: ToolSpec) -> str:
    return tool.approval.split(": ", 1)[-1]

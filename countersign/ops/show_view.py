"""`python -m countersign show` for people: a run (or one approval) in a screenful of plain text.

Guarantee: reads only the dict that `show --json` prints (the same facts, nothing fetched here), and
every line is bounded: long arguments, results and reasons are cut, so one run never floods a terminal.
"""

from __future__ import annotations

import time
from typing import Any

from countersign.approval.question_calls import answer_outcome
from countersign.approval.trail import shorten

_WIDTH = 100


def _short(value: Any, limit: int = _WIDTH) -> str:
    return shorten(value, limit)


def _at(timestamp: Any) -> str:
    if not isinstance(timestamp, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(timestamp))


def _approval(record: dict[str, Any], audit: list[dict[str, Any]]) -> list[str]:
    state = record.get("state", "?")
    question = record.get("kind") == "question"  # answered or declined, its edits the answer
    ended = answer_outcome(state, record.get("decision_source")) if question else state
    lines = [f"  {record.get('approval_id')}  {record.get('tool')}  {ended}"]
    lines.append(f"    {_short(record.get('summary', ''))}")
    if state == "pending":
        # As the tally counts: this round's votes; the slots without one are who it waits on.
        current = [vote for vote in record.get("votes", []) if vote.get("round") == record.get("round", 1)]
        voted = {vote.get("slot") for vote in current}
        approvers = record.get("approvers", [])
        open_slots = [s for s in record.get("active_slots", []) if s not in voted and s < len(approvers)]
        approvals = sum(1 for vote in current if vote.get("kind") == "approve")
        lines.append(
            f"    waiting on {', '.join(approvers[s] for s in open_slots) or '?'} (round {record.get('round', 1)}, "
            f"{approvals} of {record.get('quorum', 1)} approvals), deadline {_at(record.get('deadline'))}"
        )
    else:
        who = ", ".join(record.get("approved_by") or []) or record.get("decided_by") or record.get("decision_source")
        via = f" via {record['decided_via']}" if record.get("decided_via") else ""
        if ended == "defaulted":
            lines.append(f"    defaulted: nobody answered by the deadline, {_at(record.get('decided_at'))}")
        else:
            lines.append(f"    {ended} by {who or '?'}{via} at {_at(record.get('decided_at'))}")
        if record.get("reason"):
            lines.append(f"    reason: {_short(record['reason'])}")
        if record.get("edits"):
            lines.append(f"    {'answer' if question else 'edits'}: {_short(record['edits'])}")
    lines.append(f"    args: {_short(record.get('args', {}))}")
    if audit:
        lines.append(f"    audit: {_short(' · '.join(str(entry.get('kind')) for entry in audit))}")
    return lines


def render(status: dict[str, Any]) -> str:
    """The text `show` prints without `--json`."""
    head = f"run {status.get('run_id')}  {status.get('phase')}"
    for label in ("model", "requester"):
        if status.get(label):
            head += f"  {label} {status[label]}"
    lines = [head]
    if status.get("goal"):
        lines.append(f"goal: {_short(status['goal'])}")
    audits: dict[str, list[dict[str, Any]]] = status.get("audit") or {}
    approvals = status.get("approvals") or []
    lines.append("")
    lines.append("approvals" if approvals else "approvals: none")
    for record in approvals:
        lines += _approval(record, audits.get(record.get("approval_id", ""), []))
    history = status.get("history") or []
    lines.append("")
    lines.append("actions" if history else "actions: none")
    for action in history:
        line = f"  #{action.get('index')} {action.get('tool')}  {action.get('outcome')}"
        if action.get("idempotency_key"):
            line += f"  key {action['idempotency_key']}"
        lines.append(line)
        shown = action.get("result") or action.get("reason")
        if shown:
            lines.append(f"    {_short(shown)}")
    for switch in status.get("model_switches") or []:
        lines.append(f"model switch: {switch.get('retired')} -> {switch.get('successor') or 'none'}")
    if status.get("answer"):
        lines += ["", f"answer: {_short(status['answer'], 400)}"]
    webhooks = status.get("webhooks") or []
    if webhooks:
        counts: dict[str, int] = {}
        for delivery in webhooks:
            result = str(delivery.get("outcome", "?"))  # delivered, gave_up, dropped
            counts[result] = counts.get(result, 0) + 1
        lines.append("webhooks: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())))
    lines.append("")
    lines.append("(--json for every field)")
    return "\n".join(lines)

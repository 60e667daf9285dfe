"""The batch page: several actions proposed in one turn, decided item by item on one page (or, with
the same rules here, through the approver API's JSON).

Guarantee: an item is decided only through its `Approval.decide` with a link token for that item and
this approver (minted here, verified again by the workflow), and only while the item is still in the
round of the link that opened the page (the pages refuse a replaced or expired link before coming
here, unless its choices only repeat this approver's decisions, which each item's `decide` answers
with its first answer; an item whose round moved on was sent a fresh link of its own); items left undecided stay
pending, so partial approval works; GET changes nothing. When no item was accepted and one call failed in a way
that may have reached the workflow (5xx), the answer is 503 "not confirmed", never "not decided".
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from starlette.datastructures import FormData
from starlette.responses import Response

from countersign.approval import confirm
from countersign.contract import ApprovalRecord, Decision, DecisionReceipt, RunStatus
from countersign.security import links
from countersign.settings import Settings
from countersign.web import wording
from countersign.web.runs_client import RunCallFailed, RunsClient
from countersign.web.views import Failure, page, remaining, when


def items_for(
    status: RunStatus, record: ApprovalRecord, approver: str, link_round: int
) -> list[tuple[ApprovalRecord, int]]:
    """(item, this approver's slot) for every item of the batch this approver is asked about in the
    link's round. The items of a batch are frozen and emailed together in one round, so an item in
    another round was reassigned, escalated or asked again since, with its own newer email."""
    found = []
    for item in status.approvals:
        if item.index in record.batch and item.tenant == record.tenant and item.round == link_round:
            slots = [s for s in item.active_slots if item.approvers[s] == approver]
            if slots:
                found.append((item, slots[0]))
    return sorted(found, key=lambda pair: pair[0].index)


def voted(item: ApprovalRecord, slot: int) -> bool:
    return any(v.slot == slot and v.round == item.round for v in item.votes)


def is_open(item: ApprovalRecord, slot: int) -> bool:
    """Whether this slot may still decide the item: it is pending and the slot has not voted in its round."""
    return item.state == "pending" and not voted(item, slot)


@dataclass(frozen=True)
class Choice:
    """One item's choice in a batch's POST: the page's `verdict.<i>`, `reason.<i>` and `confirm.<i>`
    fields, or one of the API's `items`. An item with no choice is left to decide later."""

    verdict: Literal["approve", "reject"]
    reason: str = ""
    confirm: str = ""


Choices = Mapping[int, Choice]
"""The choices of a batch's POST by item index (the call's index in its run)."""


def choices_of(form: FormData) -> dict[int, Choice]:
    """A batch form's choices: each item whose `verdict.<i>` is approve or reject ("decide later"
    sends an empty value, which chooses nothing), with its reason and typed confirmation. Only a
    field named with an item index as the page writes it counts (`verdict.0`, not `verdict.00`)."""
    chosen = {}
    for name in form:
        index = name.removeprefix("verdict.")
        if index == name or not index.isdecimal() or len(index) > 9 or str(int(index)) != index:
            continue
        verdict: Literal["approve", "reject"]
        match form.get(name):
            case "approve":
                verdict = "approve"
            case "reject":
                verdict = "reject"
            case _:
                continue
        reason, typed = form.get(f"reason.{index}", ""), form.get(f"confirm.{index}", "")
        chosen[int(index)] = Choice(verdict, str(reason), str(typed))
    return chosen


def repeats_its_votes(
    status: RunStatus, record: ApprovalRecord, approver: str, link_round: int, choices: Choices
) -> bool:
    """Whether a batch POST only repeats decisions this approver already made in the link's round: a
    POST sent again because its answer was lost (the app died, the network dropped it). Each item's
    `decide` under the same key gives back its first answer, so such a POST is told the truth also
    once the link no longer decides anything new."""
    chosen = 0
    for item, slot in items_for(status, record, approver, link_round):
        choice = choices.get(item.index)
        if choice is None:
            continue
        chosen += 1
        reason = choice.reason.strip()[:2000]
        mine = (v for v in item.votes if v.slot == slot and v.round == item.round)
        if not any(v.kind == choice.verdict and (v.reason or "") == reason for v in mine):
            return False
    return chosen > 0


def render(
    settings: Settings, token: str, status: RunStatus, record: ApprovalRecord, approver: str, link_round: int
) -> Response:
    now = time.time()
    items = [
        {
            "record": item,
            "open": is_open(item, slot),
            "deadline": when(item.deadline),
            "remaining": remaining(item.deadline, now),
            "confirm_label": confirm.label(item),
            "confirm_value": confirm.expected(item),
        }
        for item, slot in items_for(status, record, approver, link_round)
    ]
    csrf = links.csrf_token(token, settings.approvals_signing_keys, settings.signing_kid)
    return page("batch.html", items=items, approver=approver, goal=status.goal or "", csrf=csrf)


Outcome = tuple[ApprovalRecord, DecisionReceipt | None, str]
"""One chosen item, what its `decide` answered (None if the call failed) and, then, why."""


@dataclass(frozen=True)
class Decided:
    """What a batch's POST decided: each chosen item's outcome, in the items' order; the status that
    says it (200 when one was accepted, else 503 if one may have been recorded unseen, else 409);
    and the chosen indices that are no item of this link's round for this approver (nothing done)."""

    outcomes: list[Outcome]
    status: int
    unconfirmed: bool
    ignored: list[int]


async def decide_items(
    settings: Settings,
    runs: RunsClient,
    status: RunStatus,
    record: ApprovalRecord,
    approver: str,
    link_round: int,
    choices: Choices,
    client: str,
) -> Decided | Failure:
    """Each chosen item decided by its own `decide`, once every choice was checked (a rejection
    without a reason refuses them all: nothing decided)."""
    asked = items_for(status, record, approver, link_round)
    chosen: list[tuple[ApprovalRecord, int, Choice, str]] = []
    for item, slot in asked:
        choice = choices.get(item.index)
        if choice is None:
            continue
        reason = choice.reason.strip()[:2000]
        if choice.verdict == "reject" and not reason:
            return Failure(400, "Reason required", f"Say why you reject “{item.summary}”. Nothing was decided.")
        chosen.append((item, slot, choice, reason))
    if not chosen:
        return Failure(400, "Nothing chosen", "Choose Approve or Reject for at least one action. Nothing was decided.")
    outcomes: list[Outcome] = []
    unconfirmed = False
    for item, slot, choice, reason in chosen:
        item_token = links.mint(item, slot, settings.approvals_signing_keys, settings.signing_kid)
        typed = choice.confirm[:200]
        decision = Decision(token=item_token, verdict=choice.verdict, reason=reason, confirm=typed, client=client)
        key = links.token_fingerprint(f"{item_token}|{decision.model_dump_json(exclude={'client'})}")
        try:
            outcomes.append((item, await runs.decide(item.approval_id, decision, key), ""))
        except RunCallFailed as exc:
            # A 5xx may come after the decision was recorded (the answer was lost): claim neither.
            unconfirmed = unconfirmed or exc.status >= 500
            outcomes.append((item, None, f"{'not confirmed' if exc.status >= 500 else 'not decided'} — {exc.message}"))
    accepted = any(receipt and receipt.accepted for _, receipt, _ in outcomes)
    ignored = sorted(set(choices) - {item.index for item, _ in asked})
    return Decided(outcomes, 200 if accepted else 503 if unconfirmed else 409, unconfirmed, ignored)


def done_page(decided: Decided) -> Response:
    """The batch page's answer to its POST: each chosen item's outcome."""
    hint = wording.UNCONFIRMED_HINT if decided.unconfirmed else None
    return page("batch_done.html", decided.status, outcomes=decided.outcomes, when=when, hint=hint)

"""The batch page: several actions proposed in one turn, decided item by item on one page.

Guarantee: an item is decided only through its `Approval.decide` with a link token for that item and
this approver (minted here, verified again by the workflow), and only while the item is still in the
round of the link that opened the page (the pages refuse a replaced or expired link before coming
here, unless its form only repeats this approver's decisions, which each item's `decide` answers
with its first answer; an item whose round moved on was sent a fresh link of its own); items left undecided stay
pending, so partial approval works; GET changes nothing. When no item was accepted and one call failed in a way
that may have reached the workflow (5xx), the answer is 503 "not confirmed", never "not decided".
"""

from __future__ import annotations

import time
from typing import Literal

from starlette.datastructures import FormData
from starlette.responses import Response

from countersign.approval import confirm
from countersign.contract import ApprovalRecord, Decision, DecisionReceipt, RunStatus
from countersign.security import links
from countersign.settings import Settings
from countersign.web import wording
from countersign.web.runs_client import RunCallFailed, RunsClient
from countersign.web.views import notice, page, remaining, when


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


def repeats_its_votes(
    status: RunStatus, record: ApprovalRecord, approver: str, link_round: int, form: FormData
) -> bool:
    """Whether a batch form only repeats decisions this approver already made in the link's round: a
    POST sent again because its answer was lost (the app died, the network dropped it). Each item's
    `decide` under the same key gives back its first answer, so such a form is told the truth also
    once the link no longer decides anything new."""
    chosen = 0
    for item, slot in items_for(status, record, approver, link_round):
        verdict = form.get(f"verdict.{item.index}")
        if verdict not in ("approve", "reject"):
            continue
        chosen += 1
        reason = str(form.get(f"reason.{item.index}", "")).strip()[:2000]
        mine = (v for v in item.votes if v.slot == slot and v.round == item.round)
        if not any(v.kind == verdict and (v.reason or "") == reason for v in mine):
            return False
    return chosen > 0


def render(
    settings: Settings, token: str, status: RunStatus, record: ApprovalRecord, approver: str, link_round: int
) -> Response:
    now = time.time()
    items = [
        {
            "record": item,
            "open": item.state == "pending" and not voted(item, slot),
            "deadline": when(item.deadline),
            "remaining": remaining(item.deadline, now),
            "confirm_label": confirm.label(item),
            "confirm_value": confirm.expected(item),
        }
        for item, slot in items_for(status, record, approver, link_round)
    ]
    csrf = links.csrf_token(token, settings.approvals_signing_keys, settings.signing_kid)
    return page("batch.html", items=items, approver=approver, goal=status.goal or "", csrf=csrf)


async def decide_items(
    settings: Settings,
    runs: RunsClient,
    status: RunStatus,
    record: ApprovalRecord,
    approver: str,
    link_round: int,
    form: FormData,
    client: str,
) -> Response:
    chosen: list[tuple[ApprovalRecord, int, Literal["approve", "reject"], str]] = []
    for item, slot in items_for(status, record, approver, link_round):
        reason = str(form.get(f"reason.{item.index}", "")).strip()[:2000]
        match form.get(f"verdict.{item.index}"):
            case "approve":
                chosen.append((item, slot, "approve", reason))
            case "reject" if reason:
                chosen.append((item, slot, "reject", reason))
            case "reject":
                return notice(400, "Reason required", f"Say why you reject “{item.summary}”. Nothing was decided.")
    if not chosen:
        return notice(400, "Nothing chosen", "Choose Approve or Reject for at least one action. Nothing was decided.")
    outcomes: list[tuple[ApprovalRecord, DecisionReceipt | None, str]] = []
    unconfirmed = False
    for item, slot, verdict, reason in chosen:
        item_token = links.mint(item, slot, settings.approvals_signing_keys, settings.signing_kid)
        typed = str(form.get(f"confirm.{item.index}", ""))[:200]
        decision = Decision(token=item_token, verdict=verdict, reason=reason, confirm=typed, client=client)
        key = links.token_fingerprint(f"{item_token}|{decision.model_dump_json(exclude={'client'})}")
        try:
            outcomes.append((item, await runs.decide(item.approval_id, decision, key), ""))
        except RunCallFailed as exc:
            # A 5xx may come after the decision was recorded (the answer was lost): claim neither.
            unconfirmed = unconfirmed or exc.status >= 500
            outcomes.append((item, None, f"{'not confirmed' if exc.status >= 500 else 'not decided'} — {exc.message}"))
    accepted = any(receipt and receipt.accepted for _, receipt, _ in outcomes)
    code = 200 if accepted else 503 if unconfirmed else 409
    hint = wording.UNCONFIRMED_HINT if unconfirmed else None
    return page("batch_done.html", code, outcomes=outcomes, when=when, hint=hint)

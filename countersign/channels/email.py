"""The email channel: today's mail path (countersign.mail), unchanged, behind the channel interface.

Guarantee: the same step names, bodies, retries and idempotency keys as before channels existed,
so journals written before are replayed exactly.
"""

from __future__ import annotations

import restate
from restate import TerminalError

from countersign.channels.base import ChannelRequest
from countersign.errors import is_cancellation
from countersign.mail.approval_email import send_approval_request
from countersign.mail.deliver import EMAIL_RETRIES
from countersign.mail.message import SendReceipt
from countersign.observability import logs, metrics, tracing


class EmailChannel:
    name = "email"

    async def deliver(self, ctx: restate.Context, request: ChannelRequest) -> str | None:
        r = request
        ids = {"tool": r.record.tool, "approval_id": r.record.approval_id, "run_id": r.record.run_id}
        with (
            logs.approval_scope(r.record.approval_id),
            tracing.step(f"email {r.kind}", channel="email", tenant=r.record.tenant, kind=r.kind, **ids) as span,
        ):
            try:
                receipt: SendReceipt = await ctx.run_typed(
                    r.step, send_approval_request, EMAIL_RETRIES, r.record, r.slot, r.goal, r.kind, r.at, r.reason
                )
            except TerminalError as exc:
                if is_cancellation(exc):
                    raise
                tracing.annotate(span, outcome="refused")
                metrics.record_delivery_failed("email", "refused")
                return None
        return receipt.message_id


EMAIL = EmailChannel()

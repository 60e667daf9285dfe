"""How long Restate keeps what the handlers leave behind.

Guarantee: a run (its state, promises and output) is kept for two weeks after it ends, so late
clicks, `status` and audits still find it; its journal is dropped as soon as it ends: the decided
record lives in the workflow's state and promises, and the account of what happened in the audit
trail (`ApprovalAudit`), so the journal would only cost disk for every finished run. The same holds
for the workflows' shared handlers (`decide`, `cancel`, `reassign`, …): their answer is their
output, which the idempotency retention keeps for identical resubmissions. Bookkeeping calls
(inbox, audit and figures updates, and the read-only queries) keep no journal once done: what they
wrote lives in their objects' state, and Restate's journal of them would only cost disk for every
paused run.
"""

from __future__ import annotations

from datetime import timedelta

RUN = timedelta(days=14)
RUN_JOURNAL = timedelta(0)
"""A finished run's journal: see above."""
NO_JOURNAL = timedelta(0)

"""How long Restate keeps what the handlers leave behind.

Guarantee: a run (its state, promises, journal and output) is kept for two weeks after it ends, so
late clicks, `status` and audits still find it. Bookkeeping calls (inbox, audit and figures updates,
and the read-only queries) keep no journal once done: what they wrote lives in their objects' state,
and Restate's journal of them would only cost disk for every paused run.
"""

from __future__ import annotations

from datetime import timedelta

RUN = timedelta(days=14)
NO_JOURNAL = timedelta(0)

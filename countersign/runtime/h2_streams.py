"""hypercorn's HTTP/2 send order, for connections that hold many silent streams.

Guarantee: once `install()` has run, every HTTP/2 connection hypercorn serves in this process picks
the next stream to send on in constant time, whatever the number of open streams, and accepts as
many concurrent streams as `h2_max_concurrent_streams` allows (hypercorn.toml).

Why: hypercorn asks a `priority.PriorityTree` for the next stream with data. That tree pops and
re-pushes every open stream, idle ones included, for each frame sent, and refuses a 1,001st open
stream with an exception hypercorn does not catch, which closes the connection and every
invocation streaming on it. A Restate endpoint keeps one open, silent stream per waiting invocation
until restate-server's inactivity timeout (1 min in production), and how restate-server spreads
them over connections is its own choice (from 4 to 56 connections in the project's benches), so
a connection may hold hundreds or more. restate-server sends no PRIORITY frames (RFC 9113
deprecates that scheme), so taking the streams that have data in turn loses nothing.
"""

from __future__ import annotations

from typing import Any

import hypercorn.protocol
from hypercorn.protocol.h2 import H2Protocol
from priority.priority import DeadlockError, DuplicateStreamError, MissingStreamError


class ReadyStreams:
    """The part of `priority.PriorityTree` that hypercorn uses: streams are inserted, blocked (no
    data to send), unblocked and removed; `next()` gives the unblocked streams in turn and raises
    `DeadlockError` when none has data. Weights and dependencies are accepted and ignored, and a
    PRIORITY frame (`reprioritize`) stores nothing."""

    def __init__(self) -> None:
        self._open: set[int] = set()
        # Unblocked streams in the order they take turns (a dict: ordered, O(1) delete).
        self._ready: dict[int, None] = {}

    def insert_stream(
        self, stream_id: int, depends_on: int | None = None, weight: int = 16, exclusive: bool = False
    ) -> None:
        if stream_id in self._open:
            raise DuplicateStreamError(f"Stream {stream_id} already in tree")
        self._open.add(stream_id)
        self._ready[stream_id] = None  # as in PriorityTree, a new stream starts unblocked

    def reprioritize(
        self, stream_id: int, depends_on: int | None = None, weight: int = 16, exclusive: bool = False
    ) -> None:
        # Nothing to do, and nothing kept: a PRIORITY frame for a stream not opened yet would have
        # hypercorn insert it (on MissingStreamError), so any client could make a connection hold
        # ids without bound.
        return None

    def block(self, stream_id: int) -> None:
        self._known(stream_id)
        self._ready.pop(stream_id, None)

    def unblock(self, stream_id: int) -> None:
        self._known(stream_id)
        self._ready.setdefault(stream_id, None)

    def remove_stream(self, stream_id: int) -> None:
        self._known(stream_id)
        self._open.discard(stream_id)
        self._ready.pop(stream_id, None)

    def __iter__(self) -> ReadyStreams:
        return self

    def __next__(self) -> int:
        if not self._ready:
            raise DeadlockError("No unblocked streams to schedule.")
        stream_id = next(iter(self._ready))
        # To the back of the line: streams with data share the connection frame by frame.
        del self._ready[stream_id]
        self._ready[stream_id] = None
        return stream_id

    def _known(self, stream_id: int) -> None:
        if stream_id not in self._open:
            raise MissingStreamError(f"Stream {stream_id} not in tree")


class _H2Protocol(H2Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.priority = ReadyStreams()  # type: ignore[assignment]


def install() -> None:
    """Make hypercorn's HTTP/2 connections in this process use `ReadyStreams` (idempotent).
    hypercorn builds each connection's protocol from this module attribute."""
    hypercorn.protocol.H2Protocol = _H2Protocol  # type: ignore[attr-defined]

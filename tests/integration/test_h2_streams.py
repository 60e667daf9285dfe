"""More silent HTTP/2 streams on one connection to the Restate listener than hypercorn took, still answered.

restate-server keeps one open stream per waiting invocation until its inactivity timeout (1 min in
production), spread over connections as it chooses. The integration test opens more of them on one
connection than hypercorn's stock stream scheduler accepts (1,000: the next one closed the connection,
and every invocation on it), against the real `python -m countersign serve`, with a real HTTP/2 client
(`h2`) at the byte level.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
from priority.priority import DeadlockError, DuplicateStreamError, MissingStreamError
from support.processes import AppServer, make_app_env

from countersign.runtime.h2_streams import ReadyStreams

SILENT_STREAMS = 1_500
"""Half as many again as the stock scheduler's limit."""
DEADLINE = 60.0


def test_ready_streams_take_turns_and_skip_blocked_ones() -> None:
    streams = ReadyStreams()
    for stream_id in (1, 3, 5):
        streams.insert_stream(stream_id)
    assert [next(streams) for _ in range(4)] == [1, 3, 5, 1]
    streams.block(3)
    assert [next(streams) for _ in range(3)] == [5, 1, 5]
    streams.unblock(3)
    streams.unblock(3)  # twice is once
    assert [next(streams) for _ in range(3)] == [1, 5, 3]  # an unblocked stream joins the back
    streams.remove_stream(1)
    streams.block(3)
    streams.block(5)
    with pytest.raises(DeadlockError):
        next(streams)


def test_ready_streams_raise_what_hypercorn_catches() -> None:
    streams = ReadyStreams()
    streams.insert_stream(1, depends_on=0, weight=200, exclusive=True)
    with pytest.raises(DuplicateStreamError):
        streams.insert_stream(1)
    streams.reprioritize(1, weight=1)
    for call in (streams.block, streams.unblock, streams.remove_stream):
        with pytest.raises(MissingStreamError):
            call(7)
    streams.remove_stream(1)
    with pytest.raises(MissingStreamError):
        streams.remove_stream(1)


def test_priority_frames_for_streams_not_opened_are_not_kept() -> None:
    """hypercorn inserts a stream on MissingStreamError from `reprioritize`: raising it would let a
    client park any number of ids on a connection with PRIORITY frames alone."""
    streams = ReadyStreams()
    for stream_id in range(1, 20_001, 2):
        streams.reprioritize(stream_id, depends_on=0, weight=32)
    with pytest.raises(DeadlockError):
        next(streams)
    streams.insert_stream(1)  # its HEADERS then open it as usual
    assert next(streams) == 1


@pytest.fixture()
def app(tmp_path: Path) -> Iterator[AppServer]:
    """The real app with no Restate behind it: nothing here needs one."""
    env = make_app_env(ingress_url="http://127.0.0.1:9", outbox_dir=tmp_path / "outbox", db_path=tmp_path / "db")
    server = AppServer.start(env=env, log_path=tmp_path / "app.log")
    try:
        yield server
    finally:
        server.stop()


class Client:
    """One HTTP/2 connection (prior knowledge, as restate-server opens it), driven by hand."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.next_id = 1
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def request(self, method: str, path: str, *, end: bool, content_type: str = "") -> int:
        stream_id, self.next_id = self.next_id, self.next_id + 2
        headers = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "127.0.0.1")]
        if content_type:
            headers.append(("content-type", content_type))
        self.h2.send_headers(stream_id, headers, end_stream=end)
        return stream_id

    def until(self, done: Callable[[h2.events.Event], bool]) -> None:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            for event in self.h2.receive_data(data):
                assert not isinstance(event, h2.events.ConnectionTerminated), f"GOAWAY: {event}"
                assert not isinstance(event, h2.events.StreamReset), f"stream reset: {event}"
                if done(event):
                    return
            self.flush()
        raise AssertionError(f"no answer within {DEADLINE} s")

    def close(self) -> None:
        self.sock.close()


def test_more_than_a_thousand_silent_invocation_streams_do_not_break_the_connection(app: AppServer) -> None:
    client = Client(app.restate_port)
    try:
        # Invocation streams whose start message never comes: the SDK waits for it, as a waiting
        # invocation's stream waits for its next message.
        for _ in range(SILENT_STREAMS):
            client.request("POST", "/restate/invoke/AgentRun/run", end=False, content_type="application/json")
        client.flush()
        health = client.request("GET", "/restate/health", end=True)
        client.flush()
        answer: dict[str, object] = {}

        def answered(event: h2.events.Event) -> bool:
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == health:
                answer["status"] = dict(event.headers)[b":status"]
            return isinstance(event, h2.events.StreamEnded) and event.stream_id == health

        client.until(answered)
        assert answer["status"] == b"200"
        assert len(client.h2.streams) >= SILENT_STREAMS  # all still open on the client's side
    finally:
        client.close()

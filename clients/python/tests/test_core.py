"""The I/O-free core on its own: the event-stream decoder, the follower's deduplication across
reconnects, and the retry policy (the end-to-end tests exercise them against the service)."""

from __future__ import annotations

from typing import List, Optional

import pytest

import agentjail
from agentjail import _core as core


def feed(f: core.Follower, text: str) -> List[agentjail.Event]:
    out = []
    for line in text.split("\n"):
        ev = f.line(line)
        if ev is not None:
            out.append(ev)
    return out


def chunk(offset: int, text: str, eid: str, stream: str = "stdout") -> str:
    return 'id: %s\nevent: %s\ndata: {"offset": %d, "bytes": %d, "text": "%s"}\n\n' % (
        eid,
        stream,
        offset,
        len(text),
        text,
    )


def test_the_decoder_skips_comments_and_joins_data_lines() -> None:
    d = core.SSEDecoder()
    got: List[Optional[tuple[str, Optional[str], str]]] = [
        d.line(x) for x in [": keep-alive", "", "id: 1.0.0.0", "event: e", "data: a", "data: b", ""]
    ]
    assert got[-1] == ("e", "1.0.0.0", "a\nb")
    assert got[:-1] == [None] * 6


def test_a_resumed_stream_hands_out_each_chunk_once() -> None:
    f = core.Follower("r", None, 3)
    first = feed(f, chunk(0, "ab", "2.2.0.0") + chunk(2, "cd", "2.4.0.0"))
    assert [e.text for e in first] == ["ab", "cd"] and f.last_event_id == "2.4.0.0"
    f.dropped(agentjail.TransportError("cut"))
    assert f.call().headers["last-event-id"] == "2.4.0.0"
    # A chunk sent again after the reconnect is dropped; the next one goes through.
    again = feed(f, chunk(2, "cd", "2.4.0.0") + chunk(4, "ef", "2.6.0.0"))
    assert [e.text for e in again] == ["ef"]
    with pytest.raises(agentjail.StreamError):
        feed(f, chunk(9, "zz", "2.11.0.0"))  # bytes 6..9 never came


def test_resuming_from_an_id_knows_the_offsets() -> None:
    f = core.Follower("r", "2.4.1.0", 3)
    assert [e.text for e in feed(f, chunk(2, "cd", "2.4.1.0") + chunk(4, "ef", "2.6.1.0"))] == [
        "ef"
    ]


def test_reconnects_are_bounded_and_api_errors_are_not_retried() -> None:
    f = core.Follower("r", None, 1)
    f.dropped(None)
    with pytest.raises(agentjail.StreamError):
        f.dropped(None)
    nf = agentjail.NotFound(404, {"detail": "no such run"})
    with pytest.raises(agentjail.NotFound):
        core.Follower("r", None, 5).dropped(nf)


def test_the_retry_policy() -> None:
    def a(status: int, **headers: str) -> core.Answer:
        return core.Answer(status, headers, b"{}")

    assert core.retry_delay(a(429, **{"retry-after": "5"}), 0, 2) == 5.0
    assert core.retry_delay(a(503, **{"Retry-After": "600"}), 1, 2) == core.MAX_RETRY_WAIT
    assert core.retry_delay(a(429, **{"retry-after": "5"}), 2, 2) is None
    assert core.retry_delay(a(503), 1, 2) == 2.0
    assert core.retry_delay(a(500), 0, 2) is None
    assert core.retry_delay(a(200), 0, 2) is None

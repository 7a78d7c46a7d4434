"""Live events (Server-Sent Events): iterator, callback, resume with Last-Event-ID, and a
connection dropped for real (a loopback proxy that cuts it) resumed without loss or repeat."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List

import httpx

import agentjail
from conftest import CuttingProxy, rid

# Prints numbered lines over ~3 s, on stdout and stderr, then writes its output.
TALKS = """
import json, sys, time
for i in range(30):
    print("line %03d" % i, flush=True)
    if i % 10 == 0:
        print("err %03d" % i, file=sys.stderr, flush=True)
    time.sleep(0.1)
json.dump({"lines": 30}, open("/output/o.json", "w"))
"""
EXPECTED = "".join("line %03d\n" % i for i in range(30))
EXPECTED_ERR = "".join("err %03d\n" % i for i in range(0, 30, 10))


def text_of(events: List[agentjail.Event], stream: str) -> str:
    return "".join(e.text for e in events if e.event == stream)


def test_the_iterator_gets_chunks_before_ended(client: agentjail.Client) -> None:
    run = client.submit("py", code=TALKS)
    events = list(client.events(run.request_id))
    kinds = [e.event for e in events]
    assert kinds[0] == "queued" and kinds[-1] == "ended" and kinds.count("ended") == 1, kinds
    assert "started" in kinds and kinds.index("started") < kinds.index("stdout")
    assert kinds.index("stdout") < kinds.index("ended")
    assert text_of(events, "stdout") == EXPECTED
    assert text_of(events, "stderr") == EXPECTED_ERR
    # Chunks are contiguous: each starts where the last ended.
    at = 0
    for e in events:
        if e.event == "stdout":
            assert e.offset == at and e.data["untrusted"] is True
            at += e.data["bytes"]
    final = events[-1].run
    assert final is not None and final.ok and final.artifact == {"lines": 30}
    assert client.logs(run.request_id).text == EXPECTED


def test_run_with_a_callback_submits_and_follows_in_one_request() -> None:
    # Every request the client makes, seen by httpx's hook: one POST, no GET of the events.
    requests: List[str] = []
    http = httpx.Client(
        event_hooks={"request": [lambda r: requests.append(r.method + " " + r.url.path)]}
    )
    with agentjail.Client(http_client=http) as client:
        seen: List[agentjail.Event] = []
        request_id = rid("one-call")
        final = client.run("py", code=TALKS, request_id=request_id, on_event=seen.append)
        assert final.ok and final.request_id == request_id and final.artifact == {"lines": 30}
        kinds = [e.event for e in seen]
        assert kinds[0] == "queued" and kinds[-1] == "ended", kinds
        assert kinds.index("stdout") < kinds.index("ended")
        assert text_of(seen, "stdout") == EXPECTED and text_of(seen, "stderr") == EXPECTED_ERR
        assert requests == ["POST /v1/runs"], requests
        # The same request again is a replay: the recorded run's events, nothing ran twice.
        again = client.run("py", code=TALKS, request_id=request_id, on_event=lambda e: None)
        assert again.record["report"] == final.record["report"]
    http.close()


async def _async_run_with_a_callback() -> None:
    async with agentjail.AsyncClient() as client:
        seen: List[agentjail.Event] = []
        final = await client.run("py", code=TALKS, on_event=seen.append)
        assert final.ok and text_of(seen, "stdout") == EXPECTED and seen[-1].event == "ended"


def test_the_async_run_with_a_callback() -> None:
    asyncio.run(_async_run_with_a_callback())


def test_a_callback_follows_to_the_end(client: agentjail.Client) -> None:
    run = client.submit("py", code=TALKS)
    seen: List[agentjail.Event] = []
    final = client.follow(run.request_id, seen.append)
    assert final.ok and final.request_id == run.request_id
    assert text_of(seen, "stdout") == EXPECTED and seen[-1].event == "ended"


def test_resume_with_last_event_id_loses_and_repeats_nothing(client: agentjail.Client) -> None:
    run = client.submit("py", code=TALKS)
    first: List[agentjail.Event] = []
    for ev in client.events(run.request_id):
        first.append(ev)
        if ev.event == "stdout" and len(text_of(first, "stdout")) >= 27:  # a few lines in
            break
    assert first[-1].event == "stdout"
    rest = list(client.events(run.request_id, last_event_id=first[-1].id))
    assert rest[0].event != "queued", "resumed from the start"
    both = first + rest
    assert text_of(both, "stdout") == EXPECTED
    assert text_of(both, "stderr") == EXPECTED_ERR
    assert [e.event for e in both].count("ended") == 1


def test_a_dropped_connection_is_resumed(client: agentjail.Client) -> None:
    proxy = CuttingProxy(client._config.base_url, cuts=3, after=600)
    try:
        with agentjail.Client(proxy.url) as through:
            run = client.submit("py", code=TALKS)
            events = list(through.events(run.request_id, max_reconnects=10))
        assert proxy.connections >= 4, "no connection was cut"
        assert text_of(events, "stdout") == EXPECTED
        assert text_of(events, "stderr") == EXPECTED_ERR
        kinds = [e.event for e in events]
        assert kinds.count("queued") == 1 and kinds.count("ended") == 1, kinds
        assert kinds[-1] == "ended"
    finally:
        proxy.close()


def test_events_of_an_unknown_run_is_not_found(client: agentjail.Client) -> None:
    try:
        list(client.events("no-such-run-events"))
    except agentjail.NotFound as e:
        assert e.status == 404
    else:
        raise AssertionError("no NotFound")


def test_the_async_client(example: Path) -> None:
    async def main() -> None:
        async with agentjail.AsyncClient() as client:
            data = await client.upload(example / "report.csv")
            run = await client.run(
                "summarize_csv", [data], code=(example / "summarize.py").read_text()
            )
            assert run.ok and run.artifact["rows"] == 8
            assert (await client.get(run.request_id)).status == "ok"
            pending = await client.submit("py", code=TALKS)
            events = [ev async for ev in client.events(pending.request_id)]
            assert text_of(events, "stdout") == EXPECTED and events[-1].event == "ended"
            seen: List[str] = []

            async def on_event(ev: agentjail.Event) -> None:
                seen.append(ev.event)

            final = await client.follow(pending.request_id, on_event)
            assert final.ok and seen[-1] == "ended"
            ids = [r["request_id"] async for r in client.list(task="py", page_size=2)]
            assert pending.request_id in ids and len(ids) == len(set(ids))
            failed = await client.run("py", code="raise SystemExit('nope')")
            assert not failed.ok and "nope" in failed.stderr_tail
            try:
                await client.get("no-such-run-async")
            except agentjail.NotFound:
                pass
            else:
                raise AssertionError("no NotFound")
            slow = await client.submit("py", code="import time; time.sleep(60)")
            try:
                await client.wait(slow.request_id, timeout=0.3)
            except agentjail.WaitTimeout:
                pass
            else:
                raise AssertionError("no WaitTimeout")
            assert (await client.cancel(slow.request_id)).status == "cancelled"

    asyncio.run(main())

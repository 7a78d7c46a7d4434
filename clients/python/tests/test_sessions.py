"""Sessions and cells with the sync and async clients against a real service (see
conftest.py), on SQLite and on PostgreSQL (``AGENTJAIL_STORE``) alike."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import List

import pytest

import agentjail
from agentjail import _errors
from conftest import rid

#: Every cell of the `agent` and `tiny` tasks writes their JSON output.
OUT = "import json\njson.dump({}, open('/output/o.json', 'w'))\n"


def test_the_session_problems_are_typed() -> None:
    base = "https://agentjail.dev/problems/"
    for slug, cls in [
        ("cell-in-progress", agentjail.CellInProgress),
        ("session-closed", agentjail.SessionClosed),
        ("session-expired", agentjail.SessionExpired),
        ("session-cell-limit", agentjail.SessionCellLimit),
        ("checkpoint-invalid", agentjail.CheckpointInvalid),
        ("request-id-conflict", agentjail.Conflict),
    ]:
        e = _errors.error_for(409, {"type": base + slug, "detail": "d"}, {})
        assert type(e) is cls and isinstance(e, agentjail.Conflict) and e.slug == slug
    e = _errors.error_for(410, {"type": base + "checkpoint-gone", "detail": "d"}, {})
    assert type(e) is agentjail.CheckpointGone and isinstance(e, agentjail.Gone)
    e = _errors.error_for(501, {"type": base + "sessions-unsupported"}, {})
    assert isinstance(e, agentjail.SessionsUnsupported) and isinstance(e, agentjail.ServerError)


def test_rfc8785_canonical_json() -> None:
    # RFC 8785's own ordering example (UTF-16 code units) and its escapes.
    v = {"\u20ac": 1, "\r": 2, "\ufb33": 3, "1": 4, "\U0001f600": 5, "\u0080": 6, "\u00f6": 7}
    keys = [k for k in json.loads(agentjail.canonical_json(v))]
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    assert agentjail.canonical_json({"b": [1, 2.5, None, True], "a": '\u2028\x01"\\'}) == (
        b'{"a":"\xe2\x80\xa8\\u0001\\"\\\\","b":[1,2.5,null,true]}'
    )
    assert agentjail.canonical_json(1e21) == b"1e+21" and agentjail.canonical_json(4.0) == b"4"
    assert agentjail.canonical_json([1e-5, 1e-7, 0.1]) == b"[0.00001,1e-7,0.1]"


def test_cells_share_work_retry_safely_and_chain_their_receipts(
    client: agentjail.Client, example: Path, pubkey: Path
) -> None:
    data = client.upload(example / "report.csv")
    opened = rid("sess")
    s = client.session("agent", [data], request_id=opened)
    assert s.session_id.startswith("ses_") and s.state == "open" and s.task == "agent"
    # Opening again with the same request id is the same session.
    assert client.session("agent", [data], request_id=opened).session_id == s.session_id

    step1 = "rows = open('/input/data.csv').read().splitlines()\n"
    step1 += "open('/work/rows.txt', 'w').write(str(len(rows)))\nprint('rows', len(rows))\n" + OUT
    c0 = s.run(step1, request_id="step-1")
    assert isinstance(c0, agentjail.Cell) and c0.ok, c0.stderr_tail
    assert (c0.cell, c0.session_id, c0.cell_request_id) == (0, s.session_id, "step-1")
    assert c0.request_id == s.session_id + "-0" and c0.stdout.startswith("rows ")
    assert c0.workspace_before is None and c0.workspace_after is not None
    # A framework's retry of the same step: the recorded cell, nothing runs again.
    again = s.run(step1, request_id="step-1")
    assert again.cell == 0 and again.record["job_id"] == c0.record["job_id"]
    with pytest.raises(agentjail.Conflict) as conflict:
        s.run("print('other code')\n" + OUT, request_id="step-1")
    assert conflict.value.slug == "request-id-conflict"

    c1 = s.run("print(open('/work/rows.txt').read())\n" + OUT)
    assert c1.ok and c1.cell == 1 and c1.workspace_before == c0.workspace_after
    assert c1.stdout.strip() == c0.stdout.split()[1]
    # A failing cell is a result to branch on, with its traceback.
    c2 = s.run("open('/work/rows.txt', 'a').write('!')\nimport agentjail_not_a_module\n")
    assert not c2.ok and c2.status == "exit_nonzero" and c2.exit_code == 1
    assert "ModuleNotFoundError" in c2.stderr_tail
    with pytest.raises(agentjail.RunFailed):
        c2.raise_for_status()

    # The cells, in order, across pages of one.
    listed = list(s.cells(page_size=1))
    assert [c.cell for c in listed] == [0, 1, 2]
    assert listed[1].workspace == c1.workspace
    page = s.cells_page(limit=2)
    assert len(page.cells) == 2 and page.next_cursor
    assert s.refresh().view["cells"] == 3

    # The receipt chain verifies offline; out of order, it does not.
    verified = s.verify_chain(pubkey)
    assert [v.predicate["session"]["cell"] for v in verified] == [0, 1, 2]
    receipts = [c.receipt for c in listed]
    assert verified[1].predicate["session"]["previous_receipt_sha256"] == (
        agentjail.receipt_digest(client.receipt(listed[0].request_id))
    )
    with pytest.raises(agentjail.VerificationError):
        agentjail.verify_session([receipts[1], receipts[0]], public_key=pubkey)
    with pytest.raises(agentjail.VerificationError):
        agentjail.verify_session(receipts[1:], public_key=pubkey)

    # A fork from cell 0 starts from the workspace cell 0 left (before the '!').
    forked = s.fork(cell=0)
    assert forked.session_id != s.session_id and forked.view.get("forked_from") == {
        "session_id": s.session_id,
        "cell": 0,
    }
    f0 = forked.run("print(open('/work/rows.txt').read())\n" + OUT)
    assert f0.ok and f0.stdout.strip() == c1.stdout.strip() and f0.cell == 0
    assert receipts[0] is not None
    forked.verify_chain(pubkey, previous=agentjail.receipt_digest(receipts[0]))
    forked.close()

    s.close()
    assert s.state == "closed"
    s.close()  # idempotent
    with pytest.raises(agentjail.SessionClosed):
        s.run(OUT)
    with pytest.raises(agentjail.NotFound):
        client.get_session("ses_00000000000000000000000000000000")


def test_a_live_sessions_cells_have_receipts_that_chain(
    client: agentjail.Client, example: Path, pubkey: Path
) -> None:
    data = client.upload(example / "report.csv")
    s = client.session("agent_live", [data], request_id=rid("live-chain"))
    try:
        code = "n = len(open('/input/data.csv').read().splitlines())\nprint(n)\n"
        c0 = s.run(code)
        c1 = s.run("print(n * 2)\n")
        assert c0.ok and c1.ok and int(c1.stdout) == 2 * int(c0.stdout), c1.stderr_tail
        # A checkpoint on request (on the fleet, by the worker holding the interpreter): the
        # interpreter keeps its variables.
        sha = s.checkpoint()
        assert sha is not None and sha.startswith("sha256:")
        assert s.view["workspace_sha256"] == sha
        c2 = s.run("print(n)\n")
        assert c2.ok and c2.stdout.strip() == c0.stdout.strip(), c2.stderr_tail
        # Each live cell has a receipt of its own (the service's), and they chain.
        verified = s.verify_chain(pubkey)
        assert [v.is_live_cell for v in verified] == [True, True, True]
        assert [v.predicate["interpreter"]["state"] for v in verified] == [
            "started",
            "kept",
            "kept",
        ]
        assert verified[2].predicate["session_head"] == sha
        assert c0.receipt is not None
        one = agentjail.verify(
            c0.receipt,
            ("code.py", code.encode()),
            public_key=pubkey,
            stdout=c0.stdout.encode(),
            live_cell=True,
        )
        assert one.status == "ok" and one.predicate["session"]["cell"] == 0
        # Never taken for a run's receipt unless asked for.
        with pytest.raises(agentjail.VerificationError, match="live_cell=True"):
            agentjail.verify(c0.receipt, ("code.py", code.encode()), public_key=pubkey)
        with pytest.raises(agentjail.VerificationError):
            agentjail.verify(
                c0.receipt, ("code.py", b"print(1)\n"), public_key=pubkey, live_cell=True
            )
        with pytest.raises(agentjail.VerificationError):
            agentjail.verify(c0.receipt, public_key=pubkey, workspace=b"", live_cell=True)
    finally:
        s.close()


def test_the_context_manager_closes_and_limits_are_typed(
    client: agentjail.Client, ops: agentjail.Client
) -> None:
    with client.session("tiny") as s:
        assert s.run(OUT).ok
        # Another actor of the same tenant gets the 404 of a missing session.
        with pytest.raises(agentjail.NotFound):
            ops.get_session(s.session_id)
        # One cell at a time.
        slow = s.run("import time\ntime.sleep(3)\n" + OUT, request_id="slow", wait=False)
        assert not slow.finished
        with pytest.raises(agentjail.CellInProgress):
            s.run(OUT, request_id="next")
        done = s.run("import time\ntime.sleep(3)\n" + OUT, request_id="slow", timeout=60)
        assert done.ok and done.cell == 1
        with pytest.raises(agentjail.SessionCellLimit):
            s.run(OUT, request_id="third")
    assert client.get_session(s.session_id).state == "closed"


def test_async_sessions(client: agentjail.Client, example: Path) -> None:
    async def main() -> List[int]:
        async with agentjail.AsyncClient() as c:
            data = await c.upload(example / "report.csv")
            async with c.session("agent", [data]) as s:
                a = await s.run("open('/work/x', 'w').write('1')\n" + OUT)
                b = await s.run("print(open('/work/x').read())\n" + OUT, timeout=60)
                assert a.ok and b.ok and b.stdout.strip() == "1"
                assert len(await s.verify_chain(os.environ["AGENTJAIL_PUBKEY"])) == 2
                forked = await s.fork()
                await forked.close()
                cells = [x.cell async for x in s.cells(page_size=1)]
            assert s.state == "closed"
            opened = await c.session("agent", [data])
            await opened.close()
            return cells

    assert asyncio.run(main()) == [0, 1]

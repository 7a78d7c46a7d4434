"""Inputs, runs, results, errors and verification, with the sync client against a real
service (see conftest.py)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import List
import httpx

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import agentjail
from conftest import rid

# Exits 1 with a traceback on stderr: the module does not exist in the sandbox's Python.
IMPORT_FAILS = "import agentjail_no_such_module_pandas\n"
# ptrace(PTRACE_ATTACH, 1): refused by the seccomp filter, reported by name; the run goes on.
PTRACE = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.syscall(ctypes.c_long(101), ctypes.c_long(16), ctypes.c_long(1), ctypes.c_long(0), ctypes.c_long(0))
json.dump({"done": True}, open("/output/o.json", "w"))
"""
WRITES = "import json\njson.dump({}, open('/output/o.json', 'w'))\n"
SLEEPS = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"


def summarize(client: agentjail.Client, example: Path, **kw: object) -> agentjail.Run:
    data = client.upload(example / "report.csv")
    code = (example / "summarize.py").read_text()
    return client.run("summarize_csv", [data], code=code, **kw)  # type: ignore[arg-type,unused-ignore]


def test_upload_from_a_path_bytes_and_a_file_object(
    client: agentjail.Client, example: Path
) -> None:
    raw = (example / "report.csv").read_bytes()
    a = client.upload(example / "report.csv")
    b = client.upload(raw, name="data.csv", media_type="text/csv")
    with open(example / "report.csv", "rb") as f:
        c = client.upload(f)
    d = client.upload(io.BytesIO(raw), name="x.csv")
    assert a.name == "report.csv" and a.media_type == "text/csv" and a.bytes == len(raw)
    assert {i.sha256 for i in (a, b, c, d)} == {a.sha256}
    assert a.sha256.endswith(__import__("hashlib").sha256(raw).hexdigest())
    with pytest.raises(ValueError):
        client.upload(raw)  # bytes need a name


def test_summarize_csv_end_to_end_and_verify_offline(
    client: agentjail.Client, example: Path, pubkey: Path, tmp_path: Path
) -> None:
    run = summarize(client, example)
    assert run.ok and run.finished and run.status == "ok", run.record
    assert run.raise_for_status() is run
    summary = run.artifact
    assert summary["rows"] == 8 and "numeric" in summary
    # The artifact's bytes, by the artifact endpoint, are the signed ones.
    out = tmp_path / "summary.json"
    assert client.download_artifact(run.request_id, out) == out.stat().st_size > 0
    assert json.loads(out.read_bytes()) == summary
    receipt = client.receipt(run.request_id)
    assert receipt == run.receipt
    v = agentjail.verify(receipt, artifact=out, public_key=pubkey)
    assert v.status == "ok" and [s["name"] for s in v.subjects] == ["summary.json"]
    assert v.predicate["request_id"] == run.request_id
    # The same from bytes, a (name, bytes) pair, a receipt file and PEM text.
    rfile = tmp_path / "receipt.json"
    rfile.write_text(json.dumps(receipt))
    agentjail.verify(rfile, artifact=out.read_bytes(), public_key=pubkey.read_text())
    agentjail.verify(
        rfile.read_bytes(),
        artifact=[("summary.json", out.read_bytes())],
        public_key=pubkey.read_bytes(),
    )
    # The logs verify against the receipt.
    stdout = client.logs(run.request_id, "stdout")
    assert stdout.sha256 is not None and stdout.masked == 0
    agentjail.verify(receipt, public_key=pubkey, stdout=stdout.data)

    # A changed artifact byte, another key, a changed payload, a changed log: refused.
    bad = bytearray(out.read_bytes())
    bad[2] ^= 1
    with pytest.raises(agentjail.VerificationError, match="does not match"):
        agentjail.verify(receipt, artifact=("summary.json", bytes(bad)), public_key=pubkey)
    other = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(agentjail.VerificationError, match="no signature verifies"):
        agentjail.verify(receipt, artifact=out, public_key=other)
    pem = other.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(agentjail.VerificationError, match="no signature verifies"):
        agentjail.verify(receipt, public_key=pem)
    tampered = dict(receipt)
    p = tampered["payload"]
    i = len(p) // 2
    tampered["payload"] = p[:i] + ("B" if p[i] == "A" else "A") + p[i + 1 :]
    with pytest.raises(agentjail.VerificationError):
        agentjail.verify(tampered, public_key=pubkey)
    with pytest.raises(agentjail.VerificationError, match="stdout log"):
        agentjail.verify(receipt, public_key=pubkey, stdout=stdout.data + b"x")
    with pytest.raises(agentjail.VerificationError, match="not .exactly one. subject"):
        agentjail.verify(receipt, artifact=("other.json", b"{}"), public_key=pubkey)

    # The same verdicts as `agentjail receipt verify`, case by case.
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_bytes(bytes(bad))
    (tmp_path / "other.pem").write_bytes(pem)
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    (tmp_path / "stdout.log").write_bytes(stdout.data)
    (tmp_path / "wrong.log").write_bytes(stdout.data + b"x")
    cases = [
        (rfile, [str(out)], pubkey, None, True),
        (rfile, [str(tmp_path / "bad" / "summary.json")], pubkey, None, False),
        (rfile, [str(out)], tmp_path / "other.pem", None, False),
        (tmp_path / "tampered.json", [], pubkey, None, False),
        (rfile, [], pubkey, tmp_path / "stdout.log", True),
        (rfile, [], pubkey, tmp_path / "wrong.log", False),
    ]
    for receipt_file, artifacts, key, log, accepted in cases:
        cli = subprocess.run(
            [
                os.environ["AGENTJAIL_BIN"],
                "receipt",
                "verify",
                str(receipt_file),
                "--pubkey",
                str(key),
            ]
            + [a for p in artifacts for a in ("--artifact", p)]
            + (["--stdout", str(log)] if log else []),
            capture_output=True,
        )
        try:
            agentjail.verify(receipt_file, artifacts, public_key=key, stdout=log)
            verdict = True
        except agentjail.VerificationError:
            verdict = False
        assert (cli.returncode == 0) == accepted == verdict, (
            receipt_file,
            artifacts,
            key,
            log,
            cli,
        )


def test_a_failing_import_is_a_typed_result_with_the_traceback(client: agentjail.Client) -> None:
    run = client.run("py", code=IMPORT_FAILS)
    assert run.finished and not run.ok
    assert run.status == "exit_nonzero" and run.exit_code == 1, run.record
    assert "ModuleNotFoundError" in run.stderr_tail
    assert "Traceback" in run.stderr
    assert run.artifact is None
    with pytest.raises(agentjail.RunFailed) as e:
        run.raise_for_status()
    assert e.value.run is run
    assert "exit_nonzero" in str(e.value) and "ModuleNotFoundError" in str(e.value)
    # The artifact of a run that did not end ok is a typed conflict.
    with pytest.raises(agentjail.Conflict) as c:
        client.artifact(run.request_id)
    assert c.value.status == 409 and c.value.slug == "no-verified-artifact"
    assert "ModuleNotFoundError" in client.logs(run.request_id, "stderr").text


def test_a_denial_is_in_the_result(client: agentjail.Client) -> None:
    run = client.run("py", code=PTRACE)
    assert run.ok, run.record
    assert {"kind": "syscall", "detail": "ptrace"}.items() <= run.denials[0].items(), run.denials
    assert run.artifact == {"done": True}
    # The same denial as a live event (here replayed from the start of the ended run).
    live = [e.data for e in client.events(run.request_id) if e.event == "denial"]
    assert live == [{"kind": "syscall", "detail": "ptrace", "untrusted": True}], live


def test_execute_once(client: agentjail.Client) -> None:
    request_id = rid("once")
    code = "import json, random\njson.dump({'r': random.random()}, open('/output/o.json', 'w'))\n"
    first = client.run("py", code=code, request_id=request_id)
    again = client.run("py", code=code, request_id=request_id)
    assert first.ok and again.ok
    assert again.record["job_id"] == first.record["job_id"]
    assert again.artifact == first.artifact  # one run: the same random number
    assert [r["request_id"] for r in client.list(task="py") if r["request_id"] == request_id] == [
        request_id
    ]
    with pytest.raises(agentjail.Conflict) as e:
        client.run("py", code=code + "\n", request_id=request_id)
    assert e.value.slug == "request-id-conflict" and e.value.problem["status"] == 409
    # Without an id, each call is a new run with a fresh UUID4.
    a, b = client.submit("py", code=code), client.submit("py", code=code)
    assert a.request_id != b.request_id
    assert uuid.UUID(a.request_id).version == 4
    assert client.wait(a.request_id, timeout=60).ok and client.wait(b.request_id, timeout=60).ok


def test_wait_times_out_and_cancel_ends_a_running_run(client: agentjail.Client) -> None:
    run = client.submit("py", code=SLEEPS)
    assert not run.finished
    with pytest.raises(agentjail.WaitTimeout) as e:
        client.wait(run.request_id, timeout=0.5)
    assert isinstance(e.value, agentjail.Timeout) and isinstance(e.value, TimeoutError)
    assert e.value.request_id == run.request_id and e.value.last is not None
    with pytest.raises(agentjail.WaitTimeout):
        client.run("py", code=SLEEPS, timeout=0.5)
    # Cancel it once it runs (its first line printed).
    for ev in client.events(run.request_id):
        if ev.event == "stdout":
            break
    assert client.get(run.request_id).status == "running"
    t0 = time.monotonic()
    cancelled = client.cancel(run.request_id)
    assert cancelled.status == "cancelled" and cancelled.finished and not cancelled.ok
    assert time.monotonic() - t0 < 30
    assert "started" in cancelled.stdout
    assert client.cancel(run.request_id).status == "cancelled"  # idempotent
    done = client.run("py", code="print(1)")
    with pytest.raises(agentjail.Conflict):
        client.cancel(done.request_id)


def test_list_with_filters_and_cursor_pagination(client: agentjail.Client) -> None:
    marker = rid("page")
    ids = [
        client.submit("py", code="print(1)", request_id="%s-%d" % (marker, n)).request_id
        for n in range(5)
    ]
    for i in ids:
        client.wait(i, timeout=60)
    page = client.list_page(task="py", limit=2)
    assert len(page.runs) == 2 and page.next_cursor
    seen = [r["request_id"] for r in client.list(task="py", page_size=2)]
    assert len(seen) == len(set(seen)), "a run listed twice across pages"
    assert set(ids) <= set(seen)
    # Newest first: the five in reverse order of submission.
    assert [i for i in seen if i in ids] == ids[::-1]
    assert all(r["task"] == "py" for r in client.list(task="py", page_size=3))
    ok_only = list(client.list(status="ok", task="py", page_size=100))
    assert ok_only and all(r["status"] == "ok" for r in ok_only)
    with pytest.raises(agentjail.BadRequest) as e:
        client.list_page(limit=1000)
    assert e.value.status == 400


def test_errors_are_typed_and_carry_the_problem(client: agentjail.Client) -> None:
    with pytest.raises(agentjail.NotFound) as e:
        client.get("no-such-run-" + uuid.uuid4().hex)
    p = e.value
    assert p.status == 404 and p.slug == "not-found"
    assert p.type == "https://agentjail.dev/problems/not-found"
    assert p.title and p.detail and p.problem["status"] == 404
    assert isinstance(p, agentjail.APIError) and isinstance(p, agentjail.AgentjailError)
    with pytest.raises(agentjail.NotFound):
        client.run("no_such_task", code="print(1)")
    with pytest.raises(agentjail.NotFound):
        client.run("summarize_csv", ["in_" + "0" * 32], code="print(1)")
    with agentjail.Client(token="wrong-token") as wrong:
        with pytest.raises(agentjail.Unauthorized) as u:
            wrong.tasks()
        assert u.value.headers.get("www-authenticate") == "Bearer"
    with pytest.raises(agentjail.Refused):
        client.list_page(tenant="someone-else")
    with pytest.raises(agentjail.BadRequest):
        client.run("py", code="print(1)", request_id="..")
    with pytest.raises(agentjail.InputMismatch):
        client.run("summarize_csv", code="print(1)")
    # A service that accepts the connection and never answers: a transport timeout, distinct
    # from a run's own `timeout` status and from WaitTimeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        url = "http://127.0.0.1:%d" % silent.getsockname()[1]
        with agentjail.Client(url, timeout=0.5) as mute:
            with pytest.raises(agentjail.TransportTimeout) as t:
                mute.get("any")
        assert isinstance(t.value, agentjail.Timeout)
        assert not isinstance(t.value, agentjail.WaitTimeout)
    finally:
        silent.close()
    # The service cannot be reached: a transport error, not an API error.
    with agentjail.Client("http://127.0.0.1:9", timeout=2) as nowhere:
        with pytest.raises(agentjail.TransportError):
            nowhere.health()


def test_a_callers_own_httpx_client_is_used() -> None:
    seen: List[str] = []
    hooks = {"request": [lambda r: seen.append(r.url.path)]}
    with httpx.Client(event_hooks=hooks) as http:
        with agentjail.Client(http_client=http) as c:
            assert {t["name"] for t in c.tasks()} >= {"py"}
        assert not http.is_closed, "closed a client the caller owns"
    assert seen == ["/v1/tasks"]


def test_tasks_health_metrics(client: agentjail.Client) -> None:
    names = {t["name"] for t in client.tasks()}
    assert {"py", "summarize_csv"} <= names
    assert client.health()
    assert "agentjail_" in client.metrics()
    assert client.openapi()["openapi"].startswith("3.1")


def test_the_version_is_the_services() -> None:
    assert agentjail.__version__ == os.environ.get("AGENTJAIL_VERSION", agentjail.__version__)


def test_a_full_service_is_rate_limited_then_retried() -> None:
    """Against the second service (one run slot, no queue): a run submitted while another
    runs is 429 with Retry-After; with retries, the client waits and gets through."""
    busy = os.environ["AGENTJAIL_BUSY_URL"]
    with agentjail.Client(busy, retries=0) as c:
        first = c.submit("py", code=SLEEPS)
        for ev in c.events(first.request_id):
            if ev.event == "stdout":
                break
        with pytest.raises(agentjail.RateLimited) as e:
            c.submit("py", code="print(1)")
        assert e.value.status == 429 and e.value.slug == "overloaded"
        assert e.value.retry_after == 5.0
        # With retries, the same call waits for the slot (freed here after a second).
        threading.Timer(1.0, lambda: c.cancel(first.request_id)).start()
        with agentjail.Client(busy, retries=2) as patient:
            t0 = time.monotonic()
            run = patient.run("py", code=WRITES)
            assert run.ok and time.monotonic() - t0 >= 4.0

"""The OpenAI Agents SDK integrations (agentjail.integrations.openai_agents) against a real
service, with no model key and no network: a scripted ``Model`` of the SDK's interface answers
with tool calls, reading the tool outputs it got back, and ``Runner`` runs them through
``AgentjailPython.tool``, each as one cell of one session, or through a ``SandboxAgent``'s
shell and ``apply_patch`` tools on ``AgentjailSandboxClient`` (whose workspace is then restored
from the snapshot the run's end saved). The sandbox provider's other tests drive its sessions
directly: exec results a command cannot forge, files in pieces, paths outside ``/work``,
references of another actor or tampered with, resume.

Sessions work on either store (SQLite or PostgreSQL). Under CI
(``CI`` set) openai-agents must be importable (``.ci/run`` pins it); elsewhere, without it,
this module is skipped (crates/cli/tests/client_python.rs leaves it out and says so).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

import pytest

try:
    import agents  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("openai-agents is not installed", allow_module_level=True)

from agents import Agent, ModelResponse, ModelSettings, RunConfig, Runner, Usage
from agents.models.interface import Model, ModelTracing
from agents.sandbox import (
    LocalSnapshot,
    LocalSnapshotSpec,
    Manifest,
    SandboxAgent,
    SandboxPathGrant,
    SandboxRunConfig,
    User,
)
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from openai.types.responses import (
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import agentjail
from conftest import READ_REVENUE
from agentjail.integrations.openai_agents import (
    WORKSPACE_REF_MAGIC,
    AgentjailPython,
    AgentjailSandboxClient,
    AgentjailSandboxClientOptions,
    AgentjailSandboxSession,
    AgentjailSandboxSessionState,
    WorkspaceReferenceRefused,
)


READ = READ_REVENUE + """print('rows:', len(rows), 'regions:', len(revenue))
"""
TYPO = "import json\nrevenue = json.load(open('/work/revenu.json'))\n"
TOP = """import json
revenue = json.load(open('/work/revenue.json'))
top = max(revenue, key=revenue.get)
open('answer.txt', 'w').write(top)
(top, round(revenue[top], 2))
"""
LIST = "import os\nsorted(os.listdir('.'))\n"

Step = Callable[[List[Dict[str, Any]]], List[Any]]


def call(call_id: str, code: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id="fc_" + call_id,
        call_id=call_id,
        type="function_call",
        name="python",
        arguments=json.dumps({"code": code}),
        status="completed",
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_final",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def outputs(items: List[Dict[str, Any]]) -> Dict[str, str]:
    """The tool outputs the model got back, by call id."""
    return {
        i["call_id"]: str(i["output"])
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    }


class ScriptedModel(Model):
    """A model of the SDK's interface that answers with the next of a fixed list of steps;
    each step sees the conversation so far (the tool outputs included). No key, no network."""

    def __init__(self, steps: List[Step]) -> None:
        self.steps = list(steps)
        self.calls = 0
        self.tools_seen: List[List[str]] = []

    async def get_response(
        self,
        system_instructions: Optional[str],
        input: Any,
        model_settings: ModelSettings,
        tools: List[Any],
        output_schema: Any,
        handoffs: List[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: Optional[str],
        conversation_id: Optional[str],
        prompt: Any,
    ) -> ModelResponse:
        self.tools_seen.append([t.name for t in tools])
        items = input if isinstance(input, list) else []
        step = self.steps[self.calls]
        self.calls += 1
        return ModelResponse(output=step(items), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def answer(items: List[Dict[str, Any]]) -> List[Any]:
    """The last step: the answer, taken from what the sandbox printed."""
    seen = outputs(items)
    m = re.search(r"Out: \('(\w+)', ([0-9.]+)\)", seen["call_top"])
    assert m is not None, seen
    return [say("%s: %s" % (m.group(1), m.group(2)))]


def test_an_agent_solves_a_multi_step_task_in_one_session(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    asyncio.run(scenario(client, data))


async def scenario(client: agentjail.Client, data: agentjail.Input) -> None:
    model = ScriptedModel(
        [
            lambda items: [call("call_read", READ)],
            # The model reads the first output, then makes a mistake.
            lambda items: (
                [call("call_typo", TYPO)] if "rows: 8" in outputs(items)["call_read"] else []
            ),
            # Two calls in one turn (the SDK runs them concurrently): one cell at a time.
            lambda items: [call("call_top", TOP), call("call_ls", LIST)],
            answer,
        ]
    )
    async with await AgentjailPython.open("agent", [data], timeout=120) as python:
        agent = Agent(
            name="analyst",
            instructions="Answer with the sandbox's help.",
            tools=[python.tool],
            model=model,
        )
        result = await Runner.run(
            agent,
            "Which region has the most revenue?",
            run_config=RunConfig(tracing_disabled=True),
            max_turns=8,
        )
        assert result.final_output == "west: 198.0"
        assert model.calls == 4 and model.tools_seen[0] == ["python"]
        seen = outputs([i.to_input_item() for i in result.new_items])  # type: ignore[misc]
        assert seen["call_read"].startswith("[agentjail cell 0: ok]\nrows: 8 regions: 4")
        # The mistake is an output the model reads, with the sandbox's traceback.
        assert "exit_nonzero" in seen["call_typo"]
        assert "FileNotFoundError" in seen["call_typo"] and "revenu.json" in seen["call_typo"]
        assert "Out: ('west', 198.0)" in seen["call_top"]
        assert "revenue.json" in seen["call_ls"]
        session_id = python.session.session_id
        cells = list(client.cells(session_id))
        assert [c.cell for c in cells] == [0, 1, 2, 3]
        assert [c.status for c in cells] == ["ok", "exit_nonzero", "ok", "ok"]
        assert all(c.workspace_after for c in cells)
        assert cells[0].artifact == {"value": None, "error": None}

        # A tool call sent again (same call id, same code) returns its recorded cell.
        again = await python.run(TOP, call_id="call_top")
        by_rid = {c.request_id: c.cell for c in cells}
        assert again.cell == by_rid[again.request_id] and len(list(client.cells(session_id))) == 4

        # Restore: a fork from cell 0's checkpoint has revenue.json, not answer.txt.
        async with await python.fork(cell=0) as restored:
            listing = await restored.run(LIST)
            assert listing.ok and listing.artifact["value"] == "['revenue.json']"
            assert restored.session.session_id != session_id
        after = await python.run(LIST)
        assert after.artifact["value"] == "['answer.txt', 'revenue.json']"
    assert client.get_session(session_id).state == "closed"


# --- The sandbox provider: a SandboxAgent's shell, files and workspace on agentjail sessions ---

REPORT_PY = """import csv, json
revenue = {}
for r in csv.DictReader(open('/input/data.csv')):
    if r['revenue']:
        revenue[r['region']] = revenue.get(r['region'], 0.0) + float(r['revenue'])
top = max(revenue, key=revenue.get)
json.dump({'top': top, 'revenue': round(revenue[top], 2)}, open('out/result.json', 'w'))
print('wrote out/result.json for', len(revenue), 'regions')
"""


def patch(call_id: str, path: str, text: str) -> ResponseCustomToolCall:
    """An ``apply_patch`` call (the SDK's freeform tool) that adds ``path``."""
    lines = "".join("+%s\n" % line for line in text.splitlines())
    return ResponseCustomToolCall(
        id="ctc_" + call_id,
        call_id=call_id,
        type="custom_tool_call",
        name="apply_patch",
        input="*** Begin Patch\n*** Add File: %s\n%s*** End Patch\n" % (path, lines),
    )


def shell(call_id: str, cmd: str) -> ResponseFunctionToolCall:
    """An ``exec_command`` call (the SDK's shell tool)."""
    return ResponseFunctionToolCall(
        id="fc_" + call_id,
        call_id=call_id,
        type="function_call",
        name="exec_command",
        arguments=json.dumps({"cmd": cmd}),
        status="completed",
    )


OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")


def all_outputs(items: List[Dict[str, Any]]) -> Dict[str, str]:
    """The outputs of function and custom tool calls the model got back, by call id."""
    return {
        i["call_id"]: str(i["output"])
        for i in items
        if isinstance(i, dict) and i.get("type") in OUTPUT_TYPES
    }


def options(data: agentjail.Input, **kw: Any) -> AgentjailSandboxClientOptions:
    return AgentjailSandboxClientOptions(task="agent", inputs=[data], cell_timeout=120, **kw)


def test_a_sandbox_agent_runs_a_multi_step_task_and_its_workspace_is_restored(
    client: agentjail.Client, example: Path, tmp_path: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    asyncio.run(sandbox_scenario(client, data, tmp_path))


async def sandbox_scenario(client: agentjail.Client, data: agentjail.Input, tmp: Path) -> None:
    def after_patch(items: List[Dict[str, Any]]) -> List[Any]:
        seen = all_outputs(items)
        assert "report.py" in seen["call_patch"], seen
        return [shell("call_run", "mkdir -p out && python3 report.py")]

    def after_run(items: List[Dict[str, Any]]) -> List[Any]:
        seen = all_outputs(items)["call_run"]
        assert "Process exited with code 0" in seen and "for 4 regions" in seen, seen
        return [shell("call_cat", "cat out/result.json")]

    def final(items: List[Dict[str, Any]]) -> List[Any]:
        seen = all_outputs(items)["call_cat"]
        result = json.loads(seen[seen.index("{") :])
        return [say("%s: %s" % (result["top"], result["revenue"]))]

    model = ScriptedModel(
        [lambda items: [patch("call_patch", "report.py", REPORT_PY)], after_patch, after_run, final]
    )
    snapshots = tmp / "snapshots"
    async with AgentjailSandboxClient(agentjail.AsyncClient()) as sandbox:
        agent = SandboxAgent(
            name="analyst", instructions="Answer with the sandbox's help.", model=model
        )
        result = await Runner.run(
            agent,
            "Which region has the most revenue?",
            run_config=RunConfig(
                tracing_disabled=True,
                sandbox=SandboxRunConfig(
                    client=sandbox,
                    options=options(data),
                    snapshot=LocalSnapshotSpec(base_path=snapshots),
                ),
            ),
            max_turns=8,
        )
        assert result.final_output == "west: 198.0"
        assert model.calls == 4
        assert {"exec_command", "apply_patch"} <= set(model.tools_seen[0])

        # The runner's cleanup persisted the workspace (a reference, not a tar archive) and
        # ended the agentjail session; the reference names a parked fork of it.
        [saved] = list(snapshots.iterdir())
        ref = saved.read_bytes()
        assert ref.startswith(WORKSPACE_REF_MAGIC) and len(ref) < 400
        parked_id = json.loads(ref[len(WORKSPACE_REF_MAGIC) :])["session_id"]
        parked = client.get_session(parked_id)
        assert parked.state == "open" and parked.view["cells"] == 0
        forked_from = parked.view.get("forked_from")
        assert forked_from is not None
        original = client.get_session(forked_from["session_id"])
        assert original.state == "closed"
        cells = list(client.cells(original.session_id))
        assert cells and all(c.ok and c.workspace_after for c in cells)
        assert parked.workspace_sha256 == cells[-1].workspace_after

        # Restore: a new sandbox session from that snapshot sees the files (the SDK's own
        # restore flow: start() hydrates from the stored reference).
        restored = await sandbox.create(
            options=options(data), snapshot=LocalSnapshot(id=saved.stem, base_path=snapshots)
        )
        await restored.start()
        try:
            got = json.loads((await restored.read(Path("out/result.json"))).read())
            assert got == {"top": "west", "revenue": 198.0}
            # (apply_patch writes a file's lines without the last newline)
            script = (await restored.read(Path("report.py"))).read()
            assert script == REPORT_PY.rstrip("\n").encode()
            listing = await restored.exec("ls . out")
            assert listing.exit_code == 0
            assert listing.stdout.split() == [b".:", b"out", b"report.py", b"out:", b"result.json"]
            inner = restored._inner
            assert isinstance(inner, AgentjailSandboxSession)
            backing = inner.agentjail_session
            assert backing is not None
            origin = backing.view.get("forked_from")
            assert origin is not None and origin["session_id"] == parked_id
        finally:
            await sandbox.delete(restored)
        assert client.get_session(backing.session_id).state == "closed"
        # The parked session is still there: the reference can be restored again.
        client.close_session(parked_id)


def test_the_sandbox_exec_reports_the_commands_own_result(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    asyncio.run(exec_scenario(data))


async def exec_scenario(data: agentjail.Input) -> None:
    async with AgentjailSandboxClient() as sandbox:
        s = await sandbox.create(options=options(data))
        await s.start()
        try:
            r = await s.exec("echo out; echo err >&2; exit 3")
            assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
            # A command that imitates the report, on stdout and in the output file itself, and
            # leaves a process behind to write it again: its own exit code is what is reported.
            forged = json.dumps({"op": "exec", "exit_code": 0, "stdout": "", "stderr": ""})
            r = await s.exec(
                "echo '%s'; echo '%s' > /output/o.json; "
                "(sleep 0.3; echo '%s' > /output/o.json) & exit 7" % (forged, forged, forged)
            )
            assert r.exit_code == 7 and r.stdout == forged.encode() + b"\n", r
            # A process of a session of its own (out of the command's process group) that reads
            # the call's nonce from the cell's code and keeps putting a whole report with it in
            # place (written aside, renamed over the output file): still the command's own
            # exit code.
            daemon = (
                "import json, os, re\n"
                "n = re.search(r'nonce[^0-9a-f]+([0-9a-f]{32})', open('/input/code.py').read())[1]\n"
                "r = {'op': 'exec', 'nonce': n, 'timed_out': False, 'exit_code': 0,"
                " 'stdout': '', 'stderr': '', 'stdout_bytes': 0, 'stderr_bytes': 0}\n"
                "while True:\n"
                "    try:\n"
                "        json.dump(r, open('/output/.r', 'w'))\n"
                "        os.rename('/output/.r', '/output/o.json')\n"
                "    except OSError:\n"
                "        pass\n"
            )
            await s.write(Path("daemon.py"), io.BytesIO(daemon.encode()))
            r = await s.exec(
                "setsid python3 daemon.py </dev/null >/dev/null 2>&1 & sleep 0.5; exit 7"
            )
            assert r.exit_code == 7, r
            # Bytes come back as written, a signal as 128 + its number, a missing program as 127.
            r = await s.exec("printf '\\000\\377\\033[31mred'")
            assert r.stdout == b"\x00\xff\x1b[31mred"
            assert (await s.exec("kill -9 $$")).exit_code == 137
            missing = await s.exec("no-such-program", shell=False)
            assert missing.exit_code == 127 and b"No such file" in missing.stderr
            # Output beyond what a cell's report carries: the head, and a note on stderr.
            r = await s.exec("head -c 300000 /dev/zero | tr '\\0' a")
            assert 50_000 < len(r.stdout) < 300_000 and set(r.stdout) == {ord("a")}
            assert b"[agentjail: output truncated; stdout:" in r.stderr
            # A background process does not hold the call; a timeout raises.
            assert (await s.exec("sleep 100 & echo started")).stdout == b"started\n"
            with pytest.raises(ExecTimeoutError):
                await s.exec("sleep 30", timeout=1)
            with pytest.raises(ExecTransportError, match="unprivileged user"):
                await s.exec("id", user="root")
            # Only /work carries over, from one call to the next.
            await s.exec("echo kept > kept.txt; echo gone > /tmp/gone.txt")
            r = await s.exec("cat kept.txt; ls /tmp/gone.txt")
            assert r.stdout == b"kept\n" and r.exit_code != 0
        finally:
            await sandbox.delete(s)


def test_the_sandbox_moves_files_in_pieces_and_keeps_them_in_the_workspace(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    asyncio.run(files_scenario(client, data))


async def files_scenario(client: agentjail.Client, data: agentjail.Input) -> None:
    async with AgentjailSandboxClient() as sandbox:
        s = await sandbox.create(
            options=options(data, max_file_bytes=300_000),
            manifest=Manifest(extra_path_grants=(SandboxPathGrant(path="/input", read_only=True),)),
        )
        await s.start()
        try:
            big = os.urandom(200_000)  # more than one cell carries either way
            await s.write(Path("data/big.bin"), io.BytesIO(big))
            assert (await s.read(Path("data/big.bin"))).read() == big
            assert await s.read_bounded(Path("/work/data/big.bin"), max_bytes=10) == big[:10]
            listing = await s.exec("ls -a data")
            assert listing.stdout.split() == [b".", b"..", b"big.bin"]  # no part file left
            # The granted input is readable, not writable.
            csv = (await s.read(Path("/input/data.csv"))).read()
            assert csv == (Path(os.environ["AGENTJAIL_EXAMPLE"]) / "report.csv").read_bytes()
            with pytest.raises(WorkspaceArchiveWriteError):
                await s.write(Path("/input/data.csv"), io.BytesIO(b"x"))
            # Too large either way: refused, said so.
            with pytest.raises(WorkspaceArchiveWriteError) as w:
                await s.write(Path("huge.bin"), io.BytesIO(b"x" * 300_001))
            assert w.value.context["reason"] == "file_too_large"
            await s.exec("head -c 300001 /dev/zero > huge.bin")
            with pytest.raises(WorkspaceArchiveReadError) as r:
                await s.read(Path("huge.bin"))
            assert r.value.context["reason"] == "file_too_large"
            with pytest.raises(WorkspaceReadNotFoundError):
                await s.read(Path("nothing.txt"))
            # Paths outside the workspace are refused before any cell runs, as the SDK's own
            # providers refuse them.
            for outside in ("../etc/passwd", "/etc/passwd", "data/../../etc/passwd"):
                with pytest.raises(InvalidManifestPathError):
                    await s.read(Path(outside))
                with pytest.raises(InvalidManifestPathError):
                    await s.write(Path(outside), io.BytesIO(b"x"))
        finally:
            await sandbox.delete(s)


def test_a_workspace_reference_is_refused_when_foreign_or_tampered(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    asyncio.run(refusal_scenario(client, data))


async def refusal_scenario(client: agentjail.Client, data: agentjail.Input) -> None:
    ops = agentjail.AsyncClient(token=os.environ["AGENTJAIL_OPS_TOKEN"])
    async with AgentjailSandboxClient() as sandbox, AgentjailSandboxClient(ops) as other:
        # Another actor's workspace (same tenant: the service answers 404 as for none).
        theirs = await other.create(options=options(data))
        await theirs.start()
        await theirs.exec("echo secret > secret.txt")
        foreign = (await theirs.persist_workspace()).read()
        await other.delete(theirs)

        s = await sandbox.create(options=options(data))
        await s.start()
        try:
            await s.exec("echo mine > mine.txt")
            ref = (await s.persist_workspace()).read()
            inner = s._inner
            assert isinstance(inner, AgentjailSandboxSession)
            before = inner.state.agentjail_session_id
            assert before is not None
            body = json.loads(ref[len(WORKSPACE_REF_MAGIC) :])
            digest = body["workspace_sha256"]
            flipped = digest[:-1] + ("0" if digest[-1] != "0" else "1")

            def tampered(**change: Any) -> bytes:
                return WORKSPACE_REF_MAGIC + json.dumps(dict(body, **change)).encode()

            cases = [
                (foreign, "not_found"),
                (tampered(workspace_sha256=flipped), "digest_mismatch"),
                (tampered(session_id="ses_" + "0" * 32), "not_found"),
                (tampered(task="py"), "other_task"),
                (tampered(extra=1), "malformed"),
                (ref[:-1], "malformed"),
                (b"\x1f\x8b" + b"\0" * 100, "not_a_reference"),  # e.g. a tar archive
            ]
            for raw, reason in cases:
                with pytest.raises(WorkspaceReferenceRefused) as refused:
                    await s.hydrate_workspace(io.BytesIO(raw))
                assert refused.value.reason == reason, (raw, refused.value)
                assert isinstance(refused.value, WorkspaceArchiveWriteError)
            # Nothing changed: the same agentjail session, the same files.
            assert inner.state.agentjail_session_id == before
            r = await s.exec("cat mine.txt; ls")
            assert r.stdout == b"mine\nmine.txt\n"
            # The reference itself restores, into a fork that replaces (and closes) the session.
            await s.exec("rm mine.txt")
            await s.hydrate_workspace(io.BytesIO(ref))
            assert inner.state.agentjail_session_id != before
            assert client.get_session(before).state == "closed"
            assert (await s.read(Path("mine.txt"))).read() == b"mine\n"
            # Again, once the session it was parked from has ended: the parked one holds it.
            await s.exec("rm mine.txt")
            await s.hydrate_workspace(io.BytesIO(ref))
            assert (await s.read(Path("mine.txt"))).read() == b"mine\n"
            # A parked session that was ended: refused as such.
            client.close_session(body["session_id"])
            with pytest.raises(WorkspaceReferenceRefused) as ended:
                await s.hydrate_workspace(io.BytesIO(ref))
            assert ended.value.reason == "source_ended"
        finally:
            await sandbox.delete(s)


def test_the_sandbox_resumes_its_session_and_refuses_what_agentjail_cannot_back(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    asyncio.run(resume_scenario(client, data))


async def resume_scenario(client: agentjail.Client, data: agentjail.Input) -> None:
    async with AgentjailSandboxClient() as sandbox:
        s = await sandbox.create(options=options(data))
        await s.start()
        await s.write(Path("state.txt"), io.BytesIO(b"before"))
        # The SDK's serialized state (a RunState's) names the agentjail session; resume
        # reattaches to it while it is open.
        payload = json.loads(json.dumps(sandbox.serialize_session_state(s.state)))
        assert "token" not in json.dumps(payload).lower()
        state = sandbox.deserialize_session_state(payload)
        again = await sandbox.resume(state)
        await again.start()
        first, second = s.state, again.state
        assert isinstance(first, AgentjailSandboxSessionState)
        assert isinstance(second, AgentjailSandboxSessionState)
        assert first.agentjail_session_id is not None
        assert second.agentjail_session_id == first.agentjail_session_id
        assert (await again.read(Path("state.txt"))).read() == b"before"
        await sandbox.delete(again)
        assert client.get_session(first.agentjail_session_id).state == "closed"

        for task, what in [
            ("agent_live", "live sessions"),
            ("py", "output"),
            ("no-such-task", "not one the caller may use"),
        ]:
            with pytest.raises(ValueError, match=what):
                await sandbox.create(options=AgentjailSandboxClientOptions(task, [data]))
        for manifest, what in [
            (Manifest(root="/srv"), "workspace is /work"),
            (Manifest(users=[User(name="alice")]), "unprivileged user"),
        ]:
            with pytest.raises(ValueError, match=what):
                await sandbox.create(options=options(data), manifest=manifest)

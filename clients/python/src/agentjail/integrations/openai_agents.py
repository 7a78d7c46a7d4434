"""The OpenAI Agents SDK on agentjail (``pip install 'agentjail[openai-agents]'``; tested with
the ``openai-agents`` version ``.ci/run`` pins, 0.24): a **sandbox provider** for the SDK's
``SandboxAgent`` (:class:`AgentjailSandboxClient`, its sessions backed by agentjail sessions)
and a code-execution **function tool** for a plain ``Agent`` (:class:`AgentjailPython`).

The sandbox provider
--------------------

``agents.sandbox`` runs a ``SandboxAgent``'s shell commands, file reads and writes and
``apply_patch`` edits through a ``BaseSandboxSession`` that a ``SandboxClient`` makes.
:class:`AgentjailSandboxClient` makes sandbox sessions (:class:`AgentjailSandboxSession`), each
backed by one agentjail session of a task whose sessions are not live (no
``session.interpreter``):

>>> from agents import Runner, RunConfig
>>> from agents.sandbox import SandboxAgent, SandboxRunConfig
>>> from agentjail.integrations.openai_agents import (
...     AgentjailSandboxClient, AgentjailSandboxClientOptions)
>>> sandbox = SandboxRunConfig(                                        # doctest: +SKIP
...     client=AgentjailSandboxClient(),   # on AsyncClient(): $AGENTJAIL_URL, $AGENTJAIL_TOKEN
...     options=AgentjailSandboxClientOptions(task="agent", inputs=[data.input_id]))
>>> agent = SandboxAgent(name="analyst", model=..., instructions="...")   # doctest: +SKIP
>>> await Runner.run(agent, "...", run_config=RunConfig(sandbox=sandbox))  # doctest: +SKIP

How the SDK's operations map onto agentjail:

- **The workspace is ``/work``**, the session's persistent folder. A manifest with the default
  root (``/workspace``) is given ``/work`` instead; any other root is refused (nothing else
  persists). The task's inputs are where the task mounts them (e.g. ``/input/data.csv``),
  read-only, outside the workspace: commands read them, the SDK's file API does not unless
  the manifest grants the path (``extra_path_grants``).
- **``exec`` is one cell.** The SDK's command (``sh -lc …`` for a shell command) runs with
  ``subprocess`` in ``/work``, stdin empty, stdout and stderr to files, in a process group that
  is killed when the command ends; then every other process of the cell's sandbox is killed
  too (``kill(-1)`` until none is left: a process the command left in a session of its own
  could read the call's nonce from the cell's code and rename a report of its own into
  place). The cell then writes the exit code and both streams (base64) as one JSON report,
  with the call's random nonce, to a fresh task's output file, never to stdout: nothing the
  command prints can be taken for the report, and a report the command writes there itself,
  now or from a process it leaves behind, is replaced (the process is killed first). The report is
  still the sandbox's word, like everything a command produces. The exit code is the
  command's (``128 + n`` after signal ``n``; 127 for a program that does not exist). Each
  stream comes back whole up to what the task's output (``output_max_bytes``, base64) can
  carry, the head beyond that, with a ``[agentjail: output truncated; …]`` line appended to
  stderr. ``timeout`` is the command's (at most the task's time limit less 5 s): a command
  that exceeds it is killed and the call raises ``ExecTimeoutError``. A cell that fails
  otherwise (its ``/work`` over the task's ``session.max_mb``: ``output_rejected``, and
  ``/work`` stays as it was) raises ``ExecTransportError`` with the cell's status, reason and
  stderr tail in its context; a cell the service refuses (the session's ``max_cells`` reached,
  the session expired) raises it with the client's typed error as its cause. **Each exec is
  a fresh process in a fresh sandbox**: only ``/work`` carries over (no shell state, no
  background servers, ``/tmp`` empty, and no symlinks: checkpoints refuse them), and every
  call costs a cell of the task's ``session.max_cells``. The manifest's environment is
  passed to the command in the cell's code, which the service records: no secrets there.
- **``read`` and ``write``** are cells that move the bytes base64-encoded: a read in pieces
  the task's output can carry, a write in pieces its ``max_code_bytes`` can carry, appended to
  a hidden ``.<name>.agentjail-<id>.part`` file beside the target that the last piece checks
  (SHA-256) and renames over it (a failed piece removes it; an interrupted client may leave
  it). A file larger than ``max_file_bytes`` (options; 4 MiB by
  default) is refused (``WorkspaceArchiveReadError`` / ``WorkspaceArchiveWriteError`` with
  ``context["reason"] == "file_too_large"``). Paths are confined as by the SDK's own
  providers: the SDK's path policy refuses ``..`` and absolute paths outside the root
  (``InvalidManifestPathError``), and inside the cell the path's real path (symlinks
  resolved) must still be under the root or a granted path, else ``InvalidManifestPathError``
  too.
- **Workspace save and restore are agentjail checkpoints, not tar archives.** Every cell
  ends with a checkpoint of ``/work``; ``persist_workspace`` forks the session at its head
  into a *parked* session that runs nothing and keeps that checkpoint, and returns a small
  reference (``AGENTJAIL_WORKSPACE_REF_V1``: the parked session's id, the task and the
  checkpoint's digest; signed by nobody). The SDK stores those bytes where its snapshot
  says (``LocalSnapshotSpec``: a file), as it does for Modal's snapshot references.
  ``hydrate_workspace`` forks the parked session, checks that the fork's workspace digest and
  task are the reference's, and makes the fork this session's backend (the previous one is
  closed). A reference that is not agentjail's (a tar archive), malformed, of another task, of
  a session the caller may not see (another tenant's or actor's: the service answers 404 as
  for none), of a session that ended, or whose digest does not match, is refused with
  :class:`WorkspaceReferenceRefused` (a ``WorkspaceArchiveWriteError``; ``reason`` says which)
  and nothing changes. Limits: a reference is restorable while its parked session is open,
  that is until the original session's ``expires_at`` (the task's
  ``session.lifetime_seconds``; a fork never extends it), and a fork counts the cells of its
  ancestors toward the task's ``max_cells``. Every persist opens one parked session; they end
  at expiry (or ``DELETE`` them). ``stop()`` persists only when the run config gives a
  snapshot (``SandboxRunConfig(snapshot=LocalSnapshotSpec(...))``); the SDK's workspace
  fingerprint (a helper script installed in ``/tmp``) is not computed.
- **Lifecycle.** The agentjail session is opened by the first operation that needs one, so a
  restore from a snapshot adopts the fork without opening another. ``shutdown()`` and the
  client's ``delete()`` end it (``DELETE``); ``resume(state)`` reattaches to it while it is
  open, and otherwise restores the snapshot into a new one. Cells run one at a time (the
  SDK's concurrent calls wait their turn).
- **Not supported:** PTY sessions (``supports_pty()`` is false: the SDK's shell tool runs
  one-shot commands, and ``write_stdin`` has nothing to write to), ``user=`` / ``run_as``
  and manifest users or groups (every command runs as the sandbox's one unprivileged user),
  mounts (manifest ``Mount`` entries, host-path grants), exposed ports, live sessions (a task
  with ``session.interpreter``: their checkpoints are not per cell), network beyond what the
  task allows.

What agentjail adds: every command runs inside the task's boundary (namespaces, Landlock,
seccomp, cgroup limits, no network unless the task allows it), each cell is a run with its
own signed receipt in the session's chain, and ``/work`` is checked and checkpointed by the
service after every cell.

The function tool
-----------------

:class:`AgentjailPython` runs the model's Python code as cells of one agentjail session:

>>> from agents import Agent, Runner
>>> from agentjail.integrations.openai_agents import AgentjailPython
>>> async with await AgentjailPython.open("agent", [data]) as python:   # doctest: +SKIP
...     agent = Agent(name="analyst", tools=[python.tool], model=...)
...     result = await Runner.run(agent, "Which region has the most revenue?")

A call is one cell: a fresh Python process in the sandbox whose working directory is the
session's ``/work``. Files carry over between calls (the service checkpoints ``/work``);
variables do not, and nothing is pickled. The tool's output is the cell's stdout, the value of
a last expression, and after a failure its status and stderr tail; a failed cell is an output
the model reads, not an exception. The tool call's ``call_id`` makes the cell execute-once.
Calls of one model turn run one after the other (a session runs one cell at a time).
Workspace save and restore map onto the session's checkpoints: every cell ends with one
(``Cell.workspace_after``), and :meth:`AgentjailPython.fork` gives a tool on a new session that
starts from the workspace as a given cell left it.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import io
import json
import re
import secrets
import uuid
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from agents import FunctionTool
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.tool_context import ToolContext

from .._async_client import AsyncClient
from .._core import InputRef
from .._errors import AgentjailError, APIError, Gone, NotFound, SessionClosed, SessionExpired
from .._models import TaskView
from .._run import Cell
from .._session import AsyncSession
from . import _cell

__all__ = [
    "AgentjailPython",
    "AgentjailSandboxClient",
    "AgentjailSandboxClientOptions",
    "AgentjailSandboxSession",
    "AgentjailSandboxSessionState",
    "WorkspaceReferenceRefused",
    "WORKSPACE_REF_MAGIC",
]


class AgentjailPython:
    """An agentjail session and the function tool (:attr:`tool`) that runs code in it. Made
    by :meth:`open` (a new session) or :meth:`attach` (an open one, not ended by
    :meth:`aclose`); ``async with`` ends what it opened."""

    def __init__(
        self,
        client: AsyncClient,
        session: AsyncSession,
        tasks: Sequence[TaskView],
        *,
        name: str = "python",
        timeout: Optional[float] = None,
        owns_session: bool = False,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.session = session
        self._tasks = list(tasks)
        self._output = _cell.output_path(tasks, session.task)
        self._timeout = timeout
        self._owns_session, self._owns_client = owns_session, owns_client
        self._lock = asyncio.Lock()
        #: Every cell the tool ran, in order.
        self.cells: List[Cell] = []
        #: The function tool to give an ``Agent``: ``Agent(tools=[python.tool], ...)``.
        self.tool = FunctionTool(
            name=name,
            description=_cell.description(tasks, session.task),
            params_json_schema={
                "type": "object",
                "properties": {
                    "code": {
                        "type": "string",
                        "description": "Python source to run; print what you want to see.",
                    }
                },
                "required": ["code"],
                "additionalProperties": False,
            },
            on_invoke_tool=self._invoke,
            strict_json_schema=True,
        )

    @classmethod
    async def open(
        cls,
        task: str,
        inputs: Sequence[InputRef] = (),
        *,
        client: Optional[AsyncClient] = None,
        name: str = "python",
        timeout: Optional[float] = None,
    ) -> "AgentjailPython":
        """Opens a session of ``task`` on ``inputs`` (``client`` defaults to
        ``agentjail.AsyncClient()``: ``$AGENTJAIL_URL``, ``$AGENTJAIL_TOKEN``)."""
        owns_client = client is None
        c = client or AsyncClient()
        try:
            tasks = await c.tasks()
            _cell.output_path(tasks, task)  # refused before a session is opened
            session = await c.open_session(task, inputs)
        except BaseException:
            if owns_client:
                await c.aclose()
            raise
        return cls(
            c,
            session,
            tasks,
            name=name,
            timeout=timeout,
            owns_session=True,
            owns_client=owns_client,
        )

    @classmethod
    async def attach(
        cls, session: AsyncSession, *, name: str = "python", timeout: Optional[float] = None
    ) -> "AgentjailPython":
        """A tool on an open session (left open by :meth:`aclose`)."""
        return cls(
            session._client, session, await session._client.tasks(), name=name, timeout=timeout
        )

    async def run(self, code: str, *, call_id: Optional[str] = None) -> Cell:
        """Runs ``code`` as the session's next cell (after the cell of any call still
        running); ``call_id`` (the tool call's id) makes it execute-once."""
        program = _cell.program(code, self._output)
        rid = _cell.request_id("openai-agents", call_id, program)
        async with self._lock:
            cell = await _cell.aretrying(
                lambda: self.session.run(program, request_id=rid, timeout=self._timeout)
            )
            self.cells.append(cell)
        return cell

    async def _invoke(self, ctx: ToolContext[Any], arguments: str) -> str:
        try:
            code = json.loads(arguments)["code"]
            if not isinstance(code, str):
                raise TypeError("code is not a string")
        except (ValueError, KeyError, TypeError) as e:
            return 'invalid arguments (expected {"code": "..."}): %s' % e
        return _cell.observation(await self.run(code, call_id=ctx.tool_call_id))

    async def fork(self, *, cell: Optional[int] = None) -> "AgentjailPython":
        """A tool on a new session that starts from the workspace as ``cell`` left it
        (default: the last checkpoint): a restore point. :meth:`aclose` ends it."""
        forked = await self.client.fork_session(self.session.session_id, cell=cell)
        return AgentjailPython(
            self.client,
            forked,
            self._tasks,
            name=self.tool.name,
            timeout=self._timeout,
            owns_session=True,
        )

    async def aclose(self) -> None:
        """Ends the session (when this opened it) and closes the client (when it made it)."""
        try:
            if self._owns_session and self.session.state == "open":
                await self.session.close()
        finally:
            if self._owns_client:
                await self.client.aclose()

    async def __aenter__(self) -> "AgentjailPython":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# --- The sandbox provider --------------------------------------------------------------------

#: The first line of a workspace reference (what :meth:`AgentjailSandboxSession.persist_workspace`
#: returns and :meth:`AgentjailSandboxSession.hydrate_workspace` accepts).
WORKSPACE_REF_MAGIC = b"AGENTJAIL_WORKSPACE_REF_V1\n"
_MAX_REF_BYTES = 4096
_SESSION_ID = re.compile(r"^ses_[0-9a-f]{32}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_WORKSPACE_ROOT = "/work"
#: The largest file ``read`` or ``write`` moves unless the options say otherwise.
DEFAULT_MAX_FILE_BYTES = 4 * 1024 * 1024
_SDK_DEFAULT_ROOT = "/workspace"
#: What a report's JSON and the call's fields take beyond the base64 payload, at most.
_REPORT_OVERHEAD = 1024
#: Seconds of a cell's time limit kept for the program around the command.
_EXEC_MARGIN_S = 5.0

# The cell that runs one command (`exec`). `__AGENTJAIL_CALL__` becomes a literal of a JSON
# object {nonce, argv, cwd, env, timeout, budget, report}. Its stdout is not used: the report
# (exit code, both streams base64, as much as `budget` bytes of them) goes to the task's output
# file, after every other process of the sandbox is gone: not only the command's process
# group, but any process it left in a session of its own, which could otherwise read the
# nonce from this code and rename a report of its own over the output file after this one's.
# `kill(-1)` reaches every process of the sandbox's pid namespace but its init and this one;
# it is repeated until none but zombies is left, and the report is then written to a fresh
# file (whatever a killed process left at its path is removed first, never followed).
_EXEC_PROGRAM = r'''import base64, json, os, signal, subprocess, tempfile, time
call = json.loads(__AGENTJAIL_CALL__)
report = {"op": "exec", "nonce": call["nonce"], "timed_out": False}
env = dict(os.environ)
env.update(call["env"])
cwd = call["cwd"] if os.path.isdir(call["cwd"]) else "/"
out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def others_alive():
    me, alive = os.getpid(), []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in (1, me):
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(p)
    return alive


def kill_the_rest():
    for _ in range(500):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        if not others_alive():
            return True
        time.sleep(0.01)
    return False


try:
    proc = subprocess.Popen(call["argv"], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=err, start_new_session=True)
except OSError as e:
    code = 127 if isinstance(e, FileNotFoundError) else 126
    err.write(("%s: %s\n" % (call["argv"][0], e.strerror or e)).encode())
else:
    try:
        code = proc.wait(timeout=call["timeout"])
    except subprocess.TimeoutExpired:
        report["timed_out"] = True
        kill_group(proc.pid)
        code = proc.wait()
    kill_group(proc.pid)
    if code < 0:
        code = 128 - code
report["exit_code"] = code
if not kill_the_rest():
    report = {"op": "exec", "nonce": call["nonce"], "error": "processes outlived the command"}
sizes = [f.seek(0, 2) for f in (out, err)]
budget = call["budget"]
take_out = min(sizes[0], max(budget // 2, budget - sizes[1]))
take_err = min(sizes[1], budget - take_out)
for name, f, size, take in (("stdout", out, sizes[0], take_out),
                            ("stderr", err, sizes[1], take_err)):
    f.seek(0)
    report[name] = base64.b64encode(f.read(take)).decode()
    report[name + "_bytes"] = size
try:
    os.unlink(call["report"])
except FileNotFoundError:
    pass
fd = os.open(call["report"], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
with os.fdopen(fd, "w") as f:
    json.dump(report, f)
'''

# The cell that reads `length` bytes at `offset` of a regular file whose real path (symlinks
# resolved) is under one of `roots`.
_READ_PROGRAM = r'''import base64, json, os, stat
call = json.loads(__AGENTJAIL_CALL__)
report = {"op": "read", "nonce": call["nonce"]}


def inside(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


try:
    real = os.path.realpath(call["path"])
    if not inside(real, [os.path.realpath(r) for r in call["roots"]]):
        report["error"] = "escape_root"
        report["resolved"] = real
    else:
        st = os.stat(real)
        if stat.S_ISDIR(st.st_mode):
            report["error"] = "is_a_directory"
        elif not stat.S_ISREG(st.st_mode):
            report["error"] = "not_a_file"
        else:
            with open(real, "rb") as f:
                f.seek(call["offset"])
                data = f.read(call["length"])
            report["size"] = st.st_size
            report["data"] = base64.b64encode(data).decode()
except (FileNotFoundError, NotADirectoryError):
    report["error"] = "not_found"
except OSError as e:
    report["error"] = "os_error"
    report["detail"] = str(e)[:500]
with open(call["report"], "w") as f:
    json.dump(report, f)
'''

# The cell that writes one piece of a file: appended at `offset` to the hidden `part` file
# beside the target (created for the first piece); the last piece checks the whole part's
# SHA-256 and renames it over the target (refused when `exclusive` and the target exists).
# The deepest existing ancestor of the target's folder, and that folder once made, must have
# their real path under one of `roots`.
_WRITE_PROGRAM = r'''import base64, hashlib, json, os
call = json.loads(__AGENTJAIL_CALL__)
report = {"op": "write", "nonce": call["nonce"]}


def inside(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


try:
    target = call["path"]
    parent = os.path.dirname(target)
    roots = [os.path.realpath(r) for r in call["roots"]]
    existing = parent
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not inside(os.path.realpath(existing), roots):
        report["error"] = "escape_root"
    else:
        os.makedirs(parent, exist_ok=True)
        if not inside(os.path.realpath(parent), roots):
            report["error"] = "escape_root"
        elif call["exclusive"] and os.path.lexists(target):
            report["error"] = "exists"
        elif os.path.isdir(target) and not os.path.islink(target):
            report["error"] = "is_a_directory"
        else:
            part = os.path.join(parent, call["part"])
            with open(part, "ab" if call["offset"] else "wb") as f:
                if f.tell() != call["offset"]:
                    report["error"] = "offset_mismatch"
                else:
                    f.write(base64.b64decode(call["data"]))
            if "error" not in report and call["final"]:
                digest = hashlib.sha256()
                with open(part, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                if digest.hexdigest() != call["sha256"]:
                    report["error"] = "digest_mismatch"
                else:
                    os.replace(part, target)
            if "error" in report:
                try:
                    os.unlink(part)
                except OSError:
                    pass
            else:
                report["written"] = True
except OSError as e:
    report["error"] = "os_error"
    report["detail"] = str(e)[:500]
with open(call["report"], "w") as f:
    json.dump(report, f)
'''


def _program(template: str, call: Mapping[str, Any]) -> str:
    return template.replace("__AGENTJAIL_CALL__", repr(json.dumps(call)), 1)


def _b64(data: Any) -> bytes:
    return base64.b64decode(data) if isinstance(data, str) else b""


class WorkspaceReferenceRefused(WorkspaceArchiveWriteError):
    """:meth:`AgentjailSandboxSession.hydrate_workspace` refused a workspace reference, and the
    session's workspace did not change. ``reason`` says why: ``not_a_reference`` (not bytes
    that :meth:`AgentjailSandboxSession.persist_workspace` makes, e.g. a tar archive),
    ``malformed``, ``other_task``, ``not_found`` (no such session for this caller: another
    tenant's or actor's, or none), ``source_ended`` (the parked session was closed or has
    expired, or its checkpoint is gone) or ``digest_mismatch`` (the checkpoint is not the one
    the reference names). A subclass of the SDK's ``WorkspaceArchiveWriteError``."""

    def __init__(
        self, reason: str, detail: str, *, cause: Optional[BaseException] = None
    ) -> None:
        super().__init__(
            path=Path(_WORKSPACE_ROOT),
            context={"reason": reason, "detail": detail},
            cause=cause,
            retryable=False,
            message="agentjail refused the workspace reference (%s): %s" % (reason, detail),
        )
        #: Why (see the class).
        self.reason = reason


class AgentjailSandboxClientOptions(BaseSandboxClientOptions):
    """What :meth:`AgentjailSandboxClient.create` opens: a session of ``task`` (a code task
    whose sessions are not live, with a JSON output) on ``inputs`` (input ids, or
    :class:`agentjail.Input` objects). ``cell_timeout`` bounds the wait for one cell's answer
    (``None``: the cell's own time limit bounds it); ``max_file_bytes`` is the largest file
    ``read`` or ``write`` moves (in pieces, each a cell)."""

    type: Literal["agentjail"] = "agentjail"
    task: str
    inputs: Tuple[str, ...] = ()
    cell_timeout: Optional[float] = None
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES

    def __init__(
        self,
        task: str,
        inputs: Sequence[InputRef] = (),
        *,
        cell_timeout: Optional[float] = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        type: Literal["agentjail"] = "agentjail",
    ) -> None:
        super().__init__(
            type=type,
            task=task,
            inputs=tuple(i if isinstance(i, str) else i.input_id for i in inputs),
            cell_timeout=cell_timeout,
            max_file_bytes=max_file_bytes,
        )


class AgentjailSandboxSessionState(SandboxSessionState):
    """The SDK's serializable state of an :class:`AgentjailSandboxSession`: the options it was
    made with and the id of the agentjail session backing it (``None`` until the first cell).
    It holds no credential: the client's token stays with the :class:`AgentjailSandboxClient`."""

    type: Literal["agentjail"] = "agentjail"
    task: str
    inputs: Tuple[str, ...] = ()
    agentjail_session_id: Optional[str] = None
    cell_timeout: Optional[float] = None
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES


def _check_task(tasks: Sequence[TaskView], name: str) -> TaskView:
    found = [t for t in tasks if t["name"] == name]
    if not found:
        raise ValueError("the task %r is not one the caller may use" % name)
    task = found[0]
    if task.get("code") != "allowed":
        raise ValueError("the task %r runs a fixed program, not the code it is given" % name)
    if task.get("interpreter"):
        raise ValueError(
            "the task %r has live sessions (session.interpreter): their workspace is not "
            "checkpointed after each cell, which the sandbox provider maps save and restore "
            "onto; use a task without a resident interpreter" % name
        )
    if task.get("output_media_type") != "application/json":
        raise ValueError(
            "the task %r's output is not JSON: the sandbox provider's cells report through it"
            % name
        )
    if task["output_max_bytes"] < 4096 or (task.get("max_code_bytes") or 65536) < 8192:
        raise ValueError(
            "the task %r's output (output_max_bytes) must take at least 4096 bytes and its code "
            "(max_code_bytes) at least 8192 for the sandbox provider's cells" % name
        )
    return task


def _check_manifest(manifest: Optional[Manifest]) -> Manifest:
    manifest = manifest if manifest is not None else Manifest()
    if manifest.root == _SDK_DEFAULT_ROOT:
        manifest = manifest.model_copy(update={"root": _WORKSPACE_ROOT}, deep=True)
    if manifest.root.rstrip("/") != _WORKSPACE_ROOT:
        raise ValueError(
            "an agentjail sandbox's workspace is /work (what its sessions keep); the manifest's "
            "root is %r" % manifest.root
        )
    if manifest.users or manifest.groups:
        raise ValueError(
            "an agentjail sandbox runs every command as its one unprivileged user: manifest "
            "users and groups (and run_as) are not supported"
        )
    if manifest.mount_targets():
        raise ValueError("an agentjail sandbox has no mounts: the manifest has Mount entries")
    if any(g.host_path is not None for g in manifest.extra_path_grants):
        raise ValueError("an agentjail sandbox has no host paths: a path grant names host_path")
    return manifest


class AgentjailSandboxSession(BaseSandboxSession):
    """A session of the SDK's sandbox (``BaseSandboxSession``) backed by one agentjail session
    (non-live): ``exec``, ``read`` and ``write`` are cells, ``persist_workspace`` and
    ``hydrate_workspace`` move a reference to an agentjail checkpoint (the module's
    documentation says how, and what is not supported). Made by
    :class:`AgentjailSandboxClient`, which wraps it in the SDK's ``SandboxSession``."""

    state: AgentjailSandboxSessionState

    def __init__(
        self, *, state: AgentjailSandboxSessionState, client: AsyncClient, task: TaskView
    ) -> None:
        self.state = state
        self._client = client
        self._task = task
        self._session: Optional[AsyncSession] = None
        self._lock = asyncio.Lock()
        self._running = False
        #: Every cell this session ran, in order (the backing session changes on a restore).
        self.cells: List[Cell] = []

    # The agentjail session -------------------------------------------------------------------

    @property
    def agentjail_session(self) -> Optional[AsyncSession]:
        """The agentjail session backing this one now (``None`` before the first operation
        that needs one, and after :meth:`shutdown`)."""
        return self._session

    async def _ensure_backend_started(self) -> None:
        sid = self.state.agentjail_session_id
        if sid is None or self._session is not None:
            return
        try:
            session = await self._client.get_session(sid)
        except NotFound:
            session = None
        if session is not None and session.state == "open" and session.task == self.state.task:
            self._session = session
            self._set_start_state_preserved(True)
        else:
            self.state.agentjail_session_id = None
            self._set_start_state_preserved(False)

    async def _after_start(self) -> None:
        self._running = True

    async def _open(self) -> AsyncSession:
        """The backing session, opened now when there is none (call under the lock)."""
        if self._session is None:
            rid = "oai-sandbox-%s" % uuid.uuid4().hex
            self._session = await _cell.aretrying(
                lambda: self._client.open_session(
                    self.state.task, list(self.state.inputs), request_id=rid
                )
            )
            self.state.agentjail_session_id = self._session.session_id
        return self._session

    async def _run_cell(self, template: str, call: Dict[str, Any]) -> Tuple[Cell, Dict[str, Any]]:
        """Runs one cell of ``template`` on ``call``; returns it and its report (``{}`` when
        the cell did not end ``ok`` or its report is not this call's)."""
        nonce = secrets.token_hex(16)
        call = dict(call, nonce=nonce, report=self._task["output_path"])
        program = _program(template, call)
        limit = self._task.get("max_code_bytes") or 65536
        if len(program.encode()) > limit:
            raise ValueError(
                "the call does not fit the task's max_code_bytes (%d > %d bytes)"
                % (len(program.encode()), limit)
            )
        rid = "oai-sandbox-%s" % uuid.uuid4().hex
        async with self._lock:
            session = await self._open()
            cell = await _cell.aretrying(
                lambda: session.run(program, request_id=rid, timeout=self.state.cell_timeout)
            )
            self.cells.append(cell)
        report = cell.artifact if cell.ok else None
        if (
            not isinstance(report, dict)
            or report.get("nonce") != nonce
            or report.get("op") != call.get("op")
        ):
            return cell, {}
        return cell, report

    @staticmethod
    def _failure(cell: Cell) -> Dict[str, object]:
        workspace = cell.report.get("workspace")
        rejected = workspace.get("rejected") if isinstance(workspace, dict) else None
        return {
            "reason": "cell_failed",
            "cell": cell.cell,
            "status": cell.status,
            "cell_reason": cell.reason,
            "workspace_rejected": rejected,  # e.g. /work over session.max_mb (output_rejected)
            "stderr_tail": cell.stderr_tail[-2000:],
        }

    # exec ------------------------------------------------------------------------------------

    def _prepare_exec_command(
        self,
        *command: Union[str, Path],
        shell: Union[bool, List[str]],
        user: Union[str, User, None],
    ) -> List[str]:
        if user:
            raise ExecTransportError(
                command=[str(c) for c in command],
                message="an agentjail sandbox runs every command as its one unprivileged user; "
                "user= (run_as) is not supported",
                context={"reason": "user_not_supported"},
                retryable=False,
            )
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    async def _exec_internal(
        self, *command: Union[str, Path], timeout: Optional[float] = None
    ) -> ExecResult:
        """Runs ``command`` (an argv the SDK prepared) as one cell; see the module."""
        argv = [str(c) for c in command]
        seconds = float(self._task["limits"].get("seconds") or 30)
        cap = max(1.0, seconds - _EXEC_MARGIN_S)
        inner = cap if timeout is None else min(float(timeout), cap)
        budget = (self._task["output_max_bytes"] - _REPORT_OVERHEAD) // 4 * 3
        env = await self.state.manifest.environment.resolve()
        call = {
            "op": "exec",
            "argv": argv,
            "cwd": self.state.manifest.root,
            "env": env,
            "timeout": inner,
            "budget": budget,
        }
        try:
            cell, report = await self._run_cell(_EXEC_PROGRAM, call)
        except (APIError, AgentjailError, ValueError) as e:
            raise ExecTransportError(
                command=argv, cause=e, context={"reason": "agentjail", "detail": str(e)}
            ) from e
        if report.get("timed_out") or (not report and cell.status == "timeout"):
            raise ExecTimeoutError(command=argv, timeout_s=cap if timeout is None else timeout)
        code = report.get("exit_code")
        if not isinstance(code, int):
            raise ExecTransportError(
                command=argv,
                message="the cell that ran the command did not report (%s)" % cell.status,
                context=self._failure(cell),
            )
        stdout, stderr = _b64(report.get("stdout")), _b64(report.get("stderr"))
        notes = []
        for name, data in (("stdout", stdout), ("stderr", stderr)):
            total = report.get(name + "_bytes")
            if isinstance(total, int) and total > len(data):
                notes.append("%s: %d of %d bytes shown" % (name, len(data), total))
        if notes:
            stderr += ("\n[agentjail: output truncated; %s]\n" % "; ".join(notes)).encode()
        return ExecResult(stdout=stdout, stderr=stderr, exit_code=code)

    def supports_pty(self) -> bool:
        """False: a command is one cell, with no terminal and no stdin."""
        return False

    async def running(self) -> bool:
        """Whether the session was started (or reattached to an open agentjail session) and not
        shut down."""
        return self._running or self._session is not None

    # Files -----------------------------------------------------------------------------------

    def _roots(self, *, for_write: bool) -> List[str]:
        policy = self._workspace_path_policy()
        roots = [str(policy.sandbox_root())]
        grants = policy.extra_path_grant_rules()
        roots += [str(root) for root, read_only in grants if not (for_write and read_only)]
        return roots

    def _read_chunk(self, path: Path) -> int:
        room = self._task["output_max_bytes"] - _REPORT_OVERHEAD - 4 * len(str(path))
        return max(1024, room // 4 * 3)

    async def _read_prefix(self, path: Path, limit: Optional[int]) -> bytes:
        """The file's bytes (at most ``limit``; all of them, at most ``max_file_bytes``)."""
        target = self.normalize_path(path)
        chunk = self._read_chunk(target)
        data = bytearray()
        size: Optional[int] = None
        while True:
            want = chunk if limit is None else min(chunk, limit - len(data))
            call = {
                "op": "read",
                "path": str(target),
                "roots": self._roots(for_write=False),
                "offset": len(data),
                "length": want,
            }
            try:
                cell, report = await self._run_cell(_READ_PROGRAM, call)
            except (APIError, AgentjailError, ValueError) as e:
                raise WorkspaceArchiveReadError(
                    path=target, cause=e, context={"reason": "agentjail", "detail": str(e)}
                ) from e
            error = report.get("error")
            if error == "not_found":
                raise WorkspaceReadNotFoundError(path=target)
            if error == "escape_root":
                raise InvalidManifestPathError(
                    rel=str(path),
                    reason="escape_root",
                    context={"resolved_path": str(report.get("resolved", ""))},
                )
            if error is not None:
                raise WorkspaceArchiveReadError(
                    path=target, context={"reason": str(error), "detail": report.get("detail")}
                )
            if not report:
                raise WorkspaceArchiveReadError(path=target, context=self._failure(cell))
            now = report.get("size")
            if not isinstance(now, int) or (size is not None and now != size):
                raise WorkspaceArchiveReadError(
                    path=target, context={"reason": "changed_while_read", "size": now}
                )
            size = now
            if limit is None and size > self.state.max_file_bytes:
                raise WorkspaceArchiveReadError(
                    path=target,
                    context={
                        "reason": "file_too_large",
                        "size": size,
                        "max_file_bytes": self.state.max_file_bytes,
                    },
                )
            piece = _b64(report.get("data"))
            data += piece
            if not piece or len(data) >= size or (limit is not None and len(data) >= limit):
                return bytes(data)

    async def read(self, path: Path, *, user: Union[str, User, None] = None) -> io.IOBase:
        """The file's bytes, read in cells (at most ``max_file_bytes``); a path outside the
        workspace (or a granted path), also through a symlink, is ``InvalidManifestPathError``,
        a missing one ``WorkspaceReadNotFoundError``."""
        self._no_user(user, path, write=False)
        return io.BytesIO(await self._read_prefix(path, None))

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        return await self._read_prefix(path, max_bytes)

    def _no_user(self, user: Union[str, User, None], path: Path, *, write: bool) -> None:
        if user:
            context: Dict[str, object] = {"reason": "user_not_supported"}
            if write:
                raise WorkspaceArchiveWriteError(path=path, context=context)
            raise WorkspaceArchiveReadError(path=path, context=context)

    async def _write(self, path: Path, data: io.IOBase, *, exclusive: bool) -> None:
        payload = coerce_write_payload(path=path, data=data).stream.read(
            self.state.max_file_bytes + 1
        )
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceArchiveWriteError(path=path, context={"reason": "not_bytes"})
        payload = bytes(payload)
        target = self.normalize_path(path, for_write=True)
        if len(payload) > self.state.max_file_bytes:
            raise WorkspaceArchiveWriteError(
                path=target,
                context={
                    "reason": "file_too_large",
                    "size": len(payload),
                    "max_file_bytes": self.state.max_file_bytes,
                },
            )
        part = ".%s.agentjail-%s.part" % (target.name[:160], uuid.uuid4().hex[:16])
        digest = hashlib.sha256(payload).hexdigest()
        call: Dict[str, Any] = {
            "op": "write",
            "path": str(target),
            "roots": self._roots(for_write=True),
            "part": part,
            "exclusive": exclusive,
            "sha256": digest,
            "offset": 0,
            "final": False,
            "data": "",
        }
        # The largest piece whose program (base64, in a JSON literal) fits max_code_bytes.
        empty = _program(
            _WRITE_PROGRAM, dict(call, nonce="0" * 32, report=self._task["output_path"])
        )
        room = (self._task.get("max_code_bytes") or 65536) - len(empty.encode()) - 64
        chunk = room // 4 * 3
        if chunk < 1024:
            raise WorkspaceArchiveWriteError(path=target, context={"reason": "path_too_long"})
        offset = 0
        while True:
            piece = payload[offset : offset + chunk]
            final = offset + len(piece) >= len(payload)
            call.update(offset=offset, final=final, data=base64.b64encode(piece).decode())
            try:
                cell, report = await self._run_cell(_WRITE_PROGRAM, call)
            except (APIError, AgentjailError, ValueError) as e:
                raise WorkspaceArchiveWriteError(
                    path=target, cause=e, context={"reason": "agentjail", "detail": str(e)}
                ) from e
            error = report.get("error")
            if error == "exists":
                raise FileExistsError(errno.EEXIST, "file exists", str(target))
            if error == "escape_root":
                raise InvalidManifestPathError(rel=str(path), reason="escape_root")
            if error is not None or not report.get("written"):
                context = (
                    {"reason": str(error), "detail": report.get("detail")}
                    if report
                    else self._failure(cell)
                )
                if offset > 0:  # a part file may be left: remove it (best effort)
                    try:
                        await self.exec("rm", "-f", "--", str(target.parent / part), shell=False)
                    except Exception:
                        pass
                raise WorkspaceArchiveWriteError(path=target, context=context)
            offset += len(piece)
            if final:
                return

    async def write(
        self, path: Path, data: io.IOBase, *, user: Union[str, User, None] = None
    ) -> None:
        """Writes the file (its folders made), replacing what is there, in cells of at most the
        task's ``max_code_bytes`` (at most ``max_file_bytes`` in all); confined as
        :meth:`read`."""
        self._no_user(user, path, write=True)
        await self._write(path, data, exclusive=False)

    async def _write_new_file(
        self, path: Path, data: io.IOBase, *, user: Union[str, User, None] = None
    ) -> None:
        self._no_user(user, path, write=True)
        await self._write(path, data, exclusive=True)

    async def mkdir(
        self,
        path: Union[Path, str],
        *,
        parents: bool = False,
        user: Union[str, User, None] = None,
    ) -> None:
        """Makes a folder (a cell running ``mkdir``); the workspace root, which always exists,
        takes none."""
        target = self.normalize_path(path, for_write=True)
        if str(target) == str(self._workspace_path_policy().sandbox_root()):
            return
        await super().mkdir(target, parents=parents, user=user)

    # Save and restore ------------------------------------------------------------------------

    def _should_compute_snapshot_fingerprint_on_persist(self) -> bool:
        return False

    async def _clear_workspace_root_on_resume(self) -> None:
        # A restore replaces the backing session with a fork of the reference's checkpoint:
        # the current /work is not cleared (it is closed with its session).
        return

    async def persist_workspace(self) -> io.IOBase:
        """A reference to the workspace as it is now (not a tar archive): the session is forked
        at its head into a parked session that keeps the checkpoint; see the module."""
        root = Path(self.state.manifest.root)
        try:
            async with self._lock:
                session = await self._open()
                parked = await _cell.aretrying(
                    lambda: self._client.fork_session(
                        session.session_id, request_id="oai-park-%s" % uuid.uuid4().hex
                    )
                )
        except (APIError, AgentjailError) as e:
            raise WorkspaceArchiveReadError(
                path=root, cause=e, context={"reason": "agentjail", "detail": str(e)}
            ) from e
        ref = {
            "session_id": parked.session_id,
            "task": parked.task,
            "workspace_sha256": parked.workspace_sha256,
        }
        return io.BytesIO(WORKSPACE_REF_MAGIC + json.dumps(ref, sort_keys=True).encode())

    @staticmethod
    def _parse_ref(raw: bytes) -> Dict[str, Any]:
        if not raw.startswith(WORKSPACE_REF_MAGIC):
            raise WorkspaceReferenceRefused(
                "not_a_reference",
                "agentjail restores only its own workspace references "
                "(AGENTJAIL_WORKSPACE_REF_V1), not tar archives",
            )
        try:
            ref = json.loads(raw[len(WORKSPACE_REF_MAGIC) :].decode())
        except ValueError as e:
            raise WorkspaceReferenceRefused("malformed", "not JSON", cause=e) from e
        if (
            not isinstance(ref, dict)
            or set(ref) != {"session_id", "task", "workspace_sha256"}
            or not isinstance(ref["session_id"], str)
            or not _SESSION_ID.match(ref["session_id"])
            or not isinstance(ref["task"], str)
            or not (ref["workspace_sha256"] is None or _DIGEST.match(str(ref["workspace_sha256"])))
        ):
            raise WorkspaceReferenceRefused(
                "malformed", "expected {session_id, task, workspace_sha256}"
            )
        return ref

    async def _read_ref(self, data: io.IOBase) -> Dict[str, Any]:
        raw = data.read(_MAX_REF_BYTES + 1)
        if isinstance(raw, str):
            raw = raw.encode()
        if not isinstance(raw, (bytes, bytearray)):
            raise WorkspaceReferenceRefused("malformed", "not bytes")
        if len(raw) > _MAX_REF_BYTES:
            raise WorkspaceReferenceRefused(
                "not_a_reference", "%d bytes or more: not an agentjail reference" % len(raw)
            )
        return self._parse_ref(bytes(raw))

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Makes the workspace the one a reference of :meth:`persist_workspace` names: the
        reference's parked session is forked, the fork checked (task, digest) and adopted, the
        previous backing session closed. Anything else is :class:`WorkspaceReferenceRefused`."""
        ref = await self._read_ref(data)
        if ref["task"] != self.state.task:
            raise WorkspaceReferenceRefused(
                "other_task",
                "the reference is of the task %r, this sandbox's is %r"
                % (ref["task"], self.state.task),
            )
        async with self._lock:
            try:
                fork = await _cell.aretrying(
                    lambda: self._client.fork_session(
                        ref["session_id"], request_id="oai-restore-%s" % uuid.uuid4().hex
                    )
                )
            except NotFound as e:
                raise WorkspaceReferenceRefused(
                    "not_found",
                    "no session %s for this caller (another tenant's or actor's, or none)"
                    % ref["session_id"],
                    cause=e,
                ) from e
            except (SessionClosed, SessionExpired, Gone) as e:
                raise WorkspaceReferenceRefused(
                    "source_ended",
                    "the reference's session can no longer be forked: %s" % e,
                    cause=e,
                ) from e
            if fork.workspace_sha256 != ref["workspace_sha256"] or fork.task != self.state.task:
                try:
                    await fork.close()
                except (APIError, AgentjailError):
                    pass
                raise WorkspaceReferenceRefused(
                        "digest_mismatch",
                        "the session's checkpoint is %s, the reference names %s"
                        % (fork.workspace_sha256, ref["workspace_sha256"]),
                    )
            previous, self._session = self._session, fork
            self.state.agentjail_session_id = fork.session_id
        if previous is not None:
            try:
                await previous.close()
            except (APIError, AgentjailError):
                pass

    async def _live_workspace_matches_snapshot_on_resume(self) -> bool:
        # A reattached session's workspace is the snapshot's when its head is the checkpoint
        # the reference names (no cell is run to tell).
        if self._session is None:
            return False
        try:
            stream = await self.state.snapshot.restore(dependencies=self.dependencies)
            try:
                ref = await self._read_ref(stream)
            finally:
                stream.close()
            head = await self._session.refresh()
        except Exception:
            return False
        return head.state == "open" and head.workspace_sha256 == ref["workspace_sha256"]

    # Ending ----------------------------------------------------------------------------------

    async def _shutdown_backend(self) -> None:
        await self._close_backend()

    async def _close_backend(self) -> None:
        """Ends the backing agentjail session (``DELETE``; idempotent)."""
        async with self._lock:
            session, self._session = self._session, None
            self._running = False
        if session is not None:
            try:
                await session.close()
            except NotFound:
                pass


class AgentjailSandboxClient(BaseSandboxClient[AgentjailSandboxClientOptions]):
    """The OpenAI Agents SDK's sandbox client (``SandboxRunConfig(client=...)``) for
    agentjail: its sessions (:class:`AgentjailSandboxSession`) are agentjail sessions of the
    task its options name. ``client`` is an :class:`agentjail.AsyncClient` (default: one from
    ``$AGENTJAIL_URL`` and ``$AGENTJAIL_TOKEN``, closed by :meth:`aclose`)."""

    backend_id = "agentjail"
    supports_default_options = False

    def __init__(
        self,
        client: Optional[AsyncClient] = None,
        *,
        instrumentation: Optional[Instrumentation] = None,
        dependencies: Optional[Dependencies] = None,
    ) -> None:
        self._owns_client = client is None
        #: The agentjail client every session of this one uses.
        self.client = client or AsyncClient()
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = dependencies

    async def _task(self, name: str) -> TaskView:
        return _check_task(await self.client.tasks(), name)

    async def create(
        self,
        *,
        snapshot: Union[SnapshotSpec, SnapshotBase, None] = None,
        manifest: Optional[Manifest] = None,
        options: AgentjailSandboxClientOptions,
    ) -> SandboxSession:
        """A new session (its agentjail session is opened by its first cell). Refuses a task
        that cannot back one (a fixed program, live sessions, a non-JSON or too small output)
        and a manifest with another root than ``/work`` (the SDK's default root becomes
        ``/work``), users, groups, mounts or host paths."""
        if options is None:
            raise ValueError("AgentjailSandboxClient needs AgentjailSandboxClientOptions(task)")
        task = await self._task(options.task)
        manifest = self._validate_manifest_for_create(_check_manifest(manifest))
        session_id = uuid.uuid4()
        state = AgentjailSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            task=options.task,
            inputs=options.inputs,
            cell_timeout=options.cell_timeout,
            max_file_bytes=options.max_file_bytes,
        )
        inner = AgentjailSandboxSession(state=state, client=self.client, task=task)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Ends the session's agentjail session (idempotent); its parked sessions (the
        workspace references) stay until they expire."""
        inner = session._inner
        if not isinstance(inner, AgentjailSandboxSession):
            raise TypeError("AgentjailSandboxClient.delete expects an AgentjailSandboxSession")
        await inner._close_backend()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """A session from a saved state: on its agentjail session while that is open, else on
        a new one into which ``start()`` restores the state's snapshot (when it has one)."""
        if not isinstance(state, AgentjailSandboxSessionState):
            raise TypeError("AgentjailSandboxClient.resume expects an AgentjailSandboxSessionState")
        state.assert_path_grants_rebound()
        task = await self._task(state.task)
        _check_manifest(state.manifest)
        inner = AgentjailSandboxSession(state=state, client=self.client, task=task)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: Dict[str, object]) -> SandboxSessionState:
        """The state :meth:`serialize_session_state` wrote (``RunState`` round trips)."""
        return self._deserialize_session_state_payload(payload, AgentjailSandboxSessionState)

    async def aclose(self) -> None:
        """Closes the agentjail client when this made it."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> "AgentjailSandboxClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

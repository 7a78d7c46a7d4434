"""What the code tools of the agent frameworks share (``agentjail.integrations.langchain``,
``agentjail.integrations.openai_agents``): the program a tool call runs as (one cell of a
session), its request id, the observation the model reads back, and the tool's description.

No pickling anywhere: a call is a fresh Python process in the sandbox, and what carries over
between calls is the session's ``/work`` (the cell's working directory), checkpointed by the
service. The framework's own state (a LangGraph checkpoint, an Agents SDK run state) holds
nothing but text: the calls and their observations.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Awaitable, Callable, List, Optional, Sequence, TypeVar

from .._errors import TransportError, TransportTimeout
from .._models import TaskView
from .._run import Cell

# The program each tool call runs as, in the sandbox; `__AGENTJAIL_CALL__` is replaced by a
# JSON literal {"code", "output"}. It runs the model's code in a fresh namespace from /work,
# prints nothing of its own to stdout, writes a small report (the last expression's repr, the
# error) to the task's output file, and exits 1 after an error (traceback on stderr).
TEMPLATE = r"""import ast as _aj_ast, json as _aj_json, os as _aj_os, sys as _aj_sys
import traceback as _aj_tb

_aj_call = _aj_json.loads(__AGENTJAIL_CALL__)
_aj_report = {"value": None, "error": None}
_aj_status = 0
if _aj_os.path.isdir("/work"):
    _aj_os.chdir("/work")
try:
    _aj_tree = _aj_ast.parse(_aj_call["code"], "<tool call>")
    _aj_last = None
    if _aj_tree.body and isinstance(_aj_tree.body[-1], _aj_ast.Expr):
        _aj_last = _aj_ast.Expression(_aj_tree.body.pop().value)
    _aj_ns = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(_aj_tree, "<tool call>", "exec"), _aj_ns)
    if _aj_last is not None:
        _aj_value = eval(compile(_aj_last, "<tool call>", "eval"), _aj_ns)
        if _aj_value is not None:
            _aj_report["value"] = repr(_aj_value)[:4000]
except SystemExit as _aj_e:
    if _aj_e.code not in (None, 0):
        _aj_status = 1
        _aj_report["error"] = "SystemExit: %s" % (_aj_e.code,)
except BaseException as _aj_e:  # noqa: B036 (the model's code may raise anything)
    _aj_status = 1
    _aj_report["error"] = ("%s: %s" % (type(_aj_e).__name__, _aj_e))[:2000]
    _aj_tb.print_exception(type(_aj_e), _aj_e, _aj_e.__traceback__.tb_next)
_aj_sys.stdout.flush()
with open(_aj_call["output"], "w") as _aj_f:
    _aj_json.dump(_aj_report, _aj_f)
_aj_sys.exit(_aj_status)
"""

T = TypeVar("T")

#: The most of a cell's stdout the observation carries (its head and tail beyond that).
MAX_OBSERVATION = 8000


def program(code: str, output_path: str) -> str:
    """The cell's program for one tool call of ``code``."""
    call = json.dumps({"code": code, "output": output_path})
    return TEMPLATE.replace("_aj_json.loads(__AGENTJAIL_CALL__)", "_aj_json.loads(%r)" % call, 1)


def request_id(prefix: str, call_id: Optional[str], program: str) -> str:
    """The cell's request id: from the framework's tool-call id when there is one (a retried
    call, the same program under the same id, then returns the recorded cell and runs
    nothing), else a fresh one. Only the characters a request id may have are kept."""
    digest = hashlib.sha256(program.encode()).hexdigest()[:16]
    if not call_id:
        return "%s-%s-%s" % (prefix, uuid.uuid4().hex, digest)
    safe = re.sub(r"[^A-Za-z0-9._:-]", "_", call_id)[:80]
    return "%s-%s-%s" % (prefix, safe, digest)


def output_path(tasks: Sequence[TaskView], task: str) -> str:
    """The task's output file (the cell's report goes there); ``ValueError`` when the caller
    may not use the task."""
    found = [t for t in tasks if t["name"] == task]
    if not found:
        raise ValueError("the task %r is not one the caller may use" % task)
    return found[0]["output_path"]


def description(tasks: Sequence[TaskView], task: str) -> str:
    """What the model is told about the tool: fresh process, what persists, the inputs."""
    found = [t for t in tasks if t["name"] == task]
    mounts: List[str] = [i["mount"] for i in found[0]["inputs"]] if found else []
    text = (
        "Runs Python code in an isolated sandbox and returns its stdout, the value of a last "
        "expression, or the error's traceback. Each call is a fresh Python process: variables "
        "do not carry over between calls, files do. The working directory is /work; what you "
        "write there is kept for the next calls. No network."
    )
    if mounts:
        text += " Input files (read-only): %s." % ", ".join(mounts)
    return text


def retrying(run: Callable[[], Cell]) -> Cell:
    """Runs the cell, sending it again (the same request id: execute-once) after a transport
    failure, at most three times."""
    for attempt in range(3):
        try:
            return run()
        except (TransportError, TransportTimeout):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


async def aretrying(run: Callable[[], Awaitable[T]]) -> T:
    """:func:`retrying`, awaited (for any call whose request id makes it execute-once: a
    cell, a session opened or forked)."""
    for attempt in range(3):
        try:
            return await run()
        except (TransportError, TransportTimeout):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def observation(cell: Cell) -> str:
    """The text the model reads back: the cell's status, its stdout, the last expression's
    value, and after a failure the error and the stderr tail (untrusted text all)."""
    parts = ["[agentjail cell %d: %s]" % (cell.cell, cell.status)]
    out = cell.stdout
    if len(out) > MAX_OBSERVATION:
        half = MAX_OBSERVATION // 2
        out = "%s\n[… %d characters omitted …]\n%s" % (out[:half], len(out) - 2 * half, out[-half:])
    if out:
        parts.append(out.rstrip("\n"))
    report = cell.artifact if cell.ok else None
    if isinstance(report, dict) and report.get("value") is not None:
        parts.append("Out: %s" % report["value"])
    if not cell.ok:
        if cell.reason:
            parts.append("reason: %s" % cell.reason)
        for d in cell.denials:
            parts.append("denied: %s" % json.dumps(d, sort_keys=True))
        tail = cell.stderr_tail.strip()
        if tail:
            parts.append("stderr:\n%s" % tail)
    return "\n".join(parts)

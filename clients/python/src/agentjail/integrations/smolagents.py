"""A smolagents executor that runs each code step of a ``CodeAgent`` as a cell of one
agentjail session (``pip install smolagents``; tested with the version ``.ci/run`` pins).

>>> from smolagents import CodeAgent
>>> from agentjail.integrations.smolagents import AgentjailExecutor
>>> executor = AgentjailExecutor(task="agent", inputs=[client.upload("data.csv")])  # doctest: +SKIP
>>> agent = CodeAgent(tools=[], model=model, executor=executor)                    # doctest: +SKIP

On a task whose sessions are live (``session.interpreter = "python"``: docs/api.md, "Live
sessions"), each step runs in the session's resident interpreter: variables, imports,
functions, lambdas and generators stay as they are between steps, and nothing is pickled or
defined again (the step's report comes back as the last line of its stdout). Otherwise:

State between steps lives in the session's ``/work``, bounded by the task's
``session.max_mb``: the step's picklable globals (dill when the sandbox's Python has it, else
pickle; what cannot be kept is named in the logs the agent sees), the source of its ``def``
and ``class`` statements (defined again, not replayed), and its imports. A cell is a fresh
process: no earlier step runs again, nothing is pickled into the output. Each step is one cell
(execute-once: a transport retry of a step returns the recorded cell); the final answer comes
back through smolagents' ``final_answer`` tool, as with its remote executors, in the task's
verified output file. ``additional_imports`` are checked against the sandbox's Python, never
installed: the missing ones are reported in the first step's logs.

The task must allow code (``code = "allowed"``), take the session's inputs, and have a JSON
output with no schema (or one that admits the executor's report): the executor writes its
report to the task's output file.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.serialization import SafeSerializer
from smolagents.tools import Tool, get_tools_definition_code
from smolagents.utils import AgentError

from .._client import Client
from .._core import InputRef
from .._errors import APIError
from .._run import Cell
from .._session import Session
from . import _cell
from ._step import LIVE_MARKER, LIVE_TEMPLATE, TEMPLATE

__all__ = ["AgentjailExecutor"]

#: Where the executor keeps state in the session's workspace.
STATE_FILE = "/work/.agentjail_state.pkl"


class AgentjailExecutor(RemotePythonExecutor):  # type: ignore[misc]
    """Runs a ``CodeAgent``'s steps in an agentjail session: ``CodeAgent(...,
    executor=AgentjailExecutor(task="agent", inputs=[...]))``.

    ``client`` defaults to ``agentjail.Client()`` (``$AGENTJAIL_URL``, ``$AGENTJAIL_TOKEN``);
    ``task`` and ``inputs`` open the session (or give an open ``session``: it is then not
    closed by :meth:`cleanup`). ``additional_imports`` (the agent's
    ``additional_authorized_imports``) are checked, not installed. ``timeout`` bounds each
    step's wait in seconds (the task's own time limit ends the cell anyway).
    """

    def __init__(
        self,
        additional_imports: Sequence[str] = (),
        logger: Optional[AgentLogger] = None,
        *,
        client: Optional[Client] = None,
        task: Optional[str] = None,
        inputs: Sequence[InputRef] = (),
        session: Optional[Session] = None,
        timeout: Optional[float] = None,
        allow_pickle: bool = False,
    ) -> None:
        super().__init__(
            list(additional_imports), logger or AgentLogger(level=LogLevel.INFO), allow_pickle
        )
        self._owns_client = client is None and session is None
        self.client: Client = session._client if session is not None else client or Client()
        if session is None:
            if task is None:
                raise ValueError("AgentjailExecutor needs task= (or an open session=)")
            try:
                session = self.client.session(task, inputs)
            except BaseException:
                if self._owns_client:
                    self.client.close()
                raise
            self._owns_session = True
        else:
            self._owns_session = False
        self.session: Session = session
        self.timeout = timeout
        found = [t for t in self.client.tasks() if t["name"] == self.session.task]
        if not found:
            raise ValueError("the task %r is not one the caller may use" % self.session.task)
        self._output_path = found[0]["output_path"]
        #: The session keeps a resident interpreter (the task's ``session.interpreter``): each
        #: step runs in its globals, and nothing is pickled or defined again.
        self.live: bool = found[0].get("interpreter") is not None
        self._steps = 0
        self._pending_tools: Optional[str] = None
        self._pending_variables: Optional[str] = None
        self._pending_imports: List[str] = [
            i for i in self.additional_imports if i != "*" and not i.endswith(".*")
        ]
        #: Every cell this executor ran, in order.
        self.cells: List[Cell] = []
        #: The last step's ``(program, request_id)``: sent again, it returns the recorded cell.
        self.last_step: Optional[Tuple[str, str]] = None
        self.logger.log(
            "agentjail session %s (task %s)" % (self.session.session_id, self.session.task),
            level=LogLevel.INFO,
        )

    # -- smolagents' executor interface --------------------------------------------------

    def send_tools(self, tools: Dict[str, Tool]) -> None:
        """Makes the tools callable in the sandbox (``final_answer`` raises, as with
        smolagents' remote executors). Nothing runs now: the next step's cell writes their
        definitions to ``/work`` once, and every later step defines them again."""
        if "final_answer" in tools:
            self._patch_final_answer_with_exception(tools["final_answer"])
        for tool in tools.values():
            for pkg in tool.to_dict().get("requirements", []):
                if pkg != "smolagents" and pkg not in self._pending_imports:
                    self._pending_imports.append(pkg)
        code = get_tools_definition_code(tools) or None
        if code is not None:
            # smolagents hoists every import of the tools' code (numpy and PIL for
            # final_answer's serializer, which imports them lazily) ahead of their
            # definitions; one the sandbox's Python lacks must not stop every step.
            code = "".join(
                (
                    "try:\n    %sexcept ImportError:\n    pass\n" % line
                    if line.startswith("import ") and "\\" not in line
                    else line
                )
                for line in code.splitlines(True)
            )
        self._pending_tools = code

    def send_variables(self, variables: Dict[str, Any]) -> None:
        """Sends the agent's variables (``additional_args``) as smolagents' remote executors
        do (safe JSON serialization; pickle only with ``allow_pickle``); they arrive with the
        next step and are then kept as the rest of the state."""
        if not variables:
            return
        serialized = SafeSerializer.dumps(variables, allow_pickle=self.allow_pickle)
        self._pending_variables = "%s\nvars_dict = _deserialize(%r)\n" % (
            SafeSerializer.get_deserializer_code(self.allow_pickle),
            serialized,
        )

    def install_packages(self, additional_imports: List[str]) -> List[str]:
        """Installs nothing: the packages are checked against the sandbox's Python with the
        next step, and the missing ones reported in its logs."""
        for p in additional_imports:
            if p not in self._pending_imports:
                self._pending_imports.append(p)
        return []

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Runs one step as one cell; returns smolagents' ``CodeOutput`` (logs: the cell's
        stdout and what the executor has to say), or raises ``AgentError`` with the cell's
        stderr tail."""
        self._steps += 1
        step = {
            "code": code,
            "output": self._output_path,
            "tools": self._pending_tools,
            "variables": self._pending_variables,
            "imports": self._pending_imports,
        }
        program = (LIVE_TEMPLATE if self.live else TEMPLATE).replace(
            "_aj_json.loads(__AGENTJAIL_STEP__)", "_aj_json.loads(%r)" % json.dumps(step), 1
        )
        digest = hashlib.sha256(program.encode()).hexdigest()[:16]
        request_id = "smolagents-step-%d-%s" % (self._steps, digest)
        self.last_step = (program, request_id)
        cell = self._run_cell(program, request_id)
        self.cells.append(cell)
        self._pending_tools = self._pending_variables = None
        self._pending_imports = []
        return self._result(cell)

    def cleanup(self) -> None:
        """Ends the session (when the executor opened it) and closes the client (when it
        made it). ``CodeAgent.cleanup()`` and ``with CodeAgent(...)`` call it."""
        try:
            if self._owns_session and self.session.state == "open":
                self.session.close()
        finally:
            if self._owns_client:
                self.client.close()

    # -- the cell ------------------------------------------------------------------------

    def _run_cell(self, program: str, request_id: str) -> Cell:
        # Execute-once: the same step again after a transport failure returns the recorded cell.
        return _cell.retrying(
            lambda: self.session.run(program, request_id=request_id, timeout=self.timeout)
        )

    def _logs(self, cell: Cell) -> str:
        try:
            return self.client.logs(cell.request_id, "stdout").text
        except APIError:
            return cell.stdout

    def _result(self, cell: Cell) -> CodeOutput:
        report: Dict[str, Any] = {}
        logs = self._logs(cell)
        if self.live:
            # A live cell has no output file: the step's report is its stdout's last line.
            at = logs.rfind(LIVE_MARKER)
            if at >= 0:
                line = logs[at + len(LIVE_MARKER) :].split("\n", 1)[0]
                logs = logs[:at]
                logs = logs[:-1] if logs.endswith("\n") else logs
                try:
                    parsed = json.loads(line)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    report = parsed
        else:
            artifact = cell.artifact if cell.ok else None
            if isinstance(artifact, dict):
                report = artifact
        notes = []
        if report.get("missing_imports"):
            notes.append(
                "the sandbox's Python cannot import: %s (nothing is installed)"
                % ", ".join(report["missing_imports"])
            )
        if report.get("skipped"):
            notes.append(
                "not kept for the next step (cannot be pickled with %s): %s"
                % (report.get("pickler", "pickle"), ", ".join(report["skipped"]))
            )
        if report.get("unrestored"):
            notes.append(
                "not restored from the previous step: %s" % ", ".join(report["unrestored"])
            )
        for n in notes:
            self.logger.log("agentjail: " + n, level=LogLevel.INFO)
        if notes:
            logs += "".join("\n[agentjail] " + n for n in notes) + "\n"
        if not cell.ok:
            what = "the cell ended %s" % cell.status
            if cell.reason:
                what += " (%s)" % cell.reason
            raise AgentError(
                "%s\nExecuting code yielded an error: %s\n%s"
                % (logs, what, cell.stderr_tail.strip()),
                self.logger,
            )
        final = report.get("final_answer")
        if isinstance(final, str):
            value = self._deserialize_final_answer(final, self.allow_pickle)
            return CodeOutput(output=value, logs=logs, is_final_answer=True)
        return CodeOutput(output=report.get("output"), logs=logs, is_final_answer=False)

"""A code-execution function tool for the OpenAI Agents SDK that runs the model's Python code
as cells of one agentjail session (``pip install 'agentjail[openai-agents]'``; tested with the
``openai-agents`` version ``.ci/run`` pins).

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

This is a function tool, not a provider of the SDK's ``SandboxAgent`` clients (``agents.sandbox``:
shell exec, file reads and writes, workspace tar archives): agentjail runs a task's command on
code, not arbitrary shell commands in a long-lived machine.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, List, Optional, Sequence

from agents import FunctionTool
from agents.tool_context import ToolContext

from .._async_client import AsyncClient
from .._core import InputRef
from .._models import TaskView
from .._run import Cell
from .._session import AsyncSession
from . import _cell

__all__ = ["AgentjailPython"]


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

"""A LangChain tool that runs the model's Python code as cells of one agentjail session
(``pip install 'agentjail[langchain]'``; tested with the langchain-core and langgraph versions
``.ci/run`` pins), usable wherever LangChain takes a tool: ``model.bind_tools([tool])`` and
LangGraph's ``ToolNode([tool])``.

>>> from agentjail.integrations.langchain import AgentjailCodeTool
>>> tool = AgentjailCodeTool(task="agent", inputs=[client.upload("data.csv")])  # doctest: +SKIP
>>> tool.invoke({"code": "print(2 + 2)"})                                       # doctest: +SKIP
'[agentjail cell 0: ok]\\n4'

A call is one cell: a fresh Python process in the sandbox whose working directory is the
session's ``/work``. Files carry over between calls (the service checkpoints ``/work``);
variables do not, and nothing is pickled, neither in the sandbox nor into the graph's state
(which holds the calls and their observations, text only). The observation is the cell's
stdout, the value of a last expression, and after a failure its status and stderr tail; the
tool message's artifact is the cell's record (request id, status, receipt). A tool call's id
makes the cell execute-once: the same call sent again returns the recorded cell.

The task must allow code (``code = "allowed"``) and have a JSON output with no schema (or one
that admits the tool's report ``{"value", "error"}``): each cell writes its report there.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

from langchain_core.tools import BaseTool
from pydantic import BaseModel, Field, PrivateAttr

from .._client import Client
from .._core import InputRef
from .._run import Cell
from .._session import Session
from . import _cell

__all__ = ["AgentjailCodeTool", "CodeInput"]

_CALL_ID = "__agentjail_tool_call_id"


class CodeInput(BaseModel):
    """The tool's arguments."""

    code: str = Field(description="Python source to run; print what you want to see.")


class AgentjailCodeTool(BaseTool):
    """Runs Python code in an agentjail session, one cell per call.

    ``client`` defaults to ``agentjail.Client()`` (``$AGENTJAIL_URL``, ``$AGENTJAIL_TOKEN``);
    ``task`` and ``inputs`` open the session (or give an open ``session``: it is then not
    ended by :meth:`close`). ``timeout`` bounds each call's wait in seconds (the task's time
    limit ends the cell anyway). Use it as a context manager, or call :meth:`close`, to end
    the session it opened.
    """

    name: str = "python"
    description: str = ""
    args_schema: Type[BaseModel] = CodeInput
    response_format: Any = "content_and_artifact"

    _client: Client = PrivateAttr()
    _session: Session = PrivateAttr()
    _owns_client: bool = PrivateAttr(default=False)
    _owns_session: bool = PrivateAttr(default=False)
    _output: str = PrivateAttr()
    _timeout: Optional[float] = PrivateAttr(default=None)
    _cells: List[Cell] = PrivateAttr(default_factory=list)
    # One cell at a time: a session refuses a cell while one runs (`cell-in-progress`), and
    # LangGraph's ToolNode runs the tool calls of one message in parallel.
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(
        self,
        *,
        client: Optional[Client] = None,
        task: Optional[str] = None,
        inputs: Sequence[InputRef] = (),
        session: Optional[Session] = None,
        timeout: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        owns_client = client is None and session is None
        the_client = session._client if session is not None else client or Client()
        try:
            if session is None:
                if task is None:
                    raise ValueError("AgentjailCodeTool needs task= (or an open session=)")
                tasks = the_client.tasks()
                _cell.output_path(tasks, task)  # refused before a session is opened
                session = the_client.session(task, inputs)
                self._owns_session = True
            else:
                tasks = the_client.tasks()
        except BaseException:
            if owns_client:
                the_client.close()
            raise
        self._client, self._session, self._owns_client = the_client, session, owns_client
        self._output = _cell.output_path(tasks, session.task)
        self._timeout = timeout
        if not self.description:
            self.description = _cell.description(tasks, session.task)

    @property
    def session(self) -> Session:
        """The session the calls run in."""
        return self._session

    @property
    def cells(self) -> List[Cell]:
        """Every cell this tool ran, in order."""
        return list(self._cells)

    def _to_args_and_kwargs(
        self, tool_input: Union[str, Dict[str, Any]], tool_call_id: Optional[str]
    ) -> Tuple[Tuple[str, ...], Dict[str, Any]]:
        # The tool call's id reaches `_run` (its request id: execute-once per call).
        args, kwargs = super()._to_args_and_kwargs(tool_input, tool_call_id)
        kwargs[_CALL_ID] = tool_call_id
        return args, kwargs

    def _run(self, code: str, **kwargs: Any) -> Tuple[str, Dict[str, Any]]:
        program = _cell.program(code, self._output)
        rid = _cell.request_id("langchain", kwargs.get(_CALL_ID), program)
        with self._lock:
            cell = _cell.retrying(
                lambda: self._session.run(program, request_id=rid, timeout=self._timeout)
            )
            self._cells.append(cell)
        artifact = {
            "session_id": cell.session_id,
            "cell": cell.cell,
            "request_id": cell.request_id,
            "status": cell.status,
            "ok": cell.ok,
        }
        return _cell.observation(cell), artifact

    def close(self) -> None:
        """Ends the session (when the tool opened it) and closes the client (when it made
        it)."""
        try:
            if self._owns_session and self._session.state == "open":
                self._session.close()
        finally:
            if self._owns_client:
                self._client.close()

    def __enter__(self) -> "AgentjailCodeTool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

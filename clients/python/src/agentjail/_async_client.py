"""The asynchronous client: the same operations as :class:`agentjail.Client`, awaited.

Both drive the same I/O-free operations of ``_core``; each method here is documented in full
on :class:`agentjail.Client`.
"""

from __future__ import annotations

import asyncio
import os
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
)

import httpx

from . import _core as core
from ._core import Call, Follower, InputRef, Op, Sleep, Source
from ._errors import StreamError
from ._http import Config, TimeoutArg, answer, translate
from ._models import RunSummary, TaskView
from ._run import Cell, CellPage, Event, Input, Log, Run, RunPage
from ._session import AsyncSession

T = TypeVar("T")


class AsyncClient:
    """The asynchronous client of one ``agentjail serve`` (``httpx.AsyncClient``); the same
    arguments and methods as :class:`agentjail.Client`, awaited (``events`` is an async
    iterator, ``follow``'s callback may be a coroutine function).

    ``session(...)`` is awaited (``await client.session(...)``) or used as ``async with``.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: TimeoutArg = None,
        headers: Optional[Mapping[str, str]] = None,
        retries: int = 2,
        http_client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self._config = Config(base_url, token, timeout, headers, retries)
        self._http = http_client or httpx.AsyncClient(timeout=self._config.timeout)
        self._owns_http = http_client is None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connections (not those of an ``http_client`` given: its owner does)."""
        if self._owns_http:
            await self._http.aclose()

    async def _send(self, call: Call) -> core.Answer:
        try:
            return answer(await self._http.request(**self._config.request_args(call)))
        except httpx.HTTPError as e:
            raise translate(e) from e

    async def _drive(self, op: Op[T]) -> T:
        try:
            step = next(op)
            attempt = 0
            while True:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    step = op.send(None)
                    continue
                a = await self._send(step)
                delay = core.retry_delay(a, attempt, self._config.retries)
                if delay is not None:
                    attempt += 1
                    await asyncio.sleep(delay)
                    continue
                attempt = 0
                step = op.send(a)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def upload(
        self, source: Source, *, name: Optional[str] = None, media_type: Optional[str] = None
    ) -> Input:
        """Uploads an input (a path, bytes or a binary file object)."""
        return await self._drive(core.op_upload(source, name, media_type))

    async def run(
        self,
        task: str,
        inputs: Sequence[InputRef] = (),
        *,
        code: Optional[str] = None,
        args: Optional[Sequence[str]] = None,
        request_id: Optional[str] = None,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[Event], Union[None, Awaitable[None]]]] = None,
    ) -> Run:
        """Runs ``task`` once (execute-once by ``request_id``) and waits for its end; with
        ``on_event``, submitted and followed in one request, ``on_event`` called (or
        awaited) with each event (not with ``timeout``)."""
        body = core.run_request(task, inputs, code, args, request_id or core.new_request_id())
        if on_event is not None:
            if timeout is not None:
                raise ValueError("a run followed with on_event takes no timeout")
            f = Follower(body["request_id"], None, 5, submit=body)
            return await self._final_run(self._stream(f), on_event)
        return await self._drive(core.op_submit(body, True, timeout))

    async def submit(
        self,
        task: str,
        inputs: Sequence[InputRef] = (),
        *,
        code: Optional[str] = None,
        args: Optional[Sequence[str]] = None,
        request_id: Optional[str] = None,
    ) -> Run:
        """Submits a run without waiting."""
        body = core.run_request(task, inputs, code, args, request_id or core.new_request_id())
        return await self._drive(core.op_submit(body, False, None))

    async def get(self, request_id: str) -> Run:
        """The run's record now."""
        return await self._drive(core.op_get(request_id))

    async def wait(self, request_id: str, *, timeout: Optional[float] = None) -> Run:
        """Waits until the run has ended."""
        return await self._drive(core.op_wait(request_id, timeout))

    async def cancel(
        self, request_id: str, *, wait: bool = True, timeout: Optional[float] = None
    ) -> Run:
        """Cancels the run."""
        return await self._drive(core.op_cancel(request_id, wait, timeout))

    async def list_page(
        self,
        *,
        status: Optional[str] = None,
        task: Optional[str] = None,
        created_after: Optional[str] = None,
        created_before: Optional[str] = None,
        tenant: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> RunPage:
        """One page of the tenant's runs."""
        params = core.list_params(status, task, created_after, created_before, tenant, limit)
        return await self._drive(core.op_list_page(params, cursor))

    async def list(
        self,
        *,
        status: Optional[str] = None,
        task: Optional[str] = None,
        created_after: Optional[str] = None,
        created_before: Optional[str] = None,
        tenant: Optional[str] = None,
        page_size: Optional[int] = None,
    ) -> AsyncIterator[RunSummary]:
        """Every run matching the filters, newest first, page after page."""
        params = core.list_params(status, task, created_after, created_before, tenant, page_size)
        cursor: Optional[str] = None
        while True:
            page = await self._drive(core.op_list_page(params, cursor))
            for r in page.runs:
                yield r
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def logs(self, request_id: str, stream: str = "stdout") -> Log:
        """The run's whole retained log of ``stream``."""
        return await self._drive(core.op_logs(request_id, stream))

    async def artifact(self, request_id: str) -> bytes:
        """The verified artifact's bytes."""
        return await self._drive(core.op_artifact(request_id))

    async def download_artifact(self, request_id: str, path: Union[str, "os.PathLike[str]"]) -> int:
        """Writes the verified artifact to ``path``; returns its size."""
        data = await self.artifact(request_id)
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

    async def receipt(self, request_id: str) -> Dict[str, Any]:
        """The run's signed receipt."""
        return await self._drive(core.op_receipt(request_id))

    async def reconcile(self, request_id: str, action: str) -> Run:
        """Operators: ``retry`` or ``abandon`` an ``unknown`` run."""
        return await self._drive(core.op_reconcile(request_id, action))

    def session(
        self,
        task: str,
        inputs: Sequence[InputRef] = (),
        *,
        request_id: Optional[str] = None,
    ) -> "_Opening":
        """Opens a session; await it, or ``async with client.session(...) as s`` (ended at
        exit)."""
        return _Opening(self, task, inputs, request_id or core.new_request_id())

    async def open_session(
        self, task: str, inputs: Sequence[InputRef] = (), *, request_id: Optional[str] = None
    ) -> AsyncSession:
        """Opens a session of ``task`` (execute-once by ``request_id``)."""
        rid = request_id or core.new_request_id()
        return AsyncSession(self, await self._drive(core.op_open_session(task, inputs, rid)))

    async def get_session(self, session_id: str) -> AsyncSession:
        """The session now."""
        return AsyncSession(self, await self._drive(core.op_get_session(session_id)))

    async def run_cell(
        self,
        session_id: str,
        code: str,
        *,
        request_id: Optional[str] = None,
        wait: bool = True,
        timeout: Optional[float] = None,
    ) -> Cell:
        """Runs the session's next cell."""
        rid = request_id or core.new_request_id()
        return await self._drive(core.op_cell(session_id, code, rid, wait, timeout))

    async def cells_page(
        self, session_id: str, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> CellPage:
        """One page of the session's cells."""
        return await self._drive(core.op_cells_page(session_id, limit, cursor))

    async def cells(
        self, session_id: str, *, page_size: Optional[int] = None
    ) -> AsyncIterator[Cell]:
        """Every cell of the session, in order."""
        cursor: Optional[str] = None
        while True:
            page = await self._drive(core.op_cells_page(session_id, page_size, cursor))
            for c in page.cells:
                yield c
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def fork_session(
        self, session_id: str, *, cell: Optional[int] = None, request_id: Optional[str] = None
    ) -> AsyncSession:
        """A new session from a checkpoint of this one."""
        rid = request_id or core.new_request_id()
        return AsyncSession(self, await self._drive(core.op_fork_session(session_id, cell, rid)))

    async def checkpoint_session(self, session_id: str) -> AsyncSession:
        """Checkpoints the session's workspace now; returns the session."""
        return AsyncSession(self, await self._drive(core.op_checkpoint_session(session_id)))

    async def close_session(self, session_id: str) -> AsyncSession:
        """Ends the session (idempotent)."""
        return AsyncSession(self, await self._drive(core.op_close_session(session_id)))

    async def events(
        self, request_id: str, *, last_event_id: Optional[str] = None, max_reconnects: int = 5
    ) -> AsyncIterator[Event]:
        """The run's live events until ``ended``, resumed across dropped connections."""
        async for ev in self._stream(Follower(request_id, last_event_id, max_reconnects)):
            yield ev

    async def _stream(self, f: Follower) -> AsyncIterator[Event]:
        while not f.ended:
            call = f.call()
            progress = False
            try:
                async with self._http.stream(**self._config.request_args(call)) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        core.check(answer(r))
                    async for line in r.aiter_lines():
                        ev = f.line(line)
                        if ev is not None:
                            progress = True
                            yield ev
                            if f.ended:
                                return
                f.dropped(None)
            except httpx.HTTPError as e:
                f.dropped(translate(e))
            if progress:
                f.reconnects = 0

    async def follow(
        self,
        request_id: str,
        on_event: Optional[Callable[[Event], Union[None, Awaitable[None]]]] = None,
        *,
        last_event_id: Optional[str] = None,
    ) -> Run:
        """Follows the run's events, calling (or awaiting) ``on_event`` for each; returns
        the final run."""
        return await self._final_run(self.events(request_id, last_event_id=last_event_id), on_event)

    @staticmethod
    async def _final_run(
        events: AsyncIterator[Event],
        on_event: Optional[Callable[[Event], Union[None, Awaitable[None]]]],
    ) -> Run:
        final: Optional[Run] = None
        async for ev in events:
            if on_event is not None:
                r = on_event(ev)
                if r is not None:
                    await r
            if ev.run is not None:
                final = ev.run
        if final is None:
            raise StreamError("the event stream ended without `ended`")
        return final

    async def tasks(self) -> List[TaskView]:
        """The tasks the caller may use."""
        return list((await self._drive(core.op_tasks()))["tasks"])

    async def health(self) -> Dict[str, Any]:
        """``GET /healthz``."""
        return await self._drive(core.op_json("/healthz"))

    async def openapi(self) -> Dict[str, Any]:
        """The service's OpenAPI document."""
        return await self._drive(core.op_json("/openapi.json"))

    async def metrics(self) -> str:
        """``GET /metrics``."""
        return await self._drive(core.op_text("/metrics"))


class _Opening:
    """``AsyncClient.session(...)``: awaitable (the session) and an async context manager
    (the session, ended at exit)."""

    def __init__(
        self, client: AsyncClient, task: str, inputs: Sequence[InputRef], request_id: str
    ) -> None:
        self._args = (client, task, inputs, request_id)
        self._session: Optional[AsyncSession] = None

    async def _open(self) -> AsyncSession:
        client, task, inputs, rid = self._args
        return await client.open_session(task, inputs, request_id=rid)

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._open()
        return self._session

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

"""The synchronous client."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

import httpx

from . import _core as core
from ._core import Call, Follower, InputRef, Op, Sleep, Source
from ._http import Config, TimeoutArg, answer, translate
from ._models import RunSummary, TaskView
from ._run import Cell, CellPage, Event, Input, Log, Run, RunPage
from ._session import Session

T = TypeVar("T")


class Client:
    """A client of one ``agentjail serve`` (its HTTP API, ``/v1``).

    ``base_url`` defaults to ``$AGENTJAIL_URL``, then ``http://127.0.0.1:8787``; ``token`` to
    ``$AGENTJAIL_TOKEN``. ``timeout`` bounds each HTTP exchange (seconds or an
    ``httpx.Timeout``; default 10 s to connect, 60 s to answer); a call that waits for a run
    waits as long as its own ``timeout`` says. An answer 429 (every run slot and the queue
    full) or 503 (the database unreachable) is retried ``retries`` times after its
    ``Retry-After`` (at most 30 s each; safe: a request id runs once), then raised as
    :class:`RateLimited` / :class:`Unavailable`. Use it as a context manager, or call
    :meth:`close`. ``http_client`` is an ``httpx.Client`` of your own (proxies, TLS, event
    hooks); the URL, token and timeouts are still set per request.

    Sessions (cells sharing a persistent ``/work``): :meth:`session`.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: TimeoutArg = None,
        headers: Optional[Mapping[str, str]] = None,
        retries: int = 2,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        self._config = Config(base_url, token, timeout, headers, retries)
        self._http = http_client or httpx.Client(timeout=self._config.timeout)
        self._owns_http = http_client is None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections (not those of an ``http_client`` given: its owner does)."""
        if self._owns_http:
            self._http.close()

    # -- the driver ----------------------------------------------------------------------

    def _send(self, call: Call) -> core.Answer:
        try:
            return answer(self._http.request(**self._config.request_args(call)))
        except httpx.HTTPError as e:
            raise translate(e) from e

    def _drive(self, op: Op[T]) -> T:
        try:
            step = next(op)
            attempt = 0
            while True:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    step = op.send(None)
                    continue
                a = self._send(step)
                delay = core.retry_delay(a, attempt, self._config.retries)
                if delay is not None:
                    attempt += 1
                    time.sleep(delay)
                    continue
                attempt = 0
                step = op.send(a)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    # -- inputs --------------------------------------------------------------------------

    def upload(
        self,
        source: Source,
        *,
        name: Optional[str] = None,
        media_type: Optional[str] = None,
    ) -> Input:
        """Uploads an input: ``source`` is a path, bytes or a binary file object. ``name``
        defaults to the file's name; ``media_type`` is guessed from the name (``text/csv``
        for ``.csv``). Returns the :class:`Input` to pass to :meth:`run`."""
        return self._drive(core.op_upload(source, name, media_type))

    # -- runs ----------------------------------------------------------------------------

    def run(
        self,
        task: str,
        inputs: Sequence[InputRef] = (),
        *,
        code: Optional[str] = None,
        args: Optional[Sequence[str]] = None,
        request_id: Optional[str] = None,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[Event], None]] = None,
    ) -> Run:
        """Runs ``task`` once and waits for its end; returns the :class:`Run` whatever its
        status (check ``run.ok`` or call ``run.raise_for_status()``).

        ``request_id`` makes it execute-once: a run submitted again with the same id and body
        is not run again, its record is returned (a fresh UUID4 when not given). ``timeout``
        bounds the wait in seconds (:class:`WaitTimeout`; the run goes on). With
        ``on_event``, the run is submitted and followed in one request (its events as they
        happen, :meth:`events`), and ``on_event`` is called with each; not with ``timeout``."""
        body = core.run_request(task, inputs, code, args, request_id or core.new_request_id())
        if on_event is not None:
            if timeout is not None:
                raise ValueError("a run followed with on_event takes no timeout")
            f = Follower(body["request_id"], None, 5, submit=body)
            return core.final_run(self._stream(f), on_event)
        return self._drive(core.op_submit(body, True, timeout))

    def submit(
        self,
        task: str,
        inputs: Sequence[InputRef] = (),
        *,
        code: Optional[str] = None,
        args: Optional[Sequence[str]] = None,
        request_id: Optional[str] = None,
    ) -> Run:
        """Submits a run without waiting (``?wait=false``): returns it ``queued`` or
        ``running`` (or final, for a replay); then :meth:`wait`, :meth:`events` or
        :meth:`follow` it."""
        body = core.run_request(task, inputs, code, args, request_id or core.new_request_id())
        return self._drive(core.op_submit(body, False, None))

    def get(self, request_id: str) -> Run:
        """The run's record now (final or not)."""
        return self._drive(core.op_get(request_id))

    def wait(self, request_id: str, *, timeout: Optional[float] = None) -> Run:
        """Waits until the run has ended (polling its record); :class:`WaitTimeout` after
        ``timeout`` seconds."""
        return self._drive(core.op_wait(request_id, timeout))

    def cancel(self, request_id: str, *, wait: bool = True, timeout: Optional[float] = None) -> Run:
        """Cancels the run (only its actor or an operator may): a queued run never starts, a
        running one is killed. Returns the run, ended when ``wait``. Cancelling a cancelled
        run returns it; one that ended otherwise is :class:`Conflict`."""
        return self._drive(core.op_cancel(request_id, wait, timeout))

    def list_page(
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
        """One page of the tenant's runs, newest first (``next_cursor`` for the next)."""
        params = core.list_params(status, task, created_after, created_before, tenant, limit)
        return self._drive(core.op_list_page(params, cursor))

    def list(
        self,
        *,
        status: Optional[str] = None,
        task: Optional[str] = None,
        created_after: Optional[str] = None,
        created_before: Optional[str] = None,
        tenant: Optional[str] = None,
        page_size: Optional[int] = None,
    ) -> Iterator[RunSummary]:
        """Every run matching the filters, newest first, fetching pages as it goes. Times
        are RFC 3339; ``tenant`` is for operators."""
        params = core.list_params(status, task, created_after, created_before, tenant, page_size)
        cursor: Optional[str] = None
        while True:
            page = self._drive(core.op_list_page(params, cursor))
            yield from page.runs
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def logs(self, request_id: str, stream: str = "stdout") -> Log:
        """The run's whole retained log of ``stream`` (``stdout`` or ``stderr``)."""
        return self._drive(core.op_logs(request_id, stream))

    def artifact(self, request_id: str) -> bytes:
        """The verified artifact's bytes (a run that ended ``ok`` only; else
        :class:`Conflict`)."""
        return self._drive(core.op_artifact(request_id))

    def download_artifact(self, request_id: str, path: Union[str, "os.PathLike[str]"]) -> int:
        """Writes the verified artifact to ``path``; returns its size."""
        data = self.artifact(request_id)
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

    def receipt(self, request_id: str) -> Dict[str, Any]:
        """The run's signed receipt (a DSSE envelope) for :func:`agentjail.verify`."""
        return self._drive(core.op_receipt(request_id))

    def reconcile(self, request_id: str, action: str) -> Run:
        """Operators: decides an ``unknown`` run, ``action`` ``retry`` or ``abandon``."""
        return self._drive(core.op_reconcile(request_id, action))

    # -- sessions ------------------------------------------------------------------------

    def session(
        self,
        task: str,
        inputs: Sequence[InputRef] = (),
        *,
        request_id: Optional[str] = None,
    ) -> Session:
        """Opens a session of ``task`` (a task with ``code = "allowed"``): cells that share a
        persistent ``/work``, each with ``inputs``. Execute-once by ``request_id`` (a fresh
        UUID4 when not given): the same id again returns the same session. Use it as a
        context manager to end it at exit. A service whose store keeps no sessions answers
        :class:`SessionsUnsupported`."""
        rid = request_id or core.new_request_id()
        return Session(self, self._drive(core.op_open_session(task, inputs, rid)))

    open_session = session

    def get_session(self, session_id: str) -> Session:
        """The session now (another tenant's or actor's is :class:`NotFound`)."""
        return Session(self, self._drive(core.op_get_session(session_id)))

    def run_cell(
        self,
        session_id: str,
        code: str,
        *,
        request_id: Optional[str] = None,
        wait: bool = True,
        timeout: Optional[float] = None,
    ) -> Cell:
        """Runs the session's next cell; see :meth:`Session.run`."""
        rid = request_id or core.new_request_id()
        return self._drive(core.op_cell(session_id, code, rid, wait, timeout))

    def cells_page(
        self, session_id: str, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> CellPage:
        """One page of the session's cells, in order."""
        return self._drive(core.op_cells_page(session_id, limit, cursor))

    def cells(self, session_id: str, *, page_size: Optional[int] = None) -> Iterator[Cell]:
        """Every cell of the session, in order, fetching pages as it goes."""
        cursor: Optional[str] = None
        while True:
            page = self._drive(core.op_cells_page(session_id, page_size, cursor))
            yield from page.cells
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def fork_session(
        self, session_id: str, *, cell: Optional[int] = None, request_id: Optional[str] = None
    ) -> Session:
        """A new session from the workspace as ``cell`` left it (default: the head)."""
        rid = request_id or core.new_request_id()
        return Session(self, self._drive(core.op_fork_session(session_id, cell, rid)))

    def checkpoint_session(self, session_id: str) -> Session:
        """Checkpoints the session's workspace now (a live session's interpreter keeps
        running); returns the session, its ``workspace_sha256`` the checkpoint."""
        return Session(self, self._drive(core.op_checkpoint_session(session_id)))

    def close_session(self, session_id: str) -> Session:
        """Ends the session (idempotent); returns it, ``closed``."""
        return Session(self, self._drive(core.op_close_session(session_id)))

    # -- live events ---------------------------------------------------------------------

    def events(
        self,
        request_id: str,
        *,
        last_event_id: Optional[str] = None,
        max_reconnects: int = 5,
    ) -> Iterator[Event]:
        """The run's live events (:class:`Event`), as they happen, until ``ended``.

        A dropped connection is resumed with ``Last-Event-ID`` (up to ``max_reconnects``
        times in a row without progress): no chunk is lost or repeated. ``last_event_id``
        resumes after an event of an earlier stream."""
        return self._stream(Follower(request_id, last_event_id, max_reconnects))

    def _stream(self, f: Follower) -> Iterator[Event]:
        while not f.ended:
            call = f.call()
            progress = False
            try:
                with self._http.stream(**self._config.request_args(call)) as r:
                    if r.status_code >= 400:
                        r.read()
                        core.check(answer(r))
                    for line in r.iter_lines():
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

    def follow(
        self,
        request_id: str,
        on_event: Optional[Callable[[Event], None]] = None,
        *,
        last_event_id: Optional[str] = None,
    ) -> Run:
        """Follows the run's events, calling ``on_event`` for each; returns the final
        :class:`Run` (from ``ended``)."""
        return core.final_run(self.events(request_id, last_event_id=last_event_id), on_event)

    # -- the service ---------------------------------------------------------------------

    def tasks(self) -> List[TaskView]:
        """The tasks the caller may use, with their input, output and request schemas."""
        return list(self._drive(core.op_tasks())["tasks"])

    def health(self) -> Dict[str, Any]:
        """``GET /healthz``."""
        return self._drive(core.op_json("/healthz"))

    def openapi(self) -> Dict[str, Any]:
        """The service's OpenAPI document."""
        return self._drive(core.op_json("/openapi.json"))

    def metrics(self) -> str:
        """``GET /metrics`` (Prometheus text)."""
        return self._drive(core.op_text("/metrics"))

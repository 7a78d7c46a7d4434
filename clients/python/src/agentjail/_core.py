"""The part of the client that does no I/O, shared by :class:`Client` and :class:`AsyncClient`.

Each operation is a generator (an :data:`Op`) that yields what it needs done — an HTTP
:class:`Call` or a :class:`Sleep` — and receives the :class:`Answer`; it returns the result.
The sync and async clients only drive these generators (``_drive``), so that request
building, response parsing, waiting and pagination exist once. The event stream's parsing
and resumption is :class:`SSEDecoder` and :class:`Follower`, also I/O-free.
"""

from __future__ import annotations

import json
import mimetypes
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Generator,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)
from urllib.parse import quote

from ._errors import APIError, StreamError, WaitTimeout, error_for
from ._models import CellList, InputCreated, RunList, RunView, SessionView, TaskList
from ._run import Cell, CellPage, Event, Input, Log, Run, RunPage

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8787"
#: Seconds between two polls of a run that has not ended.
POLL_INTERVAL = 0.25

#: What can be uploaded: bytes, a binary file object, or a path.
Source = Union[bytes, bytearray, memoryview, "os.PathLike[str]", str, IO[bytes]]
#: An input of a run: an :class:`Input` or its id.
InputRef = Union[Input, str]


@dataclass(frozen=True)
class Call:
    """One HTTP request to make."""

    method: str
    path: str
    params: Dict[str, str] = field(default_factory=dict)
    headers: Dict[str, str] = field(default_factory=dict)
    json: Any = None
    content: Optional[bytes] = None
    #: The service holds the answer until a run ends: no read timeout.
    long: bool = False


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Answer:
    """What the service answered to a :class:`Call`."""

    status: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


Op = Generator[Union[Call, Sleep], Any, T]


def now() -> float:
    return time.monotonic()


#: Statuses after which the same call is made again (``Retry-After``): 429 (every run slot
#: and the queue full) and 503 (the database unreachable, or too many followers).
RETRY_STATUSES = frozenset({429, 503})
#: The longest wait between two attempts, whatever ``Retry-After`` says.
MAX_RETRY_WAIT = 30.0


def retry_delay(a: Answer, attempt: int, retries: int) -> Optional[float]:
    """How long to wait before making a call again after answer ``a`` (its ``attempt``-th
    retry; 0 for the first answer), or ``None`` to hand the answer on. Safe for every call of
    this API: a run is executed once per request id, the other calls read or are idempotent.
    """
    if a.status not in RETRY_STATUSES or attempt >= retries:
        return None
    value = {k.lower(): v for k, v in a.headers.items()}.get("retry-after", "")
    try:
        delay = float(value)
    except ValueError:
        delay = 1.0 * 2**attempt
    return max(0.0, min(delay, MAX_RETRY_WAIT))


def new_request_id() -> str:
    """A fresh execute-once request id (a UUID4)."""
    return str(uuid.uuid4())


def seg(s: str) -> str:
    """One path segment, escaped."""
    return quote(s, safe="")


def check(a: Answer) -> Answer:
    """``a`` when it is a success; the typed :class:`APIError` otherwise."""
    if a.status < 400:
        return a
    try:
        problem = json.loads(a.content)
        if not isinstance(problem, dict):
            raise ValueError
    except ValueError:
        problem = {
            "status": a.status,
            "title": "",
            "detail": a.content[:500].decode("utf-8", "replace"),
        }
    raise error_for(a.status, problem, {k.lower(): v for k, v in a.headers.items()})


def read_source(source: Source) -> Tuple[bytes, Optional[str]]:
    """The bytes of an upload and, for a path or a named file object, its file name."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), None
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return f.read(), os.path.basename(os.fspath(source))
    data = source.read()
    if not isinstance(data, bytes):
        raise TypeError("upload a file object opened in binary mode ('rb')")
    name = getattr(source, "name", None)
    return data, os.path.basename(name) if isinstance(name, str) else None


# ---------------------------------------------------------------------------------------------
# Operations


def op_upload(source: Source, name: Optional[str], media_type: Optional[str]) -> Op[Input]:
    data, found = read_source(source)
    name = name or found
    if not name:
        raise ValueError("name= is needed to upload bytes or an unnamed file object")
    if media_type is None:
        media_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    a = check(
        (
            yield Call(
                "POST",
                "/v1/inputs",
                params={"name": name, "media_type": media_type},
                headers={"content-type": "application/octet-stream"},
                content=data,
            )
        )
    )
    body = cast(InputCreated, a.json())
    return Input(
        input_id=body["input_id"],
        sha256=body["sha256"],
        bytes=body["bytes"],
        name=body["name"],
        media_type=body["media_type"],
        expires_at=body.get("expires_at"),
    )


def run_request(
    task: str,
    inputs: Sequence[InputRef],
    code: Optional[str],
    args: Optional[Sequence[str]],
    request_id: str,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {
        "request_id": request_id,
        "task": task,
        "inputs": [i.input_id if isinstance(i, Input) else i for i in inputs],
    }
    if code is not None:
        body["code"] = code
    if args is not None:
        body["args"] = list(args)
    return body


def op_submit(body: Dict[str, Any], wait: bool, timeout: Optional[float]) -> Op[Run]:
    """Submits a run. Waiting without a deadline, the service holds the answer until the run
    ends (``?wait=true``); with one, the run is submitted ``?wait=false`` and polled until the
    deadline, so that the deadline is the caller's and not a read timeout."""
    t0 = now()
    held = wait and timeout is None
    a = check(
        (
            yield Call(
                "POST",
                "/v1/runs",
                params={"wait": "true" if held else "false"},
                json=body,
                long=held,
            )
        )
    )
    run = Run(cast(RunView, a.json()))
    if wait and not run.finished:
        run = yield from op_wait(run.request_id, timeout, started=t0)
    return run


def op_get(request_id: str) -> Op[Run]:
    a = check((yield Call("GET", "/v1/runs/" + seg(request_id))))
    return Run(cast(RunView, a.json()))


def op_wait(request_id: str, timeout: Optional[float], started: Optional[float] = None) -> Op[Run]:
    t0 = now() if started is None else started
    while True:
        run = yield from op_get(request_id)
        if run.finished:
            return run
        if timeout is not None and now() - t0 >= timeout:
            raise WaitTimeout(request_id, timeout, run)
        left = POLL_INTERVAL if timeout is None else min(POLL_INTERVAL, timeout - (now() - t0))
        yield Sleep(max(left, 0.0))


def op_cancel(request_id: str, wait: bool, timeout: Optional[float]) -> Op[Run]:
    a = check((yield Call("POST", "/v1/runs/" + seg(request_id) + "/cancel", long=True)))
    run = Run(cast(RunView, a.json()))
    if wait and not run.finished:
        run = yield from op_wait(request_id, timeout)
    return run


def list_params(
    status: Optional[str],
    task: Optional[str],
    created_after: Optional[str],
    created_before: Optional[str],
    tenant: Optional[str],
    limit: Optional[int],
) -> Dict[str, str]:
    p = {
        "status": status,
        "task": task,
        "created_after": created_after,
        "created_before": created_before,
        "tenant": tenant,
        "limit": None if limit is None else str(limit),
    }
    return {k: v for k, v in p.items() if v is not None}


def op_list_page(params: Mapping[str, str], cursor: Optional[str]) -> Op[RunPage]:
    q = dict(params)
    if cursor is not None:
        q["cursor"] = cursor
    a = check((yield Call("GET", "/v1/runs", params=q)))
    body = cast(RunList, a.json())
    return RunPage(runs=list(body["runs"]), next_cursor=body.get("next_cursor"))


def op_logs(request_id: str, stream: str) -> Op[Log]:
    if stream not in ("stdout", "stderr"):
        raise ValueError("stream is 'stdout' or 'stderr'")
    a = check(
        (yield Call("GET", "/v1/runs/" + seg(request_id) + "/logs", params={"stream": stream}))
    )
    h = {k.lower(): v for k, v in a.headers.items()}
    return Log(
        data=a.content,
        sha256=h.get("x-agentjail-sha256"),
        masked=int(h.get("x-agentjail-masked", "0")),
    )


def op_artifact(request_id: str) -> Op[bytes]:
    a = check((yield Call("GET", "/v1/runs/" + seg(request_id) + "/artifact")))
    return a.content


def op_receipt(request_id: str) -> Op[Dict[str, Any]]:
    a = check((yield Call("GET", "/v1/runs/" + seg(request_id) + "/receipt")))
    return cast(Dict[str, Any], a.json())


def op_reconcile(request_id: str, action: str) -> Op[Run]:
    a = check(
        (
            yield Call(
                "POST",
                "/v1/runs/" + seg(request_id) + "/reconcile",
                json={"action": action},
                long=True,
            )
        )
    )
    return Run(cast(RunView, a.json()))


def op_tasks() -> Op[TaskList]:
    a = check((yield Call("GET", "/v1/tasks")))
    return cast(TaskList, a.json())


def op_json(path: str) -> Op[Dict[str, Any]]:
    a = check((yield Call("GET", path)))
    return cast(Dict[str, Any], a.json())


def op_text(path: str) -> Op[str]:
    a = check((yield Call("GET", path)))
    return a.content.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# Sessions


def session_path(session_id: str, *rest: str) -> str:
    return "/".join(["/v1/sessions", seg(session_id), *rest])


def op_open_session(task: str, inputs: Sequence[InputRef], request_id: str) -> Op[SessionView]:
    body = run_request(task, inputs, None, None, request_id)
    a = check((yield Call("POST", "/v1/sessions", json=body)))
    return cast(SessionView, a.json())


def op_get_session(session_id: str) -> Op[SessionView]:
    a = check((yield Call("GET", session_path(session_id))))
    return cast(SessionView, a.json())


def op_close_session(session_id: str) -> Op[SessionView]:
    a = check((yield Call("DELETE", session_path(session_id), long=True)))
    return cast(SessionView, a.json())


def op_checkpoint_session(session_id: str) -> Op[SessionView]:
    a = check((yield Call("POST", session_path(session_id) + "/checkpoint", long=True)))
    return cast(SessionView, a.json())


def op_fork_session(session_id: str, cell: Optional[int], request_id: str) -> Op[SessionView]:
    body: Dict[str, Any] = {"request_id": request_id}
    if cell is not None:
        body["cell"] = cell
    a = check((yield Call("POST", session_path(session_id, "fork"), json=body)))
    return cast(SessionView, a.json())


def op_cell(
    session_id: str, code: str, request_id: str, wait: bool, timeout: Optional[float]
) -> Op[Cell]:
    """Runs the session's next cell. As for a run: without a deadline the service holds the
    answer until the cell ends; with one, the cell is submitted ``?wait=false``, its run is
    polled until it ends, and the cell is then asked for again under the same request id
    (execute-once: that returns the recorded cell, it runs nothing)."""
    t0 = now()
    held = wait and timeout is None
    body = {"request_id": request_id, "code": code}
    path = session_path(session_id, "cells")
    a = check(
        (
            yield Call(
                "POST", path, params={"wait": "true" if held else "false"}, json=body, long=held
            )
        )
    )
    cell = Cell(cast(RunView, a.json()))
    if wait and not cell.finished:
        yield from op_wait(cell.request_id, timeout, started=t0)
        a = check((yield Call("POST", path, params={"wait": "false"}, json=body)))
        cell = Cell(cast(RunView, a.json()))
    return cell


def op_cells_page(session_id: str, limit: Optional[int], cursor: Optional[str]) -> Op[CellPage]:
    q: Dict[str, str] = {}
    if limit is not None:
        q["limit"] = str(limit)
    if cursor is not None:
        q["cursor"] = cursor
    a = check((yield Call("GET", session_path(session_id, "cells"), params=q)))
    body = cast(CellList, a.json())
    return CellPage(
        cells=[Cell(cast(RunView, c)) for c in body["cells"]],
        next_cursor=body.get("next_cursor"),
    )


# ---------------------------------------------------------------------------------------------
# Server-Sent Events


class SSEDecoder:
    """Turns the lines of a ``text/event-stream`` into events (comments and keep-alives
    skipped), as the WHATWG event-stream interpretation does for ``id``, ``event``, ``data``."""

    def __init__(self) -> None:
        self._event = ""
        self._id: Optional[str] = None
        self._data: List[str] = []

    def line(self, line: str) -> Optional[Tuple[str, Optional[str], str]]:
        """Feeds one line (without its end of line); returns ``(event, id, data)`` when a
        blank line completes an event."""
        if line == "":
            if not self._data and not self._event:
                self._id = None
                return None
            out = (self._event or "message", self._id, "\n".join(self._data))
            self._event, self._id, self._data = "", None, []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


def final_run(events: Iterator[Event], on_event: Optional[Callable[[Event], None]]) -> Run:
    """Hands each of ``events`` to ``on_event``; the run of ``ended``."""
    final: Optional[Run] = None
    for ev in events:
        if on_event is not None:
            on_event(ev)
        if ev.run is not None:
            final = ev.run
    if final is None:
        raise StreamError("the event stream ended without `ended`")
    return final


class Follower:
    """The state of following one run's events across connections: the last event id (sent
    back as ``Last-Event-ID`` on a reconnect), the offset reached in each stream (a chunk
    already seen is dropped, a gap is an error), and whether ``ended`` came."""

    def __init__(
        self,
        request_id: str,
        last_event_id: Optional[str],
        max_reconnects: int,
        submit: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.request_id = request_id
        #: A run request to submit and follow in one call (``POST /v1/runs`` asking for
        #: ``text/event-stream``), made again after a drop until a first event came (safe: a
        #: request id runs once); then the follow goes on with ``GET …/events``.
        self.submit = submit
        self.last_event_id = last_event_id
        self.max_reconnects = max_reconnects
        self.reconnects = 0
        self.ended = False
        self.offsets: Dict[str, Optional[int]] = {"stdout": None, "stderr": None}
        self.decoder = SSEDecoder()
        if last_event_id is not None:
            parts = last_event_id.split(".")
            if len(parts) >= 3 and all(p.isdigit() for p in parts):
                self.offsets = {"stdout": int(parts[1]), "stderr": int(parts[2])}

    def call(self) -> Call:
        headers = {"accept": "text/event-stream"}
        if self.last_event_id is not None:
            headers["last-event-id"] = self.last_event_id
        self.decoder = SSEDecoder()
        # Not `long`: the service sends a keep-alive comment every 15 s, so the client's read
        # timeout (60 s by default) notices a connection that died silently.
        if self.submit is not None and self.last_event_id is None:
            return Call("POST", "/v1/runs", headers=headers, json=self.submit)
        return Call("GET", "/v1/runs/" + seg(self.request_id) + "/events", headers=headers)

    def line(self, line: str) -> Optional[Event]:
        """Feeds one line; returns the next event to hand out, if it completes one."""
        raw = self.decoder.line(line)
        if raw is None:
            return None
        name, eid, data = raw
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            raise StreamError("event %r carries data that is not JSON" % name) from None
        if not isinstance(parsed, dict):
            raise StreamError("event %r carries data that is not a JSON object" % name)
        if eid is not None:
            self.last_event_id = eid
        ev = Event(event=name, id=eid or "", data=parsed)
        if name in ("stdout", "stderr"):
            seen = self.offsets[name]
            end = ev.offset + int(parsed.get("bytes", 0))
            if seen is not None and end <= seen:
                return None  # sent before the reconnect: already handed out
            if seen is not None and ev.offset > seen:
                raise StreamError(
                    "%s of run %s: got bytes from %d, expected %d"
                    % (name, self.request_id, ev.offset, seen)
                )
            self.offsets[name] = end
        if name == "ended":
            self.ended = True
        return ev

    def dropped(self, error: Optional[Exception]) -> None:
        """The connection ended: returns to reconnect, or raises when it may not."""
        if self.ended:
            return
        if isinstance(error, APIError):
            raise error
        self.reconnects += 1
        if self.reconnects > self.max_reconnects:
            raise StreamError(
                "the event stream of run %s broke %d times (last: %s)"
                % (self.request_id, self.reconnects, error or "closed before `ended`")
            )

"""The exceptions the client raises.

Every answer of the service that is not a success is an :class:`APIError` (a subclass per
status) carrying the RFC 9457 problem-details body (``status``, ``type``, ``title``,
``detail``). A run that ended badly is *not* an exception: it is a :class:`~agentjail.Run`
whose ``ok`` is false (``run.raise_for_status()`` turns it into :class:`RunFailed`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Type

from ._verify import VerificationError

if TYPE_CHECKING:
    from ._run import Run

__all__ = [
    "AgentjailError",
    "APIError",
    "BadRequest",
    "Unauthorized",
    "Refused",
    "NotFound",
    "Conflict",
    "Gone",
    "TooLarge",
    "InputMismatch",
    "RateLimited",
    "Unavailable",
    "ServerError",
    "Timeout",
    "WaitTimeout",
    "TransportTimeout",
    "TransportError",
    "RunFailed",
    "StreamError",
    "CellInProgress",
    "SessionClosed",
    "SessionExpired",
    "SessionCellLimit",
    "CheckpointInvalid",
    "CheckpointGone",
    "SessionsUnsupported",
    "VerificationError",
]

PROBLEM_BASE = "https://agentjail.dev/problems/"


class AgentjailError(Exception):
    """The base of every exception of this package (but :class:`VerificationError`)."""


class APIError(AgentjailError):
    """The service answered with an error (``application/problem+json``)."""

    def __init__(
        self,
        status: int,
        problem: Mapping[str, Any],
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.status = status
        #: The whole problem-details body as the service sent it.
        self.problem: Dict[str, Any] = dict(problem)
        #: The problem type, e.g. ``https://agentjail.dev/problems/not-found``.
        self.type: str = str(problem.get("type", "about:blank"))
        self.title: str = str(problem.get("title", ""))
        self.detail: str = str(problem.get("detail", ""))
        self.headers: Dict[str, str] = dict(headers or {})
        super().__init__("%d %s: %s" % (status, self.slug or self.title, self.detail))

    @property
    def slug(self) -> str:
        """The problem type's last part (``not-found``, ``request-id-conflict``, …)."""
        if self.type.startswith(PROBLEM_BASE):
            return self.type[len(PROBLEM_BASE) :]
        return ""


class BadRequest(APIError):
    """400: malformed request, unknown field, bad request id or argument."""


class Unauthorized(APIError):
    """401: missing or wrong bearer token."""


class Refused(APIError):
    """403: the policy refuses it (the actor may not use the task, code sent to a task that
    refuses code, another actor's run, …)."""


Forbidden = Refused


class NotFound(APIError):
    """404: unknown task, endpoint, input or run (or one of another tenant: the same answer)."""


class Conflict(APIError):
    """409: a request id reused with another body, no verified artifact, no receipt, a run that
    is not cancellable or reconcilable, a task changed since the first attempt. ``slug`` tells
    which."""


class CellInProgress(Conflict):
    """409 ``cell-in-progress``: the session's previous cell is still queued or running;
    nothing was queued behind it. Wait for it, then submit again (same request id: safe)."""


class SessionClosed(Conflict):
    """409 ``session-closed``: the session was ended (``DELETE``); it takes no cell."""


class SessionExpired(Conflict):
    """409 ``session-expired``: the session's lifetime passed; it takes no cell."""


class SessionCellLimit(Conflict):
    """409 ``session-cell-limit``: the session ran its task's ``session.max_cells``."""


class CheckpointInvalid(Conflict):
    """409 ``checkpoint-invalid``: the session's checkpoint no longer matches its stored bytes
    (or is gone); nothing ran, nothing was restored."""


class Gone(APIError):
    """410: outputs or logs deleted by retention."""


class CheckpointGone(Gone):
    """410 ``checkpoint-gone``: a fork from a cell whose checkpoint is no longer kept (only a
    session's most recent ``session.keep_checkpoints`` cells keep theirs)."""


class TooLarge(APIError):
    """413: the body is larger than the service accepts."""


class InputMismatch(APIError):
    """422: the inputs do not match the task (count, media type, size)."""


class RateLimited(APIError):
    """429: every run slot and the queue are full; retry after ``retry_after`` seconds (the
    same request id is safe to resubmit)."""

    @property
    def retry_after(self) -> Optional[float]:
        """The ``Retry-After`` header, in seconds (``None`` when absent)."""
        return _retry_after(self.headers)


class Unavailable(APIError):
    """503: the database cannot be reached right now, or too many followers on this node."""

    @property
    def retry_after(self) -> Optional[float]:
        """The ``Retry-After`` header, in seconds (``None`` when absent)."""
        return _retry_after(self.headers)


class ServerError(APIError):
    """500 and any other status: an internal error (the detail is in the service's log)."""


class SessionsUnsupported(ServerError):
    """501 ``sessions-unsupported``: the service's store has no sessions in this version
    (PostgreSQL)."""


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    v = headers.get("retry-after")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


class Timeout(AgentjailError, TimeoutError):
    """A deadline passed; see the two kinds below."""


class WaitTimeout(Timeout):
    """The run did not end within the ``timeout`` given to ``wait``/``run``. The run goes on
    on the service: wait again, follow it, or cancel it (``request_id``)."""

    def __init__(self, request_id: str, timeout: float, last: Optional["Run"] = None) -> None:
        self.request_id = request_id
        self.timeout = timeout
        #: The run as last seen (``queued`` or ``running``).
        self.last = last
        super().__init__("run %s did not end within %gs" % (request_id, timeout))


class TransportTimeout(Timeout):
    """An HTTP request timed out (connect, read or write): the service did not answer in
    time. Resubmitting a run with the same request id is safe."""


class TransportError(AgentjailError):
    """The service could not be reached or the connection broke."""


class StreamError(AgentjailError):
    """An event stream broke and could not be resumed, or the service sent something that is
    not a valid event."""


class RunFailed(AgentjailError):
    """A run ended with a status other than ``ok`` (raised by ``Run.raise_for_status``)."""

    def __init__(self, run: "Run") -> None:
        self.run = run
        msg = "run %s ended %s" % (run.request_id, run.status)
        if run.reason:
            msg += ": " + run.reason
        tail = run.stderr_tail.strip()
        if tail:
            msg += "\n--- stderr (tail, untrusted)\n" + tail[-2000:]
        super().__init__(msg)


_BY_STATUS: Dict[int, Type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Refused,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: TooLarge,
    422: InputMismatch,
    429: RateLimited,
    503: Unavailable,
}


_BY_SLUG: Dict[str, Type[APIError]] = {
    "cell-in-progress": CellInProgress,
    "session-closed": SessionClosed,
    "session-expired": SessionExpired,
    "session-cell-limit": SessionCellLimit,
    "checkpoint-invalid": CheckpointInvalid,
    "checkpoint-gone": CheckpointGone,
    "sessions-unsupported": SessionsUnsupported,
}


def error_for(status: int, problem: Mapping[str, Any], headers: Mapping[str, str]) -> APIError:
    """The exception for an error answer: by its problem type when it has its own class (a
    subclass of the status's), else by its status."""
    t = str(problem.get("type", ""))
    by_slug = _BY_SLUG.get(t[len(PROBLEM_BASE) :]) if t.startswith(PROBLEM_BASE) else None
    if by_slug is not None:
        return by_slug(status, problem, headers)
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else APIError
    return cls(status, problem, headers)

"""The Python client of agentjail's HTTP service (``agentjail serve``).

>>> import agentjail
>>> client = agentjail.Client()          # $AGENTJAIL_URL, $AGENTJAIL_TOKEN
>>> data = client.upload("report.csv")   # doctest: +SKIP
>>> run = client.run("summarize_csv", [data], code=CODE)  # doctest: +SKIP
>>> run.raise_for_status().artifact      # doctest: +SKIP

:class:`Client` and :class:`AsyncClient` cover the API (inputs, runs, live events, logs,
artifacts, receipts, tasks, sessions and their cells); :func:`verify` checks a receipt
offline, :func:`verify_session` a session's receipt chain. Errors are typed
(:class:`APIError` and its subclasses, carrying the problem-details body); a run that ended
badly is a :class:`Run` whose ``ok`` is false. The data models (``agentjail.models``) are
generated from the service's OpenAPI document. docs/client-python.md is the guide.
"""

from ._async_client import AsyncClient
from ._client import Client
from ._errors import (
    AgentjailError,
    APIError,
    BadRequest,
    CellInProgress,
    CheckpointGone,
    CheckpointInvalid,
    Conflict,
    Forbidden,
    Gone,
    InputMismatch,
    NotFound,
    RateLimited,
    Refused,
    RunFailed,
    ServerError,
    SessionCellLimit,
    SessionClosed,
    SessionExpired,
    SessionsUnsupported,
    StreamError,
    Timeout,
    TooLarge,
    TransportError,
    TransportTimeout,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from ._run import Cell, CellPage, Event, Input, Log, Run, RunPage
from ._session import AsyncSession, Session
from ._verify import (
    VerificationError,
    VerifiedReceipt,
    canonical_json,
    receipt_digest,
    verify,
    verify_session,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "Event",
    "Input",
    "Log",
    "Run",
    "RunPage",
    "Cell",
    "CellPage",
    "Session",
    "AsyncSession",
    "verify",
    "verify_session",
    "receipt_digest",
    "canonical_json",
    "VerifiedReceipt",
    "VerificationError",
    "AgentjailError",
    "APIError",
    "BadRequest",
    "Conflict",
    "CellInProgress",
    "SessionClosed",
    "SessionExpired",
    "SessionCellLimit",
    "CheckpointInvalid",
    "CheckpointGone",
    "SessionsUnsupported",
    "Forbidden",
    "Gone",
    "InputMismatch",
    "NotFound",
    "RateLimited",
    "Refused",
    "RunFailed",
    "ServerError",
    "StreamError",
    "Timeout",
    "TooLarge",
    "TransportError",
    "TransportTimeout",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
]

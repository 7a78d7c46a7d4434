"""What the sync and async clients share about HTTP: configuration, turning a :class:`Call`
into httpx request arguments, and httpx's exceptions into this package's."""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Union

import httpx

from ._core import DEFAULT_URL, Answer, Call
from ._errors import AgentjailError, TransportError, TransportTimeout

#: The client's default timeouts: 10 s to connect, 60 s for an answer. A call that waits for
#: a run (``run``, ``wait``, ``cancel``, ``events``) reads without a limit unless given one.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
TimeoutArg = Union[float, httpx.Timeout, None]


class Config:
    """The settings both clients share."""

    def __init__(
        self,
        base_url: Optional[str],
        token: Optional[str],
        timeout: TimeoutArg,
        headers: Optional[Mapping[str, str]],
        retries: int = 2,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.retries = retries
        url = base_url or os.environ.get("AGENTJAIL_URL") or DEFAULT_URL
        token = token if token is not None else os.environ.get("AGENTJAIL_TOKEN")
        self.base_url = url.rstrip("/")
        self.headers: Dict[str, str] = {"user-agent": "agentjail-python"}
        if token:
            self.headers["authorization"] = "Bearer " + token
        self.headers.update(headers or {})
        if timeout is None:
            self.timeout = DEFAULT_TIMEOUT
        elif isinstance(timeout, httpx.Timeout):
            self.timeout = timeout
        else:
            self.timeout = httpx.Timeout(timeout)

    def request_args(self, call: Call) -> Dict[str, Any]:
        """The keyword arguments of ``httpx.Client.build_request`` for ``call``."""
        # The whole URL and every header per request, so that a caller's own httpx client
        # (proxies, TLS, transports) needs no base URL or token of its own.
        args: Dict[str, Any] = {
            "method": call.method,
            "url": self.base_url + call.path,
            "params": call.params or None,
            "headers": {**self.headers, **call.headers},
        }
        if call.json is not None:
            args["json"] = call.json
        elif call.content is not None:
            args["content"] = call.content
        t = self.timeout
        args["timeout"] = (
            httpx.Timeout(t.connect, read=None, write=t.write, pool=t.pool) if call.long else t
        )
        return args


def answer(r: httpx.Response) -> Answer:
    return Answer(status=r.status_code, headers=r.headers, content=r.content)


def translate(e: Exception) -> AgentjailError:
    """This package's exception for an httpx one."""
    if isinstance(e, httpx.TimeoutException):
        return TransportTimeout("%s: %s" % (type(e).__name__, e or "timed out"))
    return TransportError("%s: %s" % (type(e).__name__, e))

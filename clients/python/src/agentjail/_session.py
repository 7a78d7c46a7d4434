"""Sessions: a sequence of cells sharing a persistent ``/work`` (``/v1/sessions``).

:class:`Session` and :class:`AsyncSession` are handles on one session, made by
``Client.session`` / ``AsyncClient.session`` (or ``get_session``); they drive the same
I/O-free operations of ``_core`` as the rest of the clients.
"""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Iterator,
    List,
    Mapping,
    Optional,
)

from . import _core as core
from ._models import SessionView
from ._run import Cell, CellPage
from ._verify import KeyArg, VerifiedReceipt, verify_session

if TYPE_CHECKING:
    from ._async_client import AsyncClient
    from ._client import Client


class _SessionBase:
    view: SessionView

    @property
    def session_id(self) -> str:
        return self.view["session_id"]

    @property
    def task(self) -> str:
        return self.view["task"]

    @property
    def state(self) -> str:
        """``open``, ``closed`` or ``expired`` (as last read: :meth:`refresh`)."""
        return self.view["state"]

    @property
    def request_id(self) -> str:
        """The request id it was opened with (execute-once per tenant)."""
        return self.view["request_id"]

    @property
    def workspace_sha256(self) -> Optional[str]:
        """The checkpoint the next cell starts from (``None``: an empty ``/work``)."""
        return self.view.get("workspace_sha256")

    def __repr__(self) -> str:
        return "%s(session_id=%r, task=%r, state=%r)" % (
            type(self).__name__,
            self.session_id,
            self.task,
            self.state,
        )


class Session(_SessionBase):
    """A session of the synchronous :class:`~agentjail.Client`. A context manager: ``with
    client.session(task=...) as s: s.run("...")`` ends the session (``DELETE``) at exit."""

    def __init__(self, client: "Client", view: SessionView) -> None:
        self._client = client
        self.view = view

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        code: str,
        *,
        request_id: Optional[str] = None,
        wait: bool = True,
        timeout: Optional[float] = None,
    ) -> Cell:
        """Runs the next cell and (``wait``) waits for its end; returns the :class:`Cell`
        whatever its status. ``request_id`` (a fresh UUID4 when not given) makes the step
        execute-once: the same id and code again returns the recorded cell and runs nothing.
        ``timeout`` bounds the wait (:class:`WaitTimeout`; the cell goes on)."""
        return self._client.run_cell(
            self.session_id, code, request_id=request_id, wait=wait, timeout=timeout
        )

    def cells(self, *, page_size: Optional[int] = None) -> Iterator[Cell]:
        """Every cell of the session, in order, page after page."""
        return self._client.cells(self.session_id, page_size=page_size)

    def cells_page(self, *, limit: Optional[int] = None, cursor: Optional[str] = None) -> CellPage:
        """One page of the session's cells."""
        return self._client.cells_page(self.session_id, limit=limit, cursor=cursor)

    def refresh(self) -> "Session":
        """Reads the session again (``GET``); returns it."""
        self.view = self._client.get_session(self.session_id).view
        return self

    def fork(self, *, cell: Optional[int] = None, request_id: Optional[str] = None) -> "Session":
        """A new session of the same owner, task and inputs that starts from the workspace
        as ``cell`` left it (default: the head)."""
        return self._client.fork_session(self.session_id, cell=cell, request_id=request_id)

    def checkpoint(self) -> Optional[str]:
        """Checkpoints the workspace now and returns its digest (``sha256:…``; None for an
        empty one). A live session's interpreter keeps running: its variables survive, and a
        fork from the last cell starts from this checkpoint. Raises
        :class:`~agentjail.Conflict` (``checkpoint-invalid``) when none could be taken."""
        self.view = self._client.checkpoint_session(self.session_id).view
        return self.view.get("workspace_sha256")

    def close(self) -> None:
        """Ends the session (idempotent; a cell still running is cancelled)."""
        self.view = self._client.close_session(self.session_id).view

    def verify_chain(
        self, public_key: KeyArg, *, previous: Optional[str] = None
    ) -> List[VerifiedReceipt]:
        """Verifies every cell's receipt offline and the chain between them
        (:func:`agentjail.verify_session`); ``previous`` is what the first cell's receipt
        must name (a forked session: the receipt digest of the cell it was forked from)."""
        return verify_session(
            [c.receipt for c in self.cells()],
            public_key=public_key,
            session_id=self.session_id,
            previous=previous,
        )


class AsyncSession(_SessionBase):
    """A session of the :class:`~agentjail.AsyncClient`: the methods of :class:`Session`,
    awaited; ``async with`` ends it at exit."""

    def __init__(self, client: "AsyncClient", view: SessionView) -> None:
        self._client = client
        self.view = view

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(
        self,
        code: str,
        *,
        request_id: Optional[str] = None,
        wait: bool = True,
        timeout: Optional[float] = None,
    ) -> Cell:
        """Runs the next cell (execute-once by ``request_id``)."""
        return await self._client.run_cell(
            self.session_id, code, request_id=request_id, wait=wait, timeout=timeout
        )

    def cells(self, *, page_size: Optional[int] = None) -> AsyncIterator[Cell]:
        """Every cell of the session, in order."""
        return self._client.cells(self.session_id, page_size=page_size)

    async def cells_page(
        self, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> CellPage:
        """One page of the session's cells."""
        return await self._client.cells_page(self.session_id, limit=limit, cursor=cursor)

    async def refresh(self) -> "AsyncSession":
        """Reads the session again."""
        self.view = (await self._client.get_session(self.session_id)).view
        return self

    async def fork(
        self, *, cell: Optional[int] = None, request_id: Optional[str] = None
    ) -> "AsyncSession":
        """A new session from a checkpoint of this one."""
        return await self._client.fork_session(self.session_id, cell=cell, request_id=request_id)

    async def checkpoint(self) -> Optional[str]:
        """Checkpoints the workspace now; returns its digest."""
        self.view = (await self._client.checkpoint_session(self.session_id)).view
        return self.view.get("workspace_sha256")

    async def close(self) -> None:
        """Ends the session (idempotent)."""
        self.view = (await self._client.close_session(self.session_id)).view

    async def verify_chain(
        self, public_key: KeyArg, *, previous: Optional[str] = None
    ) -> List[VerifiedReceipt]:
        """Verifies every cell's receipt and the chain between them."""
        receipts: List[Optional[Mapping[str, Any]]] = []
        async for c in self.cells():
            receipts.append(c.receipt)
        return verify_session(
            receipts, public_key=public_key, session_id=self.session_id, previous=previous
        )


__all__ = ["Session", "AsyncSession"]

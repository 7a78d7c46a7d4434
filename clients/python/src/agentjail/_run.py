"""The results the client returns: a run, an uploaded input, a log, a live event, a page."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, cast

from ._errors import RunFailed
from ._models import RunSummary, RunView

#: Statuses of a run that has not ended.
PENDING = frozenset({"queued", "running"})


class Run:
    """A run record (``GET /v1/runs/{request_id}``) with what a caller branches on.

    ``record`` is the record as the service sent it (a :class:`agentjail.models.RunView`).
    A run that ended badly is not an exception: check ``ok`` (or call
    :meth:`raise_for_status`), then ``status``, ``reason``, ``stderr_tail`` and ``denials``.
    What the sandbox wrote (``stdout``/``stderr``/``stderr_tail``) is untrusted data.
    """

    __slots__ = ("record",)

    def __init__(self, record: RunView) -> None:
        self.record = record

    def __repr__(self) -> str:
        return "Run(request_id=%r, task=%r, status=%r)" % (
            self.request_id,
            self.task,
            self.status,
        )

    @property
    def request_id(self) -> str:
        """The run's request id (execute-once: the same id returns this run)."""
        return self.record["request_id"]

    @property
    def task(self) -> str:
        """The task type it ran."""
        return self.record["task"]

    @property
    def status(self) -> str:
        """``queued``, ``running``, ``ok``, ``exit_nonzero``, ``signaled``, ``timeout``,
        ``memory_limit``, ``output_rejected``, ``setup_error``, ``expired``, ``unknown``,
        ``abandoned`` or ``cancelled``."""
        return str(self.record["status"])

    @property
    def reason(self) -> Optional[str]:
        """Why it ended so, in a line (for a status other than ``ok``)."""
        return self.record.get("reason")

    @property
    def finished(self) -> bool:
        """True once the run has a final status."""
        return self.status not in PENDING

    @property
    def ok(self) -> bool:
        """True when the command exited 0 and its output passed verification."""
        return self.status == "ok"

    @property
    def exit_code(self) -> Optional[int]:
        """The command's exit code, from the report (``None`` if it did not exit)."""
        code = self.report.get("exit_code")
        return code if isinstance(code, int) else None

    @property
    def report(self) -> Dict[str, Any]:
        """The run report (``agentjail report --schema``); empty while the run is pending."""
        r = self.record.get("report")
        return r if isinstance(r, dict) else {}

    @property
    def denials(self) -> List[Dict[str, Any]]:
        """Every refusal the report lists: ``[{kind, detail, count, …}]`` (``kind``:
        ``syscall``, ``filesystem``, ``network``, ``limit``, ``output``)."""
        d = self.report.get("denials")
        return [x for x in d if isinstance(x, dict)] if isinstance(d, list) else []

    def _stream(self, which: str) -> str:
        v = self.record.get(which)
        if not isinstance(v, dict):
            return ""
        head, tail = str(v.get("head", "")), str(v.get("tail", ""))
        omitted = v.get("omitted_bytes", 0)
        if omitted:
            return "%s\n[… %s bytes omitted …]\n%s" % (head, omitted, tail)
        return head + tail

    @property
    def stdout(self) -> str:
        """What the command wrote to stdout, as the record shows it (head and tail of the
        task's budget, made safe to show). Untrusted. :meth:`Client.logs` has it whole."""
        return self._stream("stdout")

    @property
    def stderr(self) -> str:
        """What the command wrote to stderr, as the record shows it. Untrusted."""
        return self._stream("stderr")

    @property
    def stderr_tail(self) -> str:
        """The end of stderr (where a traceback is), at most 4000 characters. Untrusted."""
        return self.stderr[-4000:]

    @property
    def artifact(self) -> Any:
        """The verified artifact (only when ``ok``): parsed JSON for a JSON artifact, else
        its bytes; ``None`` when there is none."""
        a = self.record.get("artifact")
        if not isinstance(a, dict):
            return None
        if "json" in a:
            return a["json"]
        if "base64" in a:
            return base64.b64decode(str(a["base64"]))
        return None

    @property
    def artifact_bytes(self) -> Optional[bytes]:
        """The verified artifact's bytes as the record carries them (JSON re-serialized)."""
        a = self.record.get("artifact")
        if not isinstance(a, dict):
            return None
        if "base64" in a:
            return base64.b64decode(str(a["base64"]))
        if "json" in a:
            return json.dumps(a["json"]).encode()
        return None

    @property
    def receipt(self) -> Optional[Dict[str, Any]]:
        """The signed receipt (a DSSE envelope), for :func:`agentjail.verify`."""
        r = self.record.get("receipt")
        return r if isinstance(r, dict) else None

    def raise_for_status(self) -> "Run":
        """Raises :class:`RunFailed` (carrying this run) unless the run ended ``ok``;
        returns the run otherwise, so that ``client.run(...).raise_for_status().artifact``
        reads in one line."""
        if not self.ok:
            raise RunFailed(self)
        return self


@dataclass(frozen=True)
class Input:
    """An uploaded input (``POST /v1/inputs``): pass it, or its ``input_id``, to a run."""

    input_id: str
    sha256: str
    bytes: int
    name: str
    media_type: str
    expires_at: Optional[str] = None


@dataclass(frozen=True)
class Log:
    """A run's retained log of one stream (untrusted bytes)."""

    data: bytes
    #: The digest the record and the receipt carry (``sha256:…``); ``None`` when masked.
    sha256: Optional[str]
    #: How many secret values were overwritten with ``*``.
    masked: int

    @property
    def text(self) -> str:
        """The log's bytes as text (invalid UTF-8 replaced; untrusted: the sandbox wrote it)."""
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class Event:
    """One live event of a run (``GET /v1/runs/{request_id}/events``).

    ``event`` is ``queued``, ``started``, ``stdout``, ``stderr``, ``denial`` or ``ended``;
    ``id`` is the follower's position (give it back as ``last_event_id`` to resume after it);
    ``data`` is the parsed JSON data.
    """

    event: str
    id: str
    data: Dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """A chunk's text (``stdout``/``stderr``; untrusted), else ``""``."""
        return str(self.data.get("text", "")) if self.event in ("stdout", "stderr") else ""

    @property
    def offset(self) -> int:
        """A chunk's offset in its stream, else 0."""
        v = self.data.get("offset", 0)
        return v if isinstance(v, int) else 0

    @property
    def run(self) -> Optional[Run]:
        """The final run record, on ``ended``."""
        return Run(cast(RunView, self.data)) if self.event == "ended" else None


@dataclass(frozen=True)
class RunPage:
    """One page of ``GET /v1/runs``."""

    runs: List[RunSummary]
    next_cursor: Optional[str]


class Cell(Run):
    """One cell of a session (``POST /v1/sessions/{session_id}/cells``): a run in its own
    right (its ``request_id`` is ``<session_id>-<cell>``, with its record, logs, events and
    receipt) and its place in the session. As for a run, a cell that ended badly is a result:
    check ``ok``, ``status``, ``stderr_tail``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Cell(session_id=%r, cell=%r, status=%r)" % (
            self.session_id,
            self.cell,
            self.status,
        )

    @property
    def session_id(self) -> str:
        """The session the cell belongs to."""
        return str(self._raw.get("session_id", ""))

    @property
    def cell(self) -> int:
        """Its index in the session, from 0."""
        v = self._raw.get("cell")
        return v if isinstance(v, int) else -1

    @property
    def cell_request_id(self) -> str:
        """The step's request id (execute-once within the session)."""
        return str(self._raw.get("cell_request_id", ""))

    @property
    def workspace(self) -> Dict[str, Optional[str]]:
        """``{before, after}``: the checkpoints (``sha256:…``) restored into ``/work`` and
        collected after it (``None``: empty, or none kept)."""
        w = self._raw.get("workspace")
        if not isinstance(w, dict):
            return {"before": None, "after": None}
        return {"before": w.get("before"), "after": w.get("after")}

    @property
    def workspace_before(self) -> Optional[str]:
        """The checkpoint (``sha256:…``) restored into ``/work`` before the cell, or ``None``."""
        return self.workspace["before"]

    @property
    def workspace_after(self) -> Optional[str]:
        """The checkpoint collected after the cell, or ``None`` (empty, none kept, or a live
        cell: its workspace is collected when the interpreter's run ends)."""
        return self.workspace["after"]

    @property
    def _raw(self) -> Dict[str, Any]:
        return cast(Dict[str, Any], self.record)


@dataclass(frozen=True)
class CellPage:
    """One page of ``GET /v1/sessions/{session_id}/cells``, in order."""

    cells: List[Cell]
    next_cursor: Optional[str]

"""The client's tests run against a real `agentjail serve`, started by
crates/cli/tests/client_python.rs, which sets:

- AGENTJAIL_URL, AGENTJAIL_TOKEN (actor alice of tenant acme), AGENTJAIL_OPS_TOKEN (an
  operator of acme);
- AGENTJAIL_PUBKEY: the service's receipt public key (PEM file);
- AGENTJAIL_EXAMPLE: examples/csv-summary (report.csv, summarize.py);
- AGENTJAIL_BIN: the agentjail binary (its `receipt verify`, to compare verdicts with);
- AGENTJAIL_BUSY_URL: a second service with the same actors and tasks, one run slot and no
  queue (429 as soon as a run is running).

Its tasks: `summarize_csv` (the seed's), `py` (model-proposed Python at /input/code.py, an
`o.json` output, 60 s), `agent` (the agent frameworks' tasks: model-proposed Python over one
CSV at /input/data.csv, sessions of 50 cells), `tiny` (two cells a session). Without these variables the tests are skipped, except under CI (`CI`
set), where that is a failure.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

import agentjail

NEEDED = [
    "AGENTJAIL_URL",
    "AGENTJAIL_TOKEN",
    "AGENTJAIL_OPS_TOKEN",
    "AGENTJAIL_PUBKEY",
    "AGENTJAIL_EXAMPLE",
    "AGENTJAIL_BIN",
    "AGENTJAIL_BUSY_URL",
]


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    missing = [v for v in NEEDED if not os.environ.get(v)]
    if not missing:
        return
    why = (
        "no agentjail serve to test against (%s unset): run crates/cli/tests/client_python.rs"
        % ", ".join(missing)
    )
    if os.environ.get("CI"):
        raise pytest.UsageError("prerequisite missing under CI: " + why)
    for item in items:
        item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def client() -> Iterator[agentjail.Client]:
    with agentjail.Client() as c:
        yield c


@pytest.fixture
def ops() -> Iterator[agentjail.Client]:
    with agentjail.Client(token=os.environ["AGENTJAIL_OPS_TOKEN"]) as c:
        yield c


@pytest.fixture
def example() -> Path:
    return Path(os.environ["AGENTJAIL_EXAMPLE"])


@pytest.fixture
def pubkey() -> Path:
    return Path(os.environ["AGENTJAIL_PUBKEY"])


# The first step of the agent frameworks' tool tests (test_langchain.py, test_openai_agents.py):
# revenue by region from the CSV, kept in /work/revenue.json (the cell's working directory).
READ_REVENUE = """import csv, json
rows = list(csv.DictReader(open('/input/data.csv')))
revenue = {}
for r in rows:
    if r['revenue']:
        revenue[r['region']] = revenue.get(r['region'], 0.0) + float(r['revenue'])
json.dump(revenue, open('revenue.json', 'w'))
"""


def rid(prefix: str) -> str:
    """A request id no other test run used."""
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


class CuttingProxy:
    """A loopback TCP proxy in front of the service that breaks each of its first `cuts`
    connections once `after` bytes of the answer went through: a dropped connection, for
    real, in the middle of an event stream."""

    def __init__(self, upstream: str, cuts: int, after: int) -> None:
        host, port = upstream.rsplit("//", 1)[-1].rsplit(":", 1)
        self.upstream: Tuple[str, int] = (host, int(port))
        self.cuts, self.after = cuts, after
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            cut = self.connections <= self.cuts
            up = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(down, up, None), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(up, down, self.after if cut else None), daemon=True
            ).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, limit: "int | None") -> None:
        sent = 0
        try:
            while True:
                data = src.recv(4096 if limit is None else max(1, min(4096, limit - sent)))
                if not data:
                    break
                dst.sendall(data)
                sent += len(data)
                if limit is not None and sent >= limit:
                    break
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.sock.close()

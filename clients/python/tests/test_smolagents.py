"""The smolagents executor (agentjail.integrations.smolagents) against a real service, with no
model and no network: a scripted ``Model`` returns a fixed sequence of code steps, and a
``CodeAgent`` runs them through ``AgentjailExecutor``, each as one cell of one session.

It runs on the SQLite and the PostgreSQL pass alike. Under CI
(``CI`` set) smolagents must be importable (``.ci/run`` pins it); elsewhere, without it, this
module is skipped (crates/cli/tests/client_python.rs leaves it out and says so).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional

import pytest

try:
    import smolagents  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("smolagents is not installed", allow_module_level=True)

from smolagents import ActionStep, CodeAgent
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import TokenUsage

import agentjail
from agentjail.integrations.smolagents import STATE_FILE, AgentjailExecutor


STEP_1 = """Thought: read the CSV into a variable, keep the regions in a file of /work.
<code>
import csv
with open('/input/data.csv') as f:
    rows = list(csv.DictReader(f))
revenue = {}
for r in rows:
    if r['revenue']:
        revenue[r['region']] = revenue.get(r['region'], 0.0) + float(r['revenue'])
with open('/work/regions.txt', 'w') as f:
    f.write(','.join(sorted(revenue)))
def best(d):
    return max(d, key=d.get)
squares = (i * i for i in range(3))
print('rows:', len(rows))
</code>"""

STEP_2_FAILS = """Thought: a mistake.
<code>
print('before the error')
total = sum(revenue.values()) / undefined_name
</code>"""

STEP_3 = """Thought: use the variable, the function and the file of step 1.
<code>
regions = open('/work/regions.txt').read().split(',')
top = best(revenue)
print('regions:', regions, 'rows again:', len(rows), 'top:', top, round(revenue[top], 2))
print('above:', sorted(k for k, v in revenue.items() if v > threshold))
len(regions)
</code>"""

STEP_4 = """Thought: done.
<code>
final_answer({'top_region': top, 'revenue': round(revenue[top], 2), 'regions': len(regions)})
</code>"""


class ScriptedModel(Model):  # type: ignore[misc]
    """A model that answers with the next of a fixed list of steps (no key, no network)."""

    def __init__(self, steps: List[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = list(steps)
        self.calls = 0

    def generate(
        self,
        messages: List[Any],
        stop_sequences: Optional[List[str]] = None,
        response_format: Any = None,
        tools_to_call_from: Any = None,
        **kwargs: Any,
    ) -> ChatMessage:
        text = self.steps[self.calls]
        self.calls += 1
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            content=text,
            token_usage=TokenUsage(input_tokens=0, output_tokens=0),
        )


def test_a_code_agent_solves_a_multi_step_task_in_one_session(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    executor = AgentjailExecutor(
        additional_imports=["csv", "agentjail_no_such_package"],
        task="agent",
        inputs=[data],
        timeout=120,
    )
    model = ScriptedModel([STEP_1, STEP_2_FAILS, STEP_3, STEP_4])
    with CodeAgent(tools=[], model=model, executor=executor, max_steps=6) as agent:
        # `threshold` reaches the sandbox through send_variables (smolagents' additional_args).
        answer = agent.run(
            "Which region has the most revenue?", additional_args={"threshold": 100.0}
        )
        steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
        session_id = executor.session.session_id

        assert answer == {"top_region": "west", "revenue": 198.0, "regions": 4}
        assert model.calls == 4 and len(steps) == 4
        # Step 1: its logs are the cell's stdout, with what the executor has to say: the
        # import the sandbox lacks, and the generator that could not be kept.
        obs1 = steps[0].observations or ""
        assert "rows: 8" in obs1
        assert "cannot import: agentjail_no_such_package" in obs1
        assert "not kept for the next step" in obs1 and "squares" in obs1
        # Step 2 failed: the agent saw the sandbox's traceback and went on.
        assert steps[1].error is not None and "NameError" in str(steps[1].error)
        assert "undefined_name" in str(steps[1].error)
        # Step 3 saw step 1's variable, its function and its file; its last expression is
        # the step's output.
        obs3 = steps[2].observations or ""
        assert "regions: ['east', 'north', 'south', 'west']" in obs3
        assert "rows again: 8" in obs3 and "top: west 198.0" in obs3
        assert "above: ['east', 'south', 'west']" in obs3
        assert steps[2].action_output == "4"
        assert steps[3].is_final_answer

    # Each step was one cell of the session, in order; the failed one a result, not lost.
    cells = list(client.cells(session_id))
    assert [c.cell for c in cells] == [0, 1, 2, 3]
    assert [c.status for c in cells] == ["ok", "exit_nonzero", "ok", "ok"]
    assert [c.request_id for c in cells] == [c.request_id for c in executor.cells]
    assert all(c.workspace_after for c in cells)
    # The state is in the workspace, not in the output: the output is the executor's report.
    assert set(cells[0].artifact) >= {"final_answer", "skipped", "missing_imports"}
    assert "rows" not in str(cells[0].artifact)
    assert STATE_FILE.startswith("/work/")
    # cleanup() ended the session the executor opened.
    assert client.get_session(session_id).state == "closed"


def test_a_retried_step_runs_once(client: agentjail.Client, example: Path) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    with client.session("agent", [data]) as s:
        executor = AgentjailExecutor(session=s)
        out = executor("n = 1\nprint('ran', n)")
        assert out.logs.startswith("ran 1") and not out.is_final_answer
        # A retry of the step (its program under its request id, as the executor resends it
        # after a broken connection) returns the recorded cell and runs nothing.
        assert executor.last_step is not None
        program, request_id = executor.last_step
        again = s.run(program, request_id=request_id)
        assert again.cell == 0 and again.record["job_id"] == executor.cells[0].record["job_id"]
        assert s.refresh().view["cells"] == 1
        executor.cleanup()  # an open session given is not closed by the executor
        assert s.refresh().state == "open"


LIVE_STEP_1 = """Thought: keep what a pickling executor could not: a generator, a lambda, a module.
<code>
import csv, itertools
with open('/input/data.csv') as f:
    rows = list(csv.DictReader(f))
counter = itertools.count(1)
squares = (i * i for i in range(10))
rev = lambda r: float(r['revenue'] or 0)
print('rows:', len(rows), 'first square:', next(squares), 'tick:', next(counter))
</code>"""

LIVE_STEP_2 = """Thought: the same objects, where the last step left them.
<code>
import os
print('next square:', next(squares), 'tick:', next(counter))
print('state files:', sorted(n for n in os.listdir('/work') if n.startswith('.agentjail')))
best = max(rows, key=rev)
best['region']
</code>"""

LIVE_STEP_3 = """Thought: done.
<code>
final_answer({'top_row_region': best['region'], 'tick': next(counter)})
</code>"""


def test_a_code_agent_keeps_its_objects_in_a_live_session_without_pickling(
    client: agentjail.Client, example: Path
) -> None:
    # On either store: on PostgreSQL the session's interpreter is held by one executor.
    data = client.upload(example / "report.csv", name="report.csv")
    executor = AgentjailExecutor(task="agent_live", inputs=[data], timeout=120)
    assert executor.live
    model = ScriptedModel([LIVE_STEP_1, LIVE_STEP_2, LIVE_STEP_3])
    with CodeAgent(tools=[], model=model, executor=executor, max_steps=4) as agent:
        answer = agent.run("Which row has the most revenue?")
        steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
        session_id = executor.session.session_id
        assert model.calls == 3 and len(steps) == 3
        obs1 = steps[0].observations or ""
        assert "rows: 8 first square: 0 tick: 1" in obs1, obs1
        assert "agentjail-step" not in obs1 and "not kept" not in obs1
        # The generator and the counter went on from where step 1 left them: nothing was
        # pickled (a generator cannot be), nothing replayed, no state file was written.
        obs2 = steps[1].observations or ""
        assert "next square: 1 tick: 2" in obs2, obs2
        assert "state files: []" in obs2, obs2
        assert steps[1].action_output == "'west'"
        assert steps[2].is_final_answer
        assert answer == {"top_row_region": "west", "tick": 3}
    cells = list(client.cells(session_id))
    assert [c.status for c in cells] == ["ok", "ok", "ok"]
    assert client.get_session(session_id).state == "closed"

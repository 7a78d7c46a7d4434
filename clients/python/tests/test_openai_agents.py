"""The OpenAI Agents SDK tool (agentjail.integrations.openai_agents) against a real service,
with no model key and no network: a scripted ``Model`` of the SDK's interface answers with
tool calls, reading the tool outputs it got back, and ``Runner`` runs them through
``AgentjailPython.tool``, each as one cell of one session.

Sessions work on either store (SQLite or PostgreSQL). Under CI
(``CI`` set) openai-agents must be importable (``.ci/run`` pins it); elsewhere, without it,
this module is skipped (crates/cli/tests/client_python.rs leaves it out and says so).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

import pytest

try:
    import agents  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("openai-agents is not installed", allow_module_level=True)

from agents import Agent, ModelResponse, ModelSettings, RunConfig, Runner, Usage
from agents.models.interface import Model, ModelTracing
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import agentjail
from conftest import READ_REVENUE
from agentjail.integrations.openai_agents import AgentjailPython


READ = READ_REVENUE + """print('rows:', len(rows), 'regions:', len(revenue))
"""
TYPO = "import json\nrevenue = json.load(open('/work/revenu.json'))\n"
TOP = """import json
revenue = json.load(open('/work/revenue.json'))
top = max(revenue, key=revenue.get)
open('answer.txt', 'w').write(top)
(top, round(revenue[top], 2))
"""
LIST = "import os\nsorted(os.listdir('.'))\n"

Step = Callable[[List[Dict[str, Any]]], List[Any]]


def call(call_id: str, code: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id="fc_" + call_id,
        call_id=call_id,
        type="function_call",
        name="python",
        arguments=json.dumps({"code": code}),
        status="completed",
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_final",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def outputs(items: List[Dict[str, Any]]) -> Dict[str, str]:
    """The tool outputs the model got back, by call id."""
    return {
        i["call_id"]: str(i["output"])
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    }


class ScriptedModel(Model):
    """A model of the SDK's interface that answers with the next of a fixed list of steps;
    each step sees the conversation so far (the tool outputs included). No key, no network."""

    def __init__(self, steps: List[Step]) -> None:
        self.steps = list(steps)
        self.calls = 0
        self.tools_seen: List[List[str]] = []

    async def get_response(
        self,
        system_instructions: Optional[str],
        input: Any,
        model_settings: ModelSettings,
        tools: List[Any],
        output_schema: Any,
        handoffs: List[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: Optional[str],
        conversation_id: Optional[str],
        prompt: Any,
    ) -> ModelResponse:
        self.tools_seen.append([t.name for t in tools])
        items = input if isinstance(input, list) else []
        step = self.steps[self.calls]
        self.calls += 1
        return ModelResponse(output=step(items), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def answer(items: List[Dict[str, Any]]) -> List[Any]:
    """The last step: the answer, taken from what the sandbox printed."""
    seen = outputs(items)
    m = re.search(r"Out: \('(\w+)', ([0-9.]+)\)", seen["call_top"])
    assert m is not None, seen
    return [say("%s: %s" % (m.group(1), m.group(2)))]


def test_an_agent_solves_a_multi_step_task_in_one_session(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    asyncio.run(scenario(client, data))


async def scenario(client: agentjail.Client, data: agentjail.Input) -> None:
    model = ScriptedModel(
        [
            lambda items: [call("call_read", READ)],
            # The model reads the first output, then makes a mistake.
            lambda items: (
                [call("call_typo", TYPO)] if "rows: 8" in outputs(items)["call_read"] else []
            ),
            # Two calls in one turn (the SDK runs them concurrently): one cell at a time.
            lambda items: [call("call_top", TOP), call("call_ls", LIST)],
            answer,
        ]
    )
    async with await AgentjailPython.open("agent", [data], timeout=120) as python:
        agent = Agent(
            name="analyst",
            instructions="Answer with the sandbox's help.",
            tools=[python.tool],
            model=model,
        )
        result = await Runner.run(
            agent,
            "Which region has the most revenue?",
            run_config=RunConfig(tracing_disabled=True),
            max_turns=8,
        )
        assert result.final_output == "west: 198.0"
        assert model.calls == 4 and model.tools_seen[0] == ["python"]
        seen = outputs([i.to_input_item() for i in result.new_items])  # type: ignore[misc]
        assert seen["call_read"].startswith("[agentjail cell 0: ok]\nrows: 8 regions: 4")
        # The mistake is an output the model reads, with the sandbox's traceback.
        assert "exit_nonzero" in seen["call_typo"]
        assert "FileNotFoundError" in seen["call_typo"] and "revenu.json" in seen["call_typo"]
        assert "Out: ('west', 198.0)" in seen["call_top"]
        assert "revenue.json" in seen["call_ls"]
        session_id = python.session.session_id
        cells = list(client.cells(session_id))
        assert [c.cell for c in cells] == [0, 1, 2, 3]
        assert [c.status for c in cells] == ["ok", "exit_nonzero", "ok", "ok"]
        assert all(c.workspace_after for c in cells)
        assert cells[0].artifact == {"value": None, "error": None}

        # A tool call sent again (same call id, same code) returns its recorded cell.
        again = await python.run(TOP, call_id="call_top")
        by_rid = {c.request_id: c.cell for c in cells}
        assert again.cell == by_rid[again.request_id] and len(list(client.cells(session_id))) == 4

        # Restore: a fork from cell 0's checkpoint has revenue.json, not answer.txt.
        async with await python.fork(cell=0) as restored:
            listing = await restored.run(LIST)
            assert listing.ok and listing.artifact["value"] == "['revenue.json']"
            assert restored.session.session_id != session_id
        after = await python.run(LIST)
        assert after.artifact["value"] == "['answer.txt', 'revenue.json']"
    assert client.get_session(session_id).state == "closed"

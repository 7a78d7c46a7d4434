"""The LangChain tool (agentjail.integrations.langchain) in a LangGraph graph, against a real
service, with no model key and no network: a scripted chat model (langchain-core's
``FakeMessagesListChatModel``) answers with a fixed sequence of tool calls, LangGraph's
``ToolNode`` runs them through ``AgentjailCodeTool``, each as one cell of one session.

Sessions work on either store (SQLite or PostgreSQL). Under CI
(``CI`` set) langchain-core and langgraph must be importable (``.ci/run`` pins them);
elsewhere, without them, this module is skipped (crates/cli/tests/client_python.rs leaves it
out and says so).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import pytest

try:
    import langchain_core  # noqa: F401
    import langgraph  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("langchain-core or langgraph is not installed", allow_module_level=True)

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agentjail
from conftest import READ_REVENUE
from agentjail.integrations.langchain import AgentjailCodeTool


READ = READ_REVENUE + """secret = 42
print('rows:', len(rows))
"""
# A variable of the previous call is gone (a fresh process): a failed cell, as an observation.
FORGETS = "print('secret is', secret)\n"
# A second call in the same message (ToolNode runs them in parallel): one cell at a time.
COUNT = "import os\nprint('files:', sorted(os.listdir('/work')))\n"
TOP = """import json
revenue = json.load(open('/work/revenue.json'))
top = max(revenue, key=revenue.get)
(top, round(revenue[top], 2))
"""


def call(name: str, code: str, call_id: str) -> Dict[str, Any]:
    return {"name": name, "args": {"code": code}, "id": call_id, "type": "tool_call"}


def graph(tool: AgentjailCodeTool, script: List[BaseMessage]) -> Any:
    model = FakeMessagesListChatModel(responses=script)

    def agent(state: MessagesState) -> Dict[str, List[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([tool]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def test_a_langgraph_agent_solves_a_multi_step_task_in_one_session(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    with AgentjailCodeTool(task="agent", inputs=[data], timeout=120) as tool:
        assert "/input/data.csv" in tool.description and "/work" in tool.description
        script: List[BaseMessage] = [
            AIMessage(content="", tool_calls=[call(tool.name, READ, "call_read")]),
            AIMessage(content="", tool_calls=[call(tool.name, FORGETS, "call_forgets")]),
            AIMessage(
                content="",
                tool_calls=[call(tool.name, TOP, "call_top"), call(tool.name, COUNT, "call_ls")],
            ),
            AIMessage(content="west has the most revenue: 198.0"),
        ]
        final = graph(tool, script).invoke(
            {"messages": [HumanMessage(content="Which region has the most revenue?")]},
            {"recursion_limit": 20},
        )
        messages = final["messages"]
        assert messages[-1].content == "west has the most revenue: 198.0"
        obs = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
        assert set(obs) == {"call_read", "call_forgets", "call_top", "call_ls"}
        # Step 1 ran over the CSV and left a file in /work.
        assert "rows: 8" in obs["call_read"].content
        assert obs["call_read"].artifact["status"] == "ok"
        # Step 2: its variable did not carry over; the model reads the traceback, the graph
        # goes on (a failed cell is an observation, not an exception).
        forgot = str(obs["call_forgets"].content)
        assert "exit_nonzero" in forgot and "NameError" in forgot and "secret" in forgot
        assert obs["call_forgets"].artifact["ok"] is False
        # Step 3: two calls in one message, each its own cell; the file of step 1 is there.
        assert "Out: ('west', 198.0)" in obs["call_top"].content
        assert "files: ['revenue.json']" in obs["call_ls"].content
        session_id = tool.session.session_id
        cells = list(client.cells(session_id))
        assert [c.cell for c in cells] == [0, 1, 2, 3]
        assert [c.status for c in cells] == ["ok", "exit_nonzero", "ok", "ok"]
        assert sorted(c.request_id for c in cells) == sorted(c.request_id for c in tool.cells)
        assert all(c.workspace_after for c in cells)
        # Nothing but the tool's report in the output (no state, nothing pickled).
        assert cells[0].artifact == {"value": None, "error": None}

        # A tool call sent again (a retried graph step) returns its recorded cell.
        again = tool.invoke(call(tool.name, TOP, "call_top"))
        assert isinstance(again, ToolMessage) and "Out: ('west', 198.0)" in again.content
        assert again.artifact["cell"] == obs["call_top"].artifact["cell"]
        assert tool.session.refresh().view["cells"] == 4
    # The `with` ended the session the tool opened.
    assert client.get_session(session_id).state == "closed"


def test_the_tool_on_a_given_session_leaves_it_open(
    client: agentjail.Client, example: Path
) -> None:
    data = client.upload(example / "report.csv", name="report.csv")
    with client.session("agent", [data]) as s:
        tool = AgentjailCodeTool(session=s, name="sandbox")
        out = tool.invoke({"code": "open('n.txt', 'w').write('7')\nprint('written')"})
        assert out == "[agentjail cell 0: ok]\nwritten"
        out = tool.invoke({"code": "int(open('n.txt').read()) * 6"})
        assert out == "[agentjail cell 1: ok]\nOut: 42"
        tool.close()
        assert s.refresh().state == "open"
    with pytest.raises(ValueError):
        AgentjailCodeTool(client=client, task="no_such_task")

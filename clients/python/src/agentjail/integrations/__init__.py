"""Executors and tools for agent frameworks, each in its own module, each importing its
framework only when imported: ``agentjail.integrations.smolagents`` (``AgentjailExecutor``, a
``CodeAgent`` executor), ``agentjail.integrations.langchain`` (``AgentjailCodeTool``, a LangChain
tool for LangGraph's ``ToolNode`` or ``bind_tools``) and ``agentjail.integrations.openai_agents``
(``AgentjailSandboxClient``, a sandbox provider for the OpenAI Agents SDK's ``SandboxAgent``,
and ``AgentjailPython``, a function tool of the SDK)."""

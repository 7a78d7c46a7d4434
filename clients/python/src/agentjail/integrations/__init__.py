"""Executors for agent frameworks, each in its own module, each importing its framework only
when imported: ``agentjail.integrations.smolagents`` (``AgentjailExecutor``)."""

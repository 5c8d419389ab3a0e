"""sessiondb's Python client: the HTTP API (``Client``) and framework adapters
(``sessiondb.openai_agents``, ``sessiondb.claude_agent_sdk``, ``sessiondb.langgraph``,
``sessiondb.langchain``, ``sessiondb.pydantic_ai``, ``sessiondb.adk``, ``sessiondb.llama_index``,
``sessiondb.agent_framework``)."""

from .client import Client, CopyConflict, SessiondbError, SessiondbUnavailable

__all__ = ["Client", "CopyConflict", "SessiondbError", "SessiondbUnavailable"]

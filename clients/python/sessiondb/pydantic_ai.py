"""Pydantic AI's message history on sessiondb.

``SessiondbMessageHistory`` keeps an agent's conversation in a sessiondb session: pass
``history.messages()`` as ``message_history`` to ``agent.run`` and store what the run added
with ``history.add(result.new_messages())``. The conversation is then searchable, compacted
without losing a message, followed on the change feed and shared by every process that talks to
the server, where Pydantic AI leaves persistence to the application.

How messages are stored. Each ``ModelMessage`` is one sessiondb message: a ``ModelResponse``
under the role ``assistant``, a ``ModelRequest`` under ``system`` when it holds only system
prompts, ``tool`` when it holds only tool returns, ``user`` otherwise. Its ``content`` is the
text of its parts (prompts, text, tool returns, retry prompts; tool calls contribute nothing), so
search, the converters, compaction and a UI read it like any other message; the whole message,
as Pydantic AI serialises it (``ModelMessagesTypeAdapter``, fields that are ``None`` left out),
is kept under the metadata key ``pydanticAiMessage``, and ``messages()`` gives back what was
added. A message another client wrote reads as a ``ModelResponse`` with one ``TextPart`` when its
role is ``assistant``, else as a ``ModelRequest`` with a ``SystemPromptPart`` (role ``system``)
or a ``UserPromptPart``, its text parts joined when it has only ``parts``; a compaction's summary
reads as an assistant's text in place of the messages it covers.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)

from .client import Client

MESSAGE_KEY = "pydanticAiMessage"


def _text_of(message: ModelMessage) -> str:
    texts: list[str] = []
    for part in message.parts:
        if isinstance(part, (TextPart, SystemPromptPart)):
            texts.append(part.content)
        elif isinstance(part, UserPromptPart):
            texts.append(part.content if isinstance(part.content, str) else
                         "\n".join(c for c in part.content if isinstance(c, str)))
        elif isinstance(part, ToolReturnPart):
            texts.append(part.model_response_str())
        elif isinstance(part, RetryPromptPart):
            texts.append(part.model_response())
    return "\n".join(t for t in texts if t)


def _role_of(message: ModelMessage) -> str:
    if isinstance(message, ModelResponse):
        return "assistant"
    if message.parts and all(isinstance(p, SystemPromptPart) for p in message.parts):
        return "system"
    if message.parts and all(isinstance(p, ToolReturnPart) for p in message.parts):
        return "tool"
    return "user"


def message_of_model_message(message: ModelMessage) -> dict:
    """The sessiondb message that stores one Pydantic AI message."""
    whole = ModelMessagesTypeAdapter.dump_python([message], mode="json", exclude_none=True)[0]
    return {"role": _role_of(message), "content": _text_of(message),
            "metadata": {MESSAGE_KEY: whole}}


def model_message_of(message: dict) -> ModelMessage:
    """The Pydantic AI message a stored message holds (see the module's documentation)."""
    stored = (message.get("metadata") or {}).get(MESSAGE_KEY)
    if isinstance(stored, dict):
        return ModelMessagesTypeAdapter.validate_python([stored])[0]
    content: Any = message.get("content")
    if not isinstance(content, str):
        content = "\n".join(p.get("text", "") for p in message.get("parts") or []
                            if p.get("type") == "text")
    role = message.get("role")
    if role == "assistant":
        return ModelResponse(parts=[TextPart(content)])
    if role == "system":
        return ModelRequest(parts=[SystemPromptPart(content)])
    return ModelRequest(parts=[UserPromptPart(content)])


class SessiondbMessageHistory:
    """A Pydantic AI conversation kept in the sessiondb session ``session_id``.

    ``messages()`` reads the conversation as the model should see it (compactions applied),
    oldest first; ``add`` stores messages in one write, all or none, under the session's active
    leaf; ``clear`` deletes every message and keeps the session. The ``a…`` methods run the same
    requests on a worker thread, so an event loop never blocks.
    """

    def __init__(self, session_id: str, client: Client):
        self.session_id = session_id
        self.client = client

    def messages(self) -> list[ModelMessage]:
        return [model_message_of(m) for m in self.client.full_history(self.session_id)]

    def add(self, messages: Sequence[ModelMessage]) -> None:
        if messages:
            self.client.append_batch(self.session_id,
                                     [message_of_model_message(m) for m in messages])

    def clear(self) -> None:
        self.client.clear(self.session_id)

    async def amessages(self) -> list[ModelMessage]:
        return await asyncio.to_thread(self.messages)

    async def aadd(self, messages: Sequence[ModelMessage]) -> None:
        await asyncio.to_thread(self.add, messages)

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)

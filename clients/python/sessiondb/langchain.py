"""LangChain's chat message history on sessiondb.

``SessiondbChatMessageHistory`` is a ``BaseChatMessageHistory``: give it to
``RunnableWithMessageHistory`` (or read and add messages yourself) where
``SQLChatMessageHistory``, ``RedisChatMessageHistory`` or ``InMemoryChatMessageHistory`` went, and
the conversation lives in a sessiondb session: searchable, compacted without losing a message,
followed on the change feed, shared by every process that talks to the server.

How messages are stored. Each LangChain message is one sessiondb message whose role is the chat
role (``human`` → ``user``, ``ai`` → ``assistant``, ``system``, ``tool``, ``function``, a
``ChatMessage``'s own role) and whose ``content`` is the message's content (a string or a list of
content blocks), so search, the converters, compaction and a UI read it like any other message.
The rest of the message (its ``type``, and the fields that are set: ``tool_calls``,
``tool_call_id``, ``name``, ``id``, ``additional_kwargs``, ``response_metadata``,
``usage_metadata``, ...) is kept under the metadata key ``langchainMessage``, so ``messages``
gives back what was added. The TypeScript client stores messages the same way (its ``generic``
type is stored as ``chat``), so both read one history.

A message written by another client (without ``langchainMessage``) reads as the message of its
role (``user`` a ``HumanMessage``, ``assistant`` an ``AIMessage``, ``system`` a
``SystemMessage``, any other a ``ChatMessage``), its text parts joined when it has only
``parts``; a compaction's summary reads as an ``AIMessage`` in place of the messages it covers.

Moving in. ``copy_history`` copies the messages of any other history (``SQLChatMessageHistory``,
``RedisChatMessageHistory``, ...) into a ``SessiondbChatMessageHistory`` in one write that
creates its session, all or nothing; a history the target already holds is skipped, one whose
target holds its first messages (copied before the source went on) takes the rest in one write,
and one whose target holds other messages is refused (``conflict``), writing nothing.
A conversation longer than one request (16 MiB, or the server's ``--max-body-bytes``) goes in
several writes, each under the one before (``Client.copy_conversation``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    BaseMessageChunk,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    message_chunk_to_message,
    message_to_dict,
    messages_from_dict,
)

from .client import Client

MESSAGE_KEY = "langchainMessage"
ROLE_OF_TYPE = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool",
                "function": "function"}
MESSAGE_OF_ROLE = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}


def _is_set(value: Any) -> bool:
    return value is not None and value is not False and value != {} and value != []


def message_of_langchain(message: BaseMessage) -> dict:
    """The sessiondb message that stores one LangChain message."""
    if isinstance(message, BaseMessageChunk):
        message = message_chunk_to_message(message)
    data = message_to_dict(message)["data"]
    kind = message.type
    role = message.role if isinstance(message, ChatMessage) else ROLE_OF_TYPE.get(kind, kind)
    kept = {k: v for k, v in data.items() if k not in ("content", "type") and _is_set(v)}
    return {"role": role, "content": message.content,
            "metadata": {MESSAGE_KEY: {"type": kind, **kept}}}


def langchain_of_message(message: dict) -> BaseMessage:
    """The LangChain message a stored message holds (see the module's documentation)."""
    if "content" in message:
        content = message["content"]
    else:
        content = "\n".join(p.get("text", "") for p in message.get("parts") or []
                            if p.get("type") == "text")
    stored = (message.get("metadata") or {}).get(MESSAGE_KEY)
    if isinstance(stored, dict) and isinstance(stored.get("type"), str):
        data = {k: v for k, v in stored.items() if k != "type"}
        return messages_from_dict([{"type": stored["type"], "data": {**data, "content": content}}])[0]
    role = message.get("role", "")
    if role in MESSAGE_OF_ROLE:
        return MESSAGE_OF_ROLE[role](content=content)
    return ChatMessage(role=role, content=content)


class SessiondbChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history kept in the sessiondb session ``session_id``.

    ``messages`` reads the conversation as the model should see it (compactions applied),
    oldest first; ``add_messages`` stores its messages in one write, all or none, under the
    session's active leaf; ``clear`` deletes every message and keeps the session. The ``a…``
    methods run the same requests on a worker thread, so an event loop never blocks.
    """

    def __init__(self, session_id: str, client: Client):
        self.session_id = session_id
        self.client = client

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return [langchain_of_message(m) for m in self.client.full_history(self.session_id)]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        if messages:
            self.client.append_batch(self.session_id,
                                     [message_of_langchain(m) for m in messages])

    def clear(self) -> None:
        self.client.clear(self.session_id)

    async def aget_messages(self) -> list[BaseMessage]:
        return await asyncio.to_thread(lambda: self.messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await asyncio.to_thread(self.add_messages, messages)

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)


async def copy_history(source: BaseChatMessageHistory,
                       target: SessiondbChatMessageHistory) -> bool:
    """Copies the messages ``source`` holds into ``target``: ``True`` when it wrote; ``False`` when
    ``source`` is empty or ``target`` already holds its messages (a copy run again; maybe with
    more after them, the agent having gone on there). An empty ``target`` takes the messages in
    one write; one that holds the first of them (a copy made before ``source`` went on) takes
    the rest in one write; one that holds other messages is a ``conflict`` error, and nothing is
    written. The messages are dated by the copy."""
    messages = await source.aget_messages()
    return await asyncio.to_thread(
        target.client.copy_conversation, target.session_id,
        [message_of_langchain(m) for m in messages],
        lambda stored, i: langchain_of_message(stored) == messages[i])

"""LlamaIndex's chat stores on sessiondb.

``SessiondbChatStore`` is an ``AsyncDBChatStore``, the store behind LlamaIndex's ``Memory``: pass
it as ``Memory(session_id=..., sql_store=SessiondbChatStore(client=client), token_limit=...)``
where the default ``SQLAlchemyChatStore`` (an SQLite file, or a database URI) went.
``SessiondbBaseChatStore`` is a ``BaseChatStore``, the store of ``ChatMemoryBuffer`` and the chat
engines: pass it as ``ChatMemoryBuffer.from_defaults(chat_store=..., chat_store_key=...)`` where
``SimpleChatStore`` or another ``BaseChatStore`` went. Both keep a key's messages in the same
session, which then lives in sessiondb, shared by every process that talks to the server,
searchable, and readable by every other client as ordinary messages.

How it is stored. A key (``Memory``'s ``session_id``) is the sessiondb session
``llama-index/<key>`` (percent-encoded; a SHA-256 stands in past 256 characters) with the key in
its metadata (``llamaIndexKey``). A ``ChatMessage`` is a message of its role whose ``content`` is
the message's text; the whole message as LlamaIndex serialises it (``model_dump(mode="json")``,
without its blocks when they are that one text) is kept under the metadata key
``llamaIndexMessage`` and its status under ``llamaIndexStatus``
(``active`` or ``archived``: ``Memory`` archives the oldest messages of its queue once they pass
its token limit, and sessiondb keeps them). A message another client wrote reads as an active
message of its role and text.

Order and ids. Messages are the session's active path, oldest first; ``add_messages`` is one
write, all or none. ``delete_message(key, idx)`` takes a position on that path, in both stores
(``SQLAlchemyChatStore`` takes its row id, which a ``ChatMessage`` does not carry).
``set_messages`` and archives of several messages are two or more requests, as they are two
statements (a delete, then inserts; or updates) in ``SQLAlchemyChatStore``. The blocking client
runs on worker threads, so the event loop never waits for the server. A store holds each key's
path with the session's version as it last read or wrote it: a read while the session is still
at that version transfers nothing (``Memory.aget`` reads twice a turn), and an add is made at
that version, so the store still holds the path after it.
"""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from llama_index.core.storage.chat_store.base import BaseChatStore
from llama_index.core.storage.chat_store.base_db import AsyncDBChatStore, MessageStatus
from llama_index.core.storage.chat_store.sql import SQLAlchemyChatStore
from sqlalchemy import JSON, BigInteger, Column, Integer, MetaData, String, Table, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .client import (
    Client,
    Copied,
    HeldPaths,
    RememberedIds,
    SessiondbError,
    bounded_id,
    joined_id,
)

MESSAGE_KEY = "llamaIndexMessage"
STATUS_KEY = "llamaIndexStatus"
KEY_KEY = "llamaIndexKey"


def session_of(key: str) -> str:
    """The sessiondb session holding a chat store key's messages."""
    return bounded_id(joined_id("llama-index", key))


def message_of_chat_message(message: ChatMessage, status: MessageStatus) -> dict:
    """The sessiondb message that stores one LlamaIndex message."""
    content = message.content or ""
    whole = message.model_dump(mode="json")
    # A message of one text block is its content: kept once, as the message's text.
    if whole.get("blocks") == [{"block_type": "text", "text": content}]:
        del whole["blocks"]
    return {"role": message.role.value, "content": content,
            "metadata": {MESSAGE_KEY: whole, STATUS_KEY: status.value}}


def chat_message_of(message: dict) -> ChatMessage:
    """The LlamaIndex message a stored message holds (see the module's documentation)."""
    stored = (message.get("metadata") or {}).get(MESSAGE_KEY)
    if isinstance(stored, dict):
        if "blocks" not in stored:
            stored = {**stored, "content": message.get("content", "")}
        return ChatMessage.model_validate(stored)
    content: Any = message.get("content")
    if not isinstance(content, str):
        content = "\n".join(p.get("text", "") for p in message.get("parts") or []
                            if p.get("type") == "text")
    return ChatMessage(role=message.get("role", "user"), content=content)


def _status_of(message: dict) -> str:
    return (message.get("metadata") or {}).get(STATUS_KEY, MessageStatus.ACTIVE.value)


class _KeyedSessions:
    """The requests both stores make: each key a session, its messages on the active path."""

    def __init__(self, client: Client):
        self.client = client
        # Keys whose session this process has created (or found), so an add is one request.
        self.registered = RememberedIds()
        # Per key's session (for the 256 used last), its stored path at its version as this
        # store last read or wrote it: a read while the session is still at that version
        # transfers nothing.
        self.held = HeldPaths()

    def stored(self, key: str, status: Optional[MessageStatus] = None) -> list[dict]:
        """The key's stored messages of ``status`` (any when ``None``), oldest first."""
        session = session_of(key)
        path, held = self.client.held_stored_history(session, self.held.get(session))
        self.held.put(session, held)
        return [m for m in path if status is None or _status_of(m) == status.value]

    def append(self, key: str, messages: List[ChatMessage],
               status: MessageStatus = MessageStatus.ACTIVE) -> None:
        if not messages:
            return
        session = session_of(key)
        if key not in self.registered:
            try:
                # The key in the session's metadata lists it in get_keys, whatever its id became.
                self.client.create_session(session, metadata={KEY_KEY: key})
            except SessiondbError as error:
                if error.code != "conflict":
                    raise
            self.registered.add(key)
        self.client.append_held(session, [message_of_chat_message(m, status) for m in messages],
                                self.held)

    def replace(self, key: str, messages: List[ChatMessage],
                status: MessageStatus = MessageStatus.ACTIVE) -> None:
        self.held.pop(session_of(key))
        try:
            self.client.clear(session_of(key))
        except SessiondbError as error:
            if error.code != "not_found":
                raise
        self.append(key, messages, status)

    def delete(self, key: str, stored: list[dict]) -> List[ChatMessage]:
        """Deletes these stored messages of the key (in one write) and returns them."""
        self.held.pop(session_of(key))
        if stored:
            self.client.delete_messages(session_of(key), [m["id"] for m in stored])
        return [chat_message_of(m) for m in stored]

    def delete_at(self, key: str, idx: int) -> Optional[ChatMessage]:
        stored = self.stored(key)
        if not 0 <= idx < len(stored):
            return None
        return self.delete(key, [stored[idx]])[0]

    def delete_key(self, key: str) -> None:
        self.held.pop(session_of(key))
        self.client.delete_session(session_of(key), True)
        self.registered.discard(key)

    def archive_oldest(self, key: str, n: int) -> List[ChatMessage]:
        oldest = self.stored(key, MessageStatus.ACTIVE)[:max(n, 0)]
        self.held.pop(session_of(key))
        for message in oldest:
            metadata = {**(message.get("metadata") or {}), STATUS_KEY: MessageStatus.ARCHIVED.value}
            self.client.update_message(session_of(key), message["id"], metadata=metadata)
        return [chat_message_of(m) for m in oldest]

    def keys(self) -> List[str]:
        return [record["metadata"][KEY_KEY] for record in self.client.list_sessions()
                if KEY_KEY in (record.get("metadata") or {}) and record["messageCount"] > 0]

    def copy_in(self, key: str, messages: list[tuple[ChatMessage, MessageStatus]],
                created_at: list[int | None] | None = None) -> bool:
        """Stores ``messages`` as the key's, or those it lacks of them (see
        ``copy_chat_store``): whether it wrote. A key without messages is not created.
        ``created_at`` dates each message (epoch milliseconds), the session by the first."""
        self.held.pop(session_of(key))
        record: dict[str, Any] = {"metadata": {KEY_KEY: key}}
        if created_at and created_at[0] is not None:
            record["createdAt"] = created_at[0]
        return bool(messages) and self.client.copy_conversation(
            session_of(key), [message_of_chat_message(m, status) for m, status in messages],
            lambda stored, i: (chat_message_of(stored), _status_of(stored))
            == (messages[i][0], messages[i][1].value),
            record, created_at=created_at)


class _OnSessiondb(BaseModel):
    """What both stores hold: the client, and the requests they make through it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Client = Field(exclude=True)
    _sessions: _KeyedSessions = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._sessions = _KeyedSessions(self.client)


class SessiondbChatStore(_OnSessiondb, AsyncDBChatStore):
    """The store of LlamaIndex's ``Memory`` in sessiondb, through ``client`` (see the module's
    documentation)."""

    @classmethod
    def class_name(cls) -> str:
        return "SessiondbChatStore"

    async def get_messages(self, key: str, status: Optional[MessageStatus] = MessageStatus.ACTIVE,
                           limit: Optional[int] = None,
                           offset: Optional[int] = None) -> List[ChatMessage]:
        stored = await asyncio.to_thread(self._sessions.stored, key, status)
        start = offset or 0
        end = None if limit is None else start + limit
        return [chat_message_of(m) for m in stored[start:end]]

    async def count_messages(self, key: str,
                             status: Optional[MessageStatus] = MessageStatus.ACTIVE) -> int:
        return len(await asyncio.to_thread(self._sessions.stored, key, status))

    async def add_message(self, key: str, message: ChatMessage,
                          status: MessageStatus = MessageStatus.ACTIVE) -> None:
        await self.add_messages(key, [message], status)

    async def add_messages(self, key: str, messages: List[ChatMessage],
                           status: MessageStatus = MessageStatus.ACTIVE) -> None:
        await asyncio.to_thread(self._sessions.append, key, messages, status)

    async def set_messages(self, key: str, messages: List[ChatMessage],
                           status: MessageStatus = MessageStatus.ACTIVE) -> None:
        await asyncio.to_thread(self._sessions.replace, key, messages, status)

    async def delete_message(self, key: str, idx: int) -> Optional[ChatMessage]:
        return await asyncio.to_thread(self._sessions.delete_at, key, idx)

    async def delete_messages(self, key: str, status: Optional[MessageStatus] = None) -> None:
        if status is None:
            await asyncio.to_thread(self._sessions.delete_key, key)
        else:
            await asyncio.to_thread(self._delete_where, key, status, None)

    async def delete_oldest_messages(self, key: str, n: int) -> List[ChatMessage]:
        return await asyncio.to_thread(self._delete_where, key, MessageStatus.ACTIVE, max(n, 0))

    async def archive_oldest_messages(self, key: str, n: int) -> List[ChatMessage]:
        return await asyncio.to_thread(self._sessions.archive_oldest, key, n)

    async def get_keys(self) -> List[str]:
        return await asyncio.to_thread(self._sessions.keys)

    def _delete_where(self, key: str, status: MessageStatus,
                      oldest: Optional[int]) -> List[ChatMessage]:
        return self._sessions.delete(key, self._sessions.stored(key, status)[:oldest])


class SessiondbBaseChatStore(_OnSessiondb, BaseChatStore):
    """The ``BaseChatStore`` of ``ChatMemoryBuffer`` and the chat engines in sessiondb, through
    ``client``: the same sessions and messages as ``SessiondbChatStore`` (a key's messages
    whatever their status), positions as indexes. Its ``a…`` methods run these on worker
    threads, as ``BaseChatStore``'s do."""

    @classmethod
    def class_name(cls) -> str:
        return "SessiondbBaseChatStore"

    def set_messages(self, key: str, messages: List[ChatMessage]) -> None:
        self._sessions.replace(key, messages)

    def get_messages(self, key: str) -> List[ChatMessage]:
        return [chat_message_of(m) for m in self._sessions.stored(key)]

    def add_message(self, key: str, message: ChatMessage) -> None:
        self._sessions.append(key, [message])

    def delete_messages(self, key: str) -> Optional[List[ChatMessage]]:
        messages = self.get_messages(key)
        self._sessions.delete_key(key)
        return messages or None

    def delete_message(self, key: str, idx: int) -> Optional[ChatMessage]:
        return self._sessions.delete_at(key, idx)

    def delete_last_message(self, key: str) -> Optional[ChatMessage]:
        stored = self._sessions.stored(key)
        return self._sessions.delete(key, stored[-1:])[0] if stored else None

    def get_keys(self) -> List[str]:
        return self._sessions.keys()


async def copy_chat_store(source: BaseChatStore | AsyncDBChatStore,
                          target: SessiondbChatStore | SessiondbBaseChatStore,
                          keys: Optional[List[str]] = None) -> Copied:
    """Copies the keys of ``source`` (these, or all it lists) into ``target``: the keys
    copied, and those skipped as the target held them already or they held nothing. A key's
    messages (``SQLAlchemyChatStore``'s archived, then active, with their status) go in one
    write; a key that holds the first of them (a copy made before ``source`` went on) takes the
    rest in one write; one that holds anything else, other messages or the same with another
    status (``Memory`` archived them since), is a ``conflict`` error, and nothing of it is
    written. A key longer than one request (16 MiB, or the server's ``--max-body-bytes``) goes
    in several writes, each under the one before (``Client.copy_conversation``).

    From a ``SQLAlchemyChatStore`` on a database (not in memory) each message is dated by the
    time its row holds, read from the store's table with an engine of the copy's own (the
    store's interface gives messages without times); from other stores, by the copy."""
    database = isinstance(source, AsyncDBChatStore)
    if keys is None:
        keys = await (source.get_keys() if database else source.aget_keys())
    dated = _DatedRows.of(source)
    copied = Copied([], [])
    try:
        for key in keys:
            times = None
            if dated is not None:
                messages, times = await dated.read(key)
            elif database:
                messages = [(m, status) for status in _COPIED_STATUSES
                            for m in await source.get_messages(key, status=status)]
            else:
                messages = [(m, MessageStatus.ACTIVE) for m in await source.aget_messages(key)]
            done = await asyncio.to_thread(target._sessions.copy_in, key, messages, times)
            (copied.copied if done else copied.skipped).append(key)
    finally:
        if dated is not None:
            await dated.engine.dispose()
    return copied


# Archived messages are a key's oldest (``Memory`` archives from the front of its queue).
_COPIED_STATUSES = (MessageStatus.ARCHIVED, MessageStatus.ACTIVE)


class _DatedRows:
    """A ``SQLAlchemyChatStore``'s rows with the time each holds (``time.time_ns()`` when it
    was added), read as the store reads them: a key's rows of a status by time, then id."""

    def __init__(self, engine: AsyncEngine, table: Table):
        self.engine = engine
        self.table = table

    @classmethod
    def of(cls, source: Any) -> Optional["_DatedRows"]:
        """A reader of ``source``'s table; ``None`` when ``source`` is no
        ``SQLAlchemyChatStore`` or keeps its rows where another engine cannot read them (in
        memory, which is also where its URI points when it was given an engine instead)."""
        if not isinstance(source, SQLAlchemyChatStore):
            return None
        uri = source.async_database_uri
        if uri.startswith("sqlite") and (":memory:" in uri or uri.endswith("://")):
            return None
        schema = None if uri.startswith("sqlite") else source.db_schema
        table = Table(source.table_name, MetaData(schema=schema),
                      Column("id", Integer, primary_key=True), Column("key", String),
                      Column("timestamp", BigInteger), Column("status", String),
                      Column("data", JSON))
        return cls(create_async_engine(uri), table)

    async def read(self, key: str) -> tuple[list[tuple[ChatMessage, MessageStatus]],
                                            list[int | None]]:
        t = self.table
        async with self.engine.connect() as connection:
            rows = (await connection.execute(
                select(t.c.timestamp, t.c.status, t.c.data).where(t.c.key == key)
                .order_by(t.c.timestamp, t.c.id))).fetchall()
        messages, times = [], []
        for status in _COPIED_STATUSES:
            for timestamp, _, data in (r for r in rows if r.status == status.value):
                messages.append((ChatMessage.model_validate(data), status))
                times.append(timestamp // 1_000_000 if isinstance(timestamp, int) else None)
        return messages, times

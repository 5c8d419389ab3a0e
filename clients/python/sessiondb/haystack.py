"""Haystack's chat message stores on sessiondb.

``SessiondbChatMessageStore`` is a ``ChatMessageStore`` (``haystack-experimental``), the store
that Haystack's experimental ``Agent`` (``chat_message_store=...``) and its
``ChatMessageWriter`` and ``ChatMessageRetriever`` components read and write a conversation
through: pass it where ``InMemoryChatMessageStore`` went, and the conversations outlive the
process, are shared by every process that talks to the server, searchable, compacted without
losing a message and followed on the change feed. It is configured by the server's URL (and an
API key as a Haystack ``Secret``, ``SESSIONDB_API_KEY`` by default), so a pipeline that holds it
serialises and loads as any other.

How messages are stored. A chat history is the sessiondb session of its id (``prefix`` before
it; a SHA-256 stands in past 256 characters), listed with its id under the metadata key
``haystackChatHistory``. Each ``ChatMessage`` is a message of its role (``user``,
``assistant``, ``system``, ``tool``) whose ``content`` is its text, with the whole message as
Haystack serialises it (``to_dict()``: tool calls and results, images, reasoning, name, meta)
under the metadata key ``haystackMessage``, without the role and without the content when it is
that one text. A message's ``chat_message_id`` (its ``meta``) is its stored id: one without it
gets ``msg_`` and a UUID, where the in-memory store numbers messages by position (a position may
be taken again once a message was deleted from elsewhere, a UUID never is). A message another
client wrote reads as a message of its role and text, its id as ``chat_message_id``.

Writes and reads. ``write_messages`` stores those messages whose ``chat_message_id`` the
history does not hold, as the in-memory store does, so an agent handing back the history it
retrieved with its new messages stores the new ones; in one write, all or none, made only while
the history is as read (a write from elsewhere in between is read and compared again).
``retrieve_messages`` reads the history as a model should see it (a compaction's summary in place
of what it covers, never stored again when handed back) and keeps its last ``last_k`` rounds as
the in-memory store does (a round: a user's message and the answer, with the tool calls and
results between). The store holds each history's path at its version (for the 256 used last),
so a read after its own write transfers nothing (the server answers ``304``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from haystack import default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage, ChatRole
from haystack.utils import Secret, deserialize_secrets_inplace
from haystack_experimental.chat_message_stores.in_memory import InMemoryChatMessageStore

from .client import (
    COMPACTION_PREFIX,
    Client,
    HeldPaths,
    RememberedIds,
    SessiondbError,
    bounded_id,
    message_id_for,
)

MESSAGE_KEY = "haystackMessage"
HISTORY_KEY = "haystackChatHistory"
ID_KEY = "chat_message_id"
ROLES = {role.value for role in ChatRole}


def message_of(message: ChatMessage) -> dict:
    """The sessiondb message that stores one Haystack message (with its ``chat_message_id``)."""
    text = "\n".join(message.texts)
    whole = message.to_dict()
    del whole["role"]
    if whole.get("content") == [{"text": text}]:
        del whole["content"]
    return {"id": message_id_for(str(message.meta[ID_KEY])), "role": message.role.value,
            "content": text, "metadata": {MESSAGE_KEY: whole}}


def chat_message_of(stored: dict) -> ChatMessage:
    """The Haystack message a stored message holds (see the module's documentation)."""
    whole = (stored.get("metadata") or {}).get(MESSAGE_KEY)
    text: Any = stored.get("content")
    if not isinstance(text, str):
        text = "\n".join(p.get("text", "") for p in stored.get("parts") or []
                         if p.get("type") == "text")
    role = stored.get("role")
    if isinstance(whole, dict) and role in ROLES:
        return ChatMessage.from_dict({"content": [{"text": text}], "meta": {}, "name": None,
                                      **whole, "role": role})
    return ChatMessage.from_dict({"role": role if role in ROLES else "user",
                                  "content": [{"text": text}], "meta": {ID_KEY: stored["id"]}})


class SessiondbChatMessageStore:
    """Haystack chat histories in sessiondb (see the module's documentation).
    ``skip_system_messages`` and ``last_k`` (the rounds a retrieval keeps by default) are the
    in-memory store's."""

    def __init__(self, url: str = "http://127.0.0.1:8787",
                 api_key: Secret = Secret.from_env_var("SESSIONDB_API_KEY", strict=False),
                 prefix: str = "", skip_system_messages: bool = True,
                 last_k: int | None = 10) -> None:
        self.url = url
        self.api_key = api_key
        self.prefix = prefix
        self.skip_system_messages = skip_system_messages
        self.last_k = last_k
        self.client = Client(url, api_key=api_key.resolve_value())
        self._held = HeldPaths()
        # Histories this store listed (created, or found created), so a write is one request.
        self._listed = RememberedIds()

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, url=self.url, api_key=self.api_key.to_dict(),
                               prefix=self.prefix, skip_system_messages=self.skip_system_messages,
                               last_k=self.last_k)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessiondbChatMessageStore:
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)

    def close(self) -> None:
        """Closes the store's connections to the server."""
        self.client.close()

    def session_of(self, chat_history_id: str) -> str:
        """The sessiondb session holding the chat history ``chat_history_id``."""
        if not isinstance(chat_history_id, str) or not chat_history_id:
            raise ValueError("chat_history_id must be a non-empty string")
        return bounded_id(chat_history_id, self.prefix)

    def count_messages(self, chat_history_id: str) -> int:
        session = self.session_of(chat_history_id)
        stored, held = self.client.held_stored_history(session, self._held.get(session))
        self._held.put(session, held)
        return len(stored)

    def write_messages(self, chat_history_id: str, messages: list[ChatMessage]) -> int:
        messages = list(messages) if isinstance(messages, Iterable) else None
        if messages is None or any(not isinstance(m, ChatMessage) for m in messages):
            raise ValueError("Please provide a list of ChatMessages.")
        session = self.session_of(chat_history_id)
        given = []
        for message in messages:
            if self.skip_system_messages and message.is_from(ChatRole.SYSTEM):
                continue
            if message.meta.get(ID_KEY) is None:
                message = replace(message, _meta={ID_KEY: "msg_" + uuid.uuid4().hex,
                                                  **message.meta})
            if not str(message.meta[ID_KEY]).startswith(COMPACTION_PREFIX):
                given.append(message_of(message))
        if not given:
            return 0
        self._list(session, chat_history_id)

        def missing(stored: list[dict]) -> list[dict]:
            known = {m["id"] for m in stored}
            added = []
            for message in given:
                if message["id"] not in known:
                    known.add(message["id"])
                    added.append(message)
            return added

        return len(self.client.append_missing(session, missing, self._held))

    def retrieve_messages(self, chat_history_id: str,
                          last_k: int | None = None) -> list[ChatMessage]:
        if last_k is not None and last_k < 0:
            raise ValueError("last_k must be 0 or greater")
        rounds = last_k if last_k is not None else self.last_k
        if rounds == 0:
            return []
        session = self.session_of(chat_history_id)
        path, kept = self.client.held_history(session, self._held.get(session))
        self._held.put(session, kept)
        messages = [chat_message_of(m) for m in path]
        if rounds is None:
            return messages
        # The in-memory store's rounds, so both keep the same last messages.
        return InMemoryChatMessageStore._get_last_k_messages(messages=messages, last_k=rounds)

    def delete_messages(self, chat_history_id: str) -> None:
        """Deletes the history's messages; its session and state stay."""
        session = self.session_of(chat_history_id)
        self._held.pop(session)
        try:
            self.client.clear(session)
        except SessiondbError as error:
            if error.code != "not_found":
                raise

    def delete_all_messages(self) -> None:
        """Deletes the messages of every chat history of this store's prefix (the sessions
        listed as Haystack chat histories); no other session is touched."""
        for record in list(self.client.list_sessions()):
            if (HISTORY_KEY in (record.get("metadata") or {})
                    and record["id"].startswith(self.prefix)):
                self._held.pop(record["id"])
                self.client.clear(record["id"])

    def _list(self, session: str, chat_history_id: str) -> None:
        """Creates the history's session, listed as a Haystack chat history, unless it is."""
        if session in self._listed:
            return
        try:
            self.client.create_session(session, metadata={HISTORY_KEY: chat_history_id})
        except SessiondbError as error:
            if error.code != "conflict":
                raise
            # Created by another client, or by this store before: listed either way.
            self.client.update_session(session, metadata={HISTORY_KEY: chat_history_id})
        self._listed.add(session)

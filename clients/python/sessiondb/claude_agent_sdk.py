"""The Claude Agent SDK's ``SessionStore`` on sessiondb.

``SessiondbSessionStore`` receives the transcripts Claude Code mirrors
(``ClaudeAgentOptions(session_store=...)``) and gives them back for resume, listing, forking and
the SDK's other store helpers. It passes the SDK's own conformance suite
(``claude_agent_sdk.testing.run_session_store_conformance``); of the SDK it uses only
``fold_session_summary``, imported when a transcript is first appended.

How keys and entries are stored. Each key (``project_key``, ``session_id`` and, for a subagent
transcript, ``subpath``) is one sessiondb session, whose id joins the three percent-encoded
parts with ``/`` after the store's ``prefix`` (a SHA-256 of that when it would pass 256
characters). The session is recorded for the user ``prefix + project_key`` (so a project's
sessions are one listing) with the key in its metadata under ``claudeSessionKey``. Each
transcript entry is one message with the entry's ``uuid`` as its id, so a batch the SDK retries
is not stored twice. An entry that carries an API message (``message.role`` and
``message.content``) is stored with that role and content, so search, the converters and a UI
read a transcript as a conversation; the rest of the entry is kept under the metadata key
``claudeEntry``. Other entries (titles, tags, summaries, ...) are stored whole as ``content``
under their ``type`` as role, with ``claudeEntry`` set to ``"content"``. ``load`` rebuilds
every entry exactly as it was appended.

The summaries ``list_session_summaries`` returns (so the SDK lists a project's sessions in one
listing instead of a ``load`` each) are kept in the session's metadata under ``claudeSummary``:
the SDK's fold of every entry, with the id of the last entry folded and how many there were.
Appends by several processes may interleave, and sessiondb has no compare-and-set, so the fold
is checked instead: a summary counts only while its last entry and count are the session's
leaf and message count. An append whose stored summary does not match after it is written
folds the whole transcript again; a summary that does not match when listed is left out, and
the SDK then reads that session with ``load``. A summary is never wrong, at worst missing.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from typing import Any

from .client import (
    Client,
    RememberedValues,
    SessiondbError,
    bounded_id,
    joined_id,
    message_id_for,
    usable_id,
    usable_name,
)

ENTRY_KEY = "claudeEntry"
WHOLE_ENTRY = "content"
SESSION_KEY = "claudeSessionKey"
SUMMARY_KEY = "claudeSummary"
# Summaries are the SDK's opaque fold output; the two SDKs' folds need not agree, so each
# language trusts only its own.
SUMMARY_SDK = "python"
BINDINGS = "claude-bindings"
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def message_of_entry(entry: dict) -> dict:
    """The sessiondb message that stores one transcript entry."""
    message: dict[str, Any] = {}
    uuid = entry.get("uuid")
    if usable_id(uuid):
        message["id"] = uuid
    api_message = entry.get("message")
    if (isinstance(api_message, dict) and usable_name(api_message.get("role"))
            and isinstance(api_message.get("content"), (str, list))):
        rest = dict(entry)
        rest["message"] = {k: v for k, v in api_message.items() if k != "content"}
        message.update(role=api_message["role"], content=api_message["content"],
                       metadata={ENTRY_KEY: rest})
    else:
        kind = entry.get("type")
        message.update(role=kind if usable_name(kind) else "entry", content=entry,
                       metadata={ENTRY_KEY: WHOLE_ENTRY})
    return message


def entry_of_message(message: dict) -> dict:
    """The transcript entry a stored message holds."""
    stored = (message.get("metadata") or {}).get(ENTRY_KEY)
    if stored == WHOLE_ENTRY:
        return message["content"]
    if not isinstance(stored, dict):
        # Written by another client: shown to the SDK as a plain message entry.
        return {"type": message["role"], "uuid": message["id"],
                "message": {"role": message["role"], "content": message.get("content", "")}}
    stored["message"]["content"] = message["content"]
    return stored


def _summary(through: str | None, count: int, entry: dict | None) -> dict:
    """A stored summary: the SDK's fold (``entry``) of ``count`` messages ending at ``through``."""
    return {"sdk": SUMMARY_SDK, "through": through, "count": count, "entry": entry}


def _summary_of(session: dict) -> dict | None:
    """The session's stored summary, if this language wrote it."""
    summary = (session.get("metadata") or {}).get(SUMMARY_KEY)
    if isinstance(summary, dict) and summary.get("sdk") == SUMMARY_SDK:
        return summary
    return None


def _matches(summary: dict, session: dict) -> bool:
    """Whether the summary folded exactly the session's messages: it ends at the session's
    leaf and counts as many. (Transcripts are linear: every append goes under the leaf.)"""
    return (summary.get("entry") is not None and summary["through"] == session["leafId"]
            and summary["count"] == session["messageCount"])


class SessiondbSessionStore:
    """A Claude Agent SDK session store on the sessiondb server behind ``client``.

    ``prefix`` is put before every session id and owner this store writes, to keep its
    transcripts apart from other conversations of the namespace (or from another store's).
    Transcripts longer than the server's ``--max-messages-per-session`` (10,000 by default) are
    refused with its ``quota_exceeded`` error.
    """

    def __init__(self, client: Client, prefix: str = ""):
        self.client = client
        self.prefix = prefix
        # The summary this process last stored, by session id.
        self._summaries: dict[str, dict] = RememberedValues()

    def _session_id(self, key: dict) -> str:
        parts = [key["project_key"], key["session_id"]]
        if key.get("subpath"):
            parts.append(key["subpath"])
        return bounded_id(joined_id(*parts), self.prefix)

    def _owner(self, project_key: str) -> str:
        return bounded_id(project_key, self.prefix)

    def _project_sessions(self, project_key: str) -> list[tuple[dict, dict]]:
        """Every session of the project with its stored key, subagent transcripts included."""
        found = []
        for session in self.client.list_sessions(user_id=self._owner(project_key)):
            key = (session.get("metadata") or {}).get(SESSION_KEY)
            if isinstance(key, dict) and key.get("projectKey") == project_key:
                found.append((session, key))
        return found

    async def append(self, key: dict, entries: list[dict]) -> None:
        if entries:
            await asyncio.to_thread(self._append, key, entries)

    def _append(self, key: dict, entries: list[dict]) -> None:
        session_id = self._session_id(key)
        stored_key = {"projectKey": key["project_key"], "sessionId": key["session_id"]}
        if key.get("subpath"):
            stored_key["subpath"] = key["subpath"]
        try:
            self.client.create_session(session_id, userId=self._owner(key["project_key"]),
                                       metadata={SESSION_KEY: stored_key})
            if not key.get("subpath"):
                self._summaries[session_id] = _summary(None, 0, None)
        except SessiondbError as error:
            if error.code != "conflict":
                raise
        stored = self.client.append_batch(session_id, [message_of_entry(e) for e in entries])
        if not key.get("subpath"):
            self._fold(key, session_id, entries, stored[-1]["id"])

    def _fold(self, key: dict, session_id: str, entries: list[dict], last_id: str) -> None:
        """Folds the appended entries into the session's stored summary; the whole transcript
        instead when there is none to fold into, or the result does not match the session."""
        from claude_agent_sdk import fold_session_summary

        prev = self._summaries.get(session_id)
        if prev is None:
            prev = _summary_of(self.client.get_session(session_id))
        if prev is not None:
            summary = _summary(last_id, prev["count"] + len(entries),
                               fold_session_summary(prev["entry"], key, entries))
            session = self.client.update_session(session_id, metadata={SUMMARY_KEY: summary})
            if _matches(summary, session):
                self._summaries[session_id] = summary
                return
        # Interleaved with another append, or a batch partly stored before: fold it all.
        messages = self._messages(session_id)
        summary = _summary(messages[-1]["id"] if messages else None, len(messages),
                           fold_session_summary(None, key, [entry_of_message(m) for m in messages]))
        self.client.update_session(session_id, metadata={SUMMARY_KEY: summary})
        self._summaries[session_id] = summary

    async def load(self, key: dict) -> list[dict] | None:
        return await asyncio.to_thread(self._load, key)

    def _load(self, key: dict) -> list[dict] | None:
        session_id = self._session_id(key)
        messages = self._messages(session_id)
        if not messages and not self._exists(session_id):
            return None
        return [entry_of_message(m) for m in messages]

    def _messages(self, session_id: str) -> list[dict]:
        """The transcript's messages, oldest first."""
        messages: list[dict] = []
        after = None
        while True:
            page = self.client.messages(session_id, limit=100, after=after)
            messages.extend(page["items"])
            after = page.get("nextCursor")
            if after is None or not page["items"]:
                return messages

    def _exists(self, session_id: str) -> bool:
        try:
            self.client.get_session(session_id)
            return True
        except SessiondbError as error:
            if error.code == "not_found":
                return False
            raise

    async def list_sessions(self, project_key: str) -> list[dict]:
        return await asyncio.to_thread(self._list_sessions, project_key)

    def _list_sessions(self, project_key: str) -> list[dict]:
        return [{"session_id": key["sessionId"], "mtime": session["updatedAt"]}
                for session, key in self._project_sessions(project_key)
                if not key.get("subpath")]

    async def list_session_summaries(self, project_key: str) -> list[dict]:
        return await asyncio.to_thread(self._list_session_summaries, project_key)

    def _list_session_summaries(self, project_key: str) -> list[dict]:
        found = []
        for session, key in self._project_sessions(project_key):
            summary = _summary_of(session)
            if key.get("subpath") or summary is None or not _matches(summary, session):
                continue
            # Stamped with the time `list_sessions` gives (the same clock); a summary that
            # matches its session is as new as the session.
            found.append({**summary["entry"], "session_id": key["sessionId"],
                          "mtime": session["updatedAt"]})
        return found

    async def list_subkeys(self, key: dict) -> list[str]:
        return await asyncio.to_thread(self._list_subkeys, key)

    def _list_subkeys(self, key: dict) -> list[str]:
        return [stored["subpath"] for _, stored in self._project_sessions(key["project_key"])
                if stored.get("sessionId") == key["session_id"] and stored.get("subpath")]

    async def delete(self, key: dict) -> None:
        await asyncio.to_thread(self._delete, key)

    def _delete(self, key: dict) -> None:
        doomed = [self._session_id(key)]
        if not key.get("subpath"):
            # A main transcript takes its subagents' transcripts with it.
            doomed += [self._session_id({"project_key": key["project_key"],
                                         "session_id": key["session_id"],
                                         "subpath": subpath})
                       for subpath in self._list_subkeys(key)]
        for session_id in doomed:
            self.client.delete_session(session_id, missing_ok=True)


class SessiondbSessionBinding:
    """Stable Claude session ids for an application's own conversation ids.

    Claude Code names a session by a UUID (``ClaudeAgentOptions(session_id=...)`` to start one,
    ``resume=...`` to continue it). ``session_id(conversation_id)`` gives a UUID back as it is,
    and for any other id the UUID bound to it, binding a new random one the first time; every
    process sharing the server gets the same. A binding is a message whose id is the
    conversation id, written by an append, which stores the first binding and gives the stored
    one back to every later caller, so processes binding one id at once agree. Bindings are
    spread over 256 sessions (``prefix + "claude-bindings/"`` and two hex digits of the id's
    SHA-256), so the server's per-session message limit (10,000 by default) allows 2.5 million.
    """

    def __init__(self, client: Client, prefix: str = ""):
        self.client = client
        self.prefix = prefix

    def _where(self, conversation_id: str) -> tuple[str, str]:
        if not isinstance(conversation_id, str) or not conversation_id:
            raise ValueError("a conversation id is a non-empty string")
        digest = hashlib.sha256(conversation_id.encode()).hexdigest()
        return bounded_id(f"{BINDINGS}/{digest[:2]}", self.prefix), message_id_for(conversation_id)

    def _binding(self, conversation_id: str, session_id: str) -> dict:
        return {"role": "binding", "content": session_id,
                "metadata": {"conversationId": conversation_id}}

    async def session_id(self, conversation_id: str) -> str:
        if _UUID.fullmatch(conversation_id or ""):
            return conversation_id
        session, message_id = self._where(conversation_id)
        binding = {"id": message_id, **self._binding(conversation_id, str(uuid.uuid4()))}
        stored = await asyncio.to_thread(self.client.append, session, binding, None)
        return stored["message"]["content"]

    async def rebind(self, conversation_id: str, session_id: str) -> None:
        """Binds the conversation to another session (a fork of its session, say)."""
        if not _UUID.fullmatch(session_id or ""):
            raise ValueError(f"a Claude session id is a UUID, not {session_id!r}")
        if _UUID.fullmatch(conversation_id or ""):
            raise ValueError("a UUID conversation id is its own session id and has no binding")
        session, message_id = self._where(conversation_id)
        await asyncio.to_thread(self.client.replace_message, session, message_id,
                                self._binding(conversation_id, session_id), True)

"""Strands Agents sessions on sessiondb.

``SessiondbSessionRepository`` is a ``SessionRepository``, the store under Strands'
``RepositorySessionManager``: pass
``Agent(session_manager=RepositorySessionManager(session_id=..., session_repository=repository))``
where ``FileSessionManager`` or ``S3SessionManager`` went. Make one repository per process and a
manager per session (per request, say): the repository remembers the conversations it read.

Layout. A Strands session is the sessiondb session of its id (``prefix`` before it; a SHA-256
stands in past 256 characters) holding JSON state: the session's record under
``strandsSession``, each agent's under ``strandsAgent:<agent id>`` and each multi-agent's under
``strandsMultiAgent:<id>``. An agent's conversation is a sessiondb session of its own, named by
the two ids (``joined_id(session_id, agent_id)``, ``prefix`` before it), so it is searchable,
readable by any client and followed on the change feed like any other conversation.

How messages are stored. Each ``SessionMessage`` is one sessiondb message of its role whose
``content`` is the text of its text blocks (joined by newlines) as the model sees it: the
redacted message once a guardrail redacted it, so a search finds what the agent now holds. The
whole record as Strands serialises it (``to_dict()``: content blocks, tool uses and results,
bytes in base64, the index Strands gave it, its times, the message and its redaction) is kept
under the metadata key ``strandsMessage``, without the role and without the content when it is
that one text (Strands redacts the message in place, so the words redacted are kept nowhere).
A message another client wrote reads as a message of its text (``assistant`` for an assistant,
``user`` for any other role) whose index is its position.

Reads. An agent's messages are its conversation's active path as stored, its positions
Strands' offsets: Strands' conversation managers decide what the model sees, and record how many
messages they dropped from the front, so a sessiondb compaction (which would shift those
positions) does not change what an agent loads. The repository remembers each conversation's
path with its version (for the 256 conversations used last), so reading it again after its own
writes transfers nothing (the server answers ``304``).

Moving in. ``copy_sessions`` copies sessions of another repository (``FileSessionManager``,
whose agents and multi-agents it finds, or ``S3SessionManager`` with the agents named): a
conversation the target holds whole is skipped,
one whose target holds its first messages takes the rest, one holding other messages is refused
(``CopyConflict``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from strands.session.file_session_manager import (
    AGENT_PREFIX,
    MULTI_AGENT_PREFIX,
    SESSION_PREFIX,
    FileSessionManager,
)
from strands.session.session_repository import SessionRepository
from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, decode_bytes_values

from .client import (
    Client,
    Copied,
    HeldPaths,
    RememberedValues,
    SessiondbError,
    bounded_id,
    joined_id,
)

if TYPE_CHECKING:
    from strands.multiagent.base import MultiAgentBase

MESSAGE_KEY = "strandsMessage"
SESSION_KEY = "strandsSession"
AGENT_KEY_PREFIX = "strandsAgent:"
MULTI_AGENT_KEY_PREFIX = "strandsMultiAgent:"
MESSAGE_FIELDS = frozenset(field.name for field in dataclasses.fields(SessionMessage))


def text_of(message: dict) -> str:
    """The text a Strands message shows: its text blocks, joined by newlines."""
    return "\n".join(block["text"] for block in message.get("content") or []
                     if isinstance(block, dict) and isinstance(block.get("text"), str))


def message_of(session_message: SessionMessage) -> dict:
    """The sessiondb message that stores one Strands ``SessionMessage``."""
    whole = session_message.to_dict()
    shown_key = "redact_message" if whole.get("redact_message") is not None else "message"
    shown = whole[shown_key]
    role, text = shown.get("role"), text_of(shown)
    kept: dict[str, Any] = {k: v for k, v in whole.items() if v is not None}
    for key in ("message", "redact_message"):
        message = kept.get(key)
        if message is None:
            continue
        # Kept once: the role and the shown text are the stored message's own.
        message = {k: v for k, v in message.items() if not (k == "role" and v == role)}
        if key == shown_key and message.get("content") == [{"text": text}]:
            del message["content"]
        kept[key] = message
    return {"role": role, "content": text, "metadata": {MESSAGE_KEY: kept}}


def session_message_of(stored: dict, position: int) -> SessionMessage:
    """The ``SessionMessage`` a stored message holds, ``position`` its place on the path (see
    the module's documentation)."""
    kept = (stored.get("metadata") or {}).get(MESSAGE_KEY)
    role = stored.get("role")
    text: Any = stored.get("content")
    if not isinstance(text, str):
        text = "\n".join(p.get("text", "") for p in stored.get("parts") or []
                         if p.get("type") == "text")
    if isinstance(kept, dict) and isinstance(kept.get("message"), dict):
        shown_key = "redact_message" if kept.get("redact_message") is not None else "message"
        whole = dict(kept)
        for key in ("message", "redact_message"):
            if isinstance(whole.get(key), dict):
                message = {"role": role, **whole[key]}
                if key == shown_key:
                    message.setdefault("content", [{"text": text}])
                whole[key] = message
        # As `SessionMessage.from_dict`, which inspects the class's signature for every call.
        return SessionMessage(**decode_bytes_values(
            {k: v for k, v in whole.items() if k in MESSAGE_FIELDS}))
    written = datetime.fromtimestamp(stored.get("createdAt", 0) / 1000, timezone.utc).isoformat()
    return SessionMessage(
        message={"role": "assistant" if role == "assistant" else "user",
                 "content": [{"text": text}]},
        message_id=position, created_at=written,
        updated_at=datetime.fromtimestamp(stored.get("updatedAt", stored.get("createdAt", 0))
                                          / 1000, timezone.utc).isoformat())


def index_of(stored: dict, position: int) -> int:
    """The Strands index of a stored message: the one Strands gave it, else its position."""
    kept = (stored.get("metadata") or {}).get(MESSAGE_KEY)
    index = kept.get("message_id") if isinstance(kept, dict) else None
    return index if isinstance(index, int) else position


class SessiondbSessionRepository(SessionRepository):
    """Strands sessions, agents and their messages in sessiondb, through ``client`` (see the
    module's documentation)."""

    def __init__(self, client: Client, prefix: str = ""):
        self.client = client
        self.prefix = prefix
        self._held = HeldPaths()
        # When each agent this repository read or wrote was created, by session and agent id.
        self._agents_created: dict[tuple[str, str], str] = RememberedValues()

    def record_of(self, session_id: str) -> str:
        """The sessiondb session holding the records of Strands session ``session_id``."""
        return bounded_id(session_id, self.prefix)

    def conversation_of(self, session_id: str, agent_id: str) -> str:
        """The sessiondb session holding the messages of agent ``agent_id`` in ``session_id``."""
        return bounded_id(joined_id(session_id, agent_id), self.prefix)

    # -- sessions ---------------------------------------------------------------------------

    def create_session(self, session: Session, **kwargs: Any) -> Session:
        record = self.record_of(session.session_id)
        line = {"state": {"key": SESSION_KEY, "value": session.to_dict()}}
        try:
            self.client.import_together([{"session_id": record, "if_absent": True,
                                          "lines": [line]}])
        except SessiondbError as error:
            if error.code != "conflict":
                raise
            # The session exists: a Strands session when it holds the record.
            if self.client.get_state(record, SESSION_KEY, None) is not None:
                raise SessionException(f"Session {session.session_id} already exists") from None
            self.client.put_state(record, SESSION_KEY, session.to_dict())
        return session

    def read_session(self, session_id: str, **kwargs: Any) -> Session | None:
        stored = self.client.get_state(self.record_of(session_id), SESSION_KEY, None)
        return None if stored is None else Session.from_dict(stored)

    def delete_session(self, session_id: str, **kwargs: Any) -> None:
        """Deletes the session, its agents' conversations and its multi-agents' states."""
        record = self.record_of(session_id)
        state = self.client.all_state(record)
        if SESSION_KEY not in state:
            raise SessionException(f"Session {session_id} does not exist")
        for key, value in state.items():
            if key.startswith(AGENT_KEY_PREFIX) and isinstance(value, dict):
                self._agents_created.pop((session_id, value["agent_id"]), None)
                conversation = self.conversation_of(session_id, value["agent_id"])
                self.client.delete_session(conversation, missing_ok=True)
                self._held.pop(conversation)
        self.client.delete_session(record, missing_ok=True)

    # -- agents -----------------------------------------------------------------------------

    def create_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        self.client.put_state(self.record_of(session_id), agent_key(session_agent.agent_id),
                              session_agent.to_dict())
        self._remember_agent(session_id, session_agent)

    def read_agent(self, session_id: str, agent_id: str, **kwargs: Any) -> SessionAgent | None:
        stored = self.client.get_state(self.record_of(session_id), agent_key(agent_id), None)
        if stored is None:
            return None
        agent = SessionAgent.from_dict(stored)
        self._remember_agent(session_id, agent)
        return agent

    def update_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        """Replaces the agent's record, keeping when it was created: remembered from this
        repository's last read or write of it, else read."""
        created_at = self._agents_created.get((session_id, session_agent.agent_id))
        if created_at is None:
            previous = self.read_agent(session_id, session_agent.agent_id)
            if previous is None:
                raise SessionException(f"Agent {session_agent.agent_id} in session "
                                       f"{session_id} does not exist")
            created_at = previous.created_at
        session_agent.created_at = created_at
        self.create_agent(session_id, session_agent)

    def _remember_agent(self, session_id: str, agent: SessionAgent) -> None:
        self._agents_created[(session_id, agent.agent_id)] = agent.created_at

    # -- messages ---------------------------------------------------------------------------

    def create_message(self, session_id: str, agent_id: str, session_message: SessionMessage,
                       **kwargs: Any) -> None:
        self.client.append_held(self.conversation_of(session_id, agent_id),
                                [message_of(session_message)], self._held)

    def read_message(self, session_id: str, agent_id: str, message_id: int,
                     **kwargs: Any) -> SessionMessage | None:
        found = self._find(session_id, agent_id, message_id)
        return None if found is None else session_message_of(*found)

    def update_message(self, session_id: str, agent_id: str, session_message: SessionMessage,
                       **kwargs: Any) -> None:
        """Replaces the message of ``session_message``'s index, keeping when it was created
        (a guardrail's redaction, as Strands uses it)."""
        found = self._find(session_id, agent_id, session_message.message_id)
        if found is None:
            raise SessionException(f"Message {session_message.message_id} does not exist")
        stored, position = found
        session_message.created_at = session_message_of(stored, position).created_at
        conversation = self.conversation_of(session_id, agent_id)
        self.client.replace_message(conversation, stored["id"], message_of(session_message))
        self._held.pop(conversation)

    def list_messages(self, session_id: str, agent_id: str, limit: int | None = None,
                      offset: int = 0, **kwargs: Any) -> list[SessionMessage]:
        path = self._path(self.conversation_of(session_id, agent_id), offset)
        return [session_message_of(stored, offset + i)
                for i, stored in enumerate(path[:limit])]

    # -- multi-agents -----------------------------------------------------------------------

    def create_multi_agent(self, session_id: str, multi_agent: MultiAgentBase,
                           **kwargs: Any) -> None:
        self.client.put_state(self.record_of(session_id), multi_agent_key(multi_agent.id),
                              multi_agent.serialize_state())

    def read_multi_agent(self, session_id: str, multi_agent_id: str,
                         **kwargs: Any) -> dict[str, Any] | None:
        return self.client.get_state(self.record_of(session_id), multi_agent_key(multi_agent_id),
                                     None)

    def update_multi_agent(self, session_id: str, multi_agent: MultiAgentBase,
                           **kwargs: Any) -> None:
        if self.read_multi_agent(session_id, multi_agent.id) is None:
            raise SessionException(f"MultiAgent state {multi_agent.id} in session {session_id} "
                                   "does not exist")
        self.create_multi_agent(session_id, multi_agent)

    # -- the paths held ---------------------------------------------------------------------

    def _path(self, conversation: str, start: int = 0) -> list[dict]:
        """The conversation's active path as stored from position ``start``, transferred only
        when it changed since this repository held it."""
        path, kept = self.client.held_stored_history(conversation, self._held.get(conversation),
                                                     start)
        self._held.put(conversation, kept)
        return path

    def _find(self, session_id: str, agent_id: str,
              message_id: int) -> tuple[dict, int] | None:
        """The stored message of Strands index ``message_id`` and its position: looked for at
        that position first (where Strands' own writes put it), then from the newest back."""
        path = self._path(self.conversation_of(session_id, agent_id))
        if 0 <= message_id < len(path) and index_of(path[message_id], message_id) == message_id:
            return path[message_id], message_id
        for position in range(len(path) - 1, -1, -1):
            if index_of(path[position], position) == message_id:
                return path[position], position
        return None


def agent_key(agent_id: str) -> str:
    """The state key of an agent's record in its session's record."""
    return bounded_id(agent_id, AGENT_KEY_PREFIX)


def multi_agent_key(multi_agent_id: str) -> str:
    """The state key of a multi-agent's state in its session's record."""
    return bounded_id(multi_agent_id, MULTI_AGENT_KEY_PREFIX)


def copy_sessions(source: SessionRepository, target: SessiondbSessionRepository,
                  session_ids: Iterable[str], agent_ids: Iterable[str] | None = None,
                  multi_agent_ids: Iterable[str] | None = None) -> Copied:
    """Copies the sessions ``source`` holds of ``session_ids`` into ``target``: each session's
    record, its agents' records with their messages and its multi-agents' states. The
    repository interface lists no agents: from a ``FileSessionManager`` they are found in its
    folders unless named; from another repository, ``agent_ids`` names them (``"default"``, an
    ``Agent``'s id unless given another, when not named) and ``multi_agent_ids`` the
    multi-agents (none when not named). Returns the ``(session id, agent id)`` pairs copied,
    and those skipped as the target held them whole already or the source held no such agent
    (see the module's documentation)."""
    copied = Copied([], [])
    for session_id in session_ids:
        named = list(agent_ids) if agent_ids is not None else _stored_ids(
            source, session_id, "agents", AGENT_PREFIX, ["default"])
        session = source.read_session(session_id)
        if session is None:
            copied.skipped.extend((session_id, agent_id) for agent_id in named)
            continue
        record = target.record_of(session_id)
        lines = [{"state": {"key": SESSION_KEY, "value": session.to_dict()}}]
        for multi_agent_id in (list(multi_agent_ids) if multi_agent_ids is not None else
                               _stored_ids(source, session_id, "multi_agents",
                                           MULTI_AGENT_PREFIX, [])):
            state = source.read_multi_agent(session_id, multi_agent_id)
            if state is not None:
                lines.append({"state": {"key": multi_agent_key(multi_agent_id), "value": state}})
        wrote_record = False
        for agent_id in named:
            agent = source.read_agent(session_id, agent_id)
            if agent is None:
                copied.skipped.append((session_id, agent_id))
                continue
            messages = source.list_messages(session_id, agent_id)
            wanted = [message_of(m) for m in messages]

            def same(stored: dict, i: int) -> bool:
                return session_message_of(stored, i).to_dict() == messages[i].to_dict()

            agent_line = {"state": {"key": agent_key(agent_id), "value": agent.to_dict()}}
            conversation = target.conversation_of(session_id, agent_id)
            done = target.client.copy_conversation(
                conversation, wanted, same,
                created_at=[epoch_ms(m.created_at) for m in messages],
                also_parts=[{"session_id": record, "lines": [*lines, agent_line]}])
            target._held.pop(conversation)
            wrote_record |= done
            (copied.copied if done else copied.skipped).append((session_id, agent_id))
        if not wrote_record:
            # No agent copy carried the records (none held, or all copied before): they go in
            # where the target has no such session yet, never over one that went on there.
            try:
                target.client.import_together([{"session_id": record, "if_absent": True,
                                                "lines": lines}])
            except SessiondbError as error:
                if error.code != "conflict":
                    raise
    return copied


def _stored_ids(source: SessionRepository, session_id: str, folder: str, prefix: str,
                otherwise: list[str]) -> list[str]:
    """The ids of the agents or multi-agents a ``FileSessionManager`` holds in a session, from
    its folders (``session_<id>/agents/agent_<id>``, as it documents them); ``otherwise`` for
    any other repository."""
    if not isinstance(source, FileSessionManager):
        return otherwise
    directory = os.path.join(source.storage_dir, f"{SESSION_PREFIX}{session_id}", folder)
    if not os.path.isdir(directory):
        return []
    return sorted(name.removeprefix(prefix) for name in os.listdir(directory)
                  if name.startswith(prefix))


def epoch_ms(iso: str) -> int:
    """Epoch milliseconds of an ISO 8601 time as Strands writes them (UTC when unzoned)."""
    moment = datetime.fromisoformat(iso)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)

"""Microsoft Agent Framework's conversation history and session snapshots on sessiondb.

``SessiondbHistoryProvider`` is a ``HistoryProvider``, the context provider an ``Agent`` loads
its conversation from before a run and stores the run's messages with after it: pass it as
``Agent(client=..., context_providers=[SessiondbHistoryProvider(client)])`` where
``InMemoryHistoryProvider``, ``FileHistoryProvider`` or ``RedisHistoryProvider`` went. An
``AgentSession``'s conversation is then the sessiondb session of the same id (``prefix`` before
it; a SHA-256 stands in past 256 characters), shared by every process that talks to the server,
searchable, compacted without losing a message and followed on the change feed.
``SessiondbSessionStore`` is a ``SessionStore``: it keeps ``AgentSession`` snapshots (its
``to_dict()``) as the JSON state ``agentFrameworkSession`` of the sessiondb session named by the
store's id, beside that session's messages when the ids agree.

How messages are stored. Each ``Message`` is one sessiondb message of its role whose
``content`` is its text (``Message.text``: its text contents, joined by spaces), so search, the
converters, compaction and a UI read it like any other message; the whole message as the
framework serialises it (``to_dict()``: function calls and results, data, author, message id,
additional properties; without its role, and without its contents when they are that one text)
is kept under the metadata key ``agentFrameworkMessage``, and reads give back what was saved. A message another client wrote reads as a ``Message`` of its role and text
(its text parts joined when it has only ``parts``); a compaction's summary reads as a message of
its role in place of the messages it covers.

Reads and writes. ``get_messages`` reads the conversation as the model should see it
(compactions applied), oldest first. ``save_messages`` stores what the conversation lacks of the
messages it is given, as the framework's own providers do (``filter_new_messages``: a caller that
hands over the whole transcript again stores only what came since), in one write, all or none,
made only while the session is as it was read: a write from elsewhere in between is read and
compared again. The provider remembers each session's path with the session's version as it
last read or wrote it (for the 256 sessions used last), so a load after its own save transfers
no history (the server answers ``304``) and a save after a load reads nothing first. The client
blocks, so each call runs on a worker thread and the event loop never waits for the server.

Moving in. ``copy_history`` copies sessions of any other history provider (``FileHistoryProvider``,
``RedisHistoryProvider``, ``InMemoryHistoryProvider`` with the sessions whose state holds them)
into a ``SessiondbHistoryProvider``: a session the target holds whole is skipped, one whose
target holds its first messages (copied before the source went on) takes the rest, and one
holding other messages is refused (``CopyConflict``). A conversation longer than one request
(16 MiB, or the server's ``--max-body-bytes``) goes in several writes, each under the one before
(``Client.copy_conversation``).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from agent_framework import AgentSession, Message
from agent_framework._feature_stage import ExperimentalWarning
from agent_framework._sessions import HistoryProvider, SessionStore, filter_new_messages

from .client import Client, Copied, HeldPaths, SessiondbError, bounded_id

MESSAGE_KEY = "agentFrameworkMessage"
SESSION_KEY = "agentFrameworkSession"


def message_of(message: Message) -> dict:
    """The sessiondb message that stores one Agent Framework message."""
    text = message.text
    whole = message.to_dict()
    # The role is the message's; a message of one plain text is its content: kept once.
    del whole["role"]
    if whole.get("contents") == [{"type": "text", "text": text, "additional_properties": {}}]:
        del whole["contents"]
    return {"role": message.role, "content": text, "metadata": {MESSAGE_KEY: whole}}


def framework_message_of(stored: dict) -> Message:
    """The Agent Framework message a stored message holds (see the module's documentation)."""
    whole = (stored.get("metadata") or {}).get(MESSAGE_KEY)
    if isinstance(whole, dict):
        whole = {**whole, "role": stored.get("role")}
        if "contents" not in whole:
            whole["contents"] = [{"type": "text", "text": stored.get("content", "")}]
        return Message.from_dict(whole)
    content: Any = stored.get("content")
    if not isinstance(content, str):
        content = "\n".join(p.get("text", "") for p in stored.get("parts") or []
                            if p.get("type") == "text")
    return Message(stored.get("role") or "user", [content])


class SessiondbHistoryProvider(HistoryProvider):
    """An ``Agent``'s conversations in sessiondb, through ``client`` (see the module's
    documentation). The flags are ``HistoryProvider``'s: what to load and what to store."""

    DEFAULT_SOURCE_ID: ClassVar[str] = "sessiondb"

    def __init__(self, client: Client, source_id: str = DEFAULT_SOURCE_ID, *,
                 prefix: str = "", load_messages: bool = True, store_inputs: bool = True,
                 store_context_messages: bool = False,
                 store_context_from: set[str] | None = None, store_outputs: bool = True):
        super().__init__(source_id, load_messages=load_messages, store_inputs=store_inputs,
                         store_context_messages=store_context_messages,
                         store_context_from=store_context_from, store_outputs=store_outputs)
        self.client = client
        self.prefix = prefix
        self._held = HeldPaths()

    def session_of(self, session_id: str | None) -> str:
        """The sessiondb session holding the conversation of ``session_id``."""
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        return bounded_id(session_id, self.prefix)

    async def get_messages(self, session_id: str | None, *, state: dict[str, Any] | None = None,
                           **kwargs: Any) -> list[Message]:
        path = await asyncio.to_thread(self._read, self.session_of(session_id))
        return [framework_message_of(m) for m in path]

    async def save_messages(self, session_id: str | None, messages: Sequence[Message], *,
                            state: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if messages:
            await asyncio.to_thread(self._save, self.session_of(session_id), list(messages))

    async def clear(self, session_id: str | None) -> None:
        """Deletes the conversation's messages; the session and its state stay."""
        session = self.session_of(session_id)
        await asyncio.to_thread(self.client.clear, session)
        self._held.pop(session)

    def _read(self, session: str) -> list[dict]:
        """The session's path as the model sees it, transferred only when it changed since
        this provider held it."""
        path, kept = self.client.held_history(session, self._held.get(session))
        self._held.put(session, kept)
        return path

    def _save(self, session: str, messages: list[Message]) -> None:
        def missing(stored: list[dict]) -> list[dict]:
            added = filter_new_messages([framework_message_of(m) for m in stored], messages)
            return [message_of(m) for m in added]

        # `filter_new_messages` looks further back than the last `len(messages)` stored messages
        # only when there are no more stored than that (it then looks for all of them among the
        # given ones): a run's save parses its few, not the whole conversation.
        self.client.append_missing(session, missing, self._held, tail=len(messages))


# The framework warns when a class derives from ``SessionStore``, which it marks experimental:
# at this module's import, also for users of the history provider alone. The docstring says it.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ExperimentalWarning)

    class SessiondbSessionStore(SessionStore):
        """``AgentSession`` snapshots in sessiondb, through ``client`` (see the module's
        documentation): each the JSON state ``agentFrameworkSession`` of the session named by
        the store's id (``prefix`` before it). ``SessionStore`` is experimental in the
        framework: its methods may change."""

        def __init__(self, client: Client, prefix: str = ""):
            self.client = client
            self.prefix = prefix

        def _session(self, session_id: str) -> str:
            SessionStore.validate_session_id(session_id)
            return bounded_id(session_id, self.prefix)

        async def get(self, session_id: str) -> AgentSession | None:
            stored = await asyncio.to_thread(self.client.get_state, self._session(session_id),
                                             SESSION_KEY, None)
            return None if stored is None else AgentSession.from_dict(stored)

        async def set(self, session_id: str, session: AgentSession) -> None:
            await asyncio.to_thread(self.client.put_state, self._session(session_id), SESSION_KEY,
                                    session.to_dict())

        async def delete(self, session_id: str) -> None:
            try:
                await asyncio.to_thread(self.client.delete_state, self._session(session_id),
                                        SESSION_KEY)
            except SessiondbError as error:
                if error.code != "not_found":
                    raise


async def copy_history(source: HistoryProvider, target: SessiondbHistoryProvider,
                       sessions: Iterable[str | AgentSession]) -> Copied:
    """Copies the conversations ``source`` holds for ``sessions`` (ids, or ``AgentSession``s
    whose state ``source`` reads, as ``InMemoryHistoryProvider`` does) into ``target``: the
    ids copied, and those skipped as the target held them already or they held nothing (see
    the module's documentation)."""
    copied = Copied([], [])
    for session in sessions:
        if isinstance(session, AgentSession):
            session_id = session.session_id
            state = session.state.get(source.source_id, {})
        else:
            session_id, state = session, {}
        messages = await source.get_messages(session_id, state=state)
        wanted = [message_of(m) for m in messages]
        target_session = target.session_of(session_id)

        def same(stored: dict, i: int) -> bool:
            return framework_message_of(stored).to_dict() == messages[i].to_dict()

        done = bool(wanted) and await asyncio.to_thread(
            target.client.copy_conversation, target_session, wanted, same)
        target._held.pop(target_session)
        (copied.copied if done else copied.skipped).append(session_id)
    return copied

"""Google's Agent Development Kit (ADK) sessions on sessiondb.

``SessiondbSessionService`` is an ADK ``BaseSessionService``: pass it to a ``Runner`` in place of
``InMemorySessionService``, ``SqliteSessionService`` or ``DatabaseSessionService``, and every
session, event and state value lives in sessiondb, shared by every process that talks to the
server, searchable, and readable by every other client as ordinary messages.

How ADK's model is stored:

- An ADK session ``(app_name, user_id, session_id)`` is the sessiondb session
  ``adk/<app>/<user>/<session>`` (each part percent-encoded; a SHA-256 stands in past 256
  characters) with ``userId`` = the ADK user and the three names in its metadata
  (``adkApp``, ``adkUserId``, ``adkSessionId``).
- An event is a message whose id is the event's id: role ``user`` when the user wrote it,
  ``tool`` when its content holds only function responses, ``assistant`` otherwise; its
  ``content`` is the text of its parts, and the whole event as ADK serialises it
  (``model_dump_json(exclude_none=True)``; without its parts when they are that one text) is
  kept under the metadata key ``adkEvent``, which
  ``get_session`` reads back. A message another client wrote reads as an event of that role's
  text (author ``user`` or ``model``).
- Session-scoped state is the session's state keys. ``app:`` keys are the state of the session
  ``adk-app/<app>``, ``user:`` keys that of ``adk-user/<app>/<user>``, both stored without their
  prefix and merged back with it, as ADK's own services do; ``temp:`` keys are never stored.

Writes. ``create_session`` creates the session with its initial state, and ``append_event``
stores an event with its state changes, session, app and user scope alike, each in one request
(``POST /v1/import`` into the three sessions), all or nothing. It goes in
only while the session's last stored event is the one this object last read or wrote
(``ifLeaf``, checked in the write itself): otherwise ADK's ``StaleSessionError``, and nothing is
written, so of two writers that read the same session one lands and the other must read again.

Memory. ``SessiondbMemoryService`` is an ADK ``BaseMemoryService`` (what ``load_memory`` and
``preload_memory`` search): pass it to a ``Runner`` as ``memory_service``. What it is given
(``add_session_to_memory``, ``add_events_to_memory``) is kept in sessions of its own,
``adk-memory/<app>/<user>/<session>``, recorded for the owner ``adk-memory/<app>/<user>`` (so one
user's memory is one search; the names in its metadata under ``adkMemory``), each event a
message as above; an event already kept is not kept again, so a session may be added as often
as it grows. ``search_memory`` is a full-text search of the owner's sessions for messages holding
any of the query's words, best first (as ADK's ``SqliteMemoryService`` searches), each hit read
back as the event it stores. ``delete_memory`` forgets an event: it is deleted, and recorded (a
state key of the session named as the owner, which owns nothing) so that it is never kept again.

Reads. ``get_session`` reads the session, its events and the three states. The events come in
one streamed read, which transfers nothing while the session is still as this service last
read or wrote it (it holds each session's stored path with the session's version, and appends
from a session object that is up to date with it go in at that version); with
``num_recent_events`` (or once a compaction's summary stands in the path, since ADK needs the
events themselves) they are read newest first, a page at a time, as far as
``num_recent_events`` and ``after_timestamp`` need. ``list_sessions``
lists the app's sessions (one user's through the server's user index, all users' by reading the
namespace's listing) with their merged state, without events. The blocking client runs on worker
threads, so the event loop never waits for the server.

Moving in. ``copy_sessions`` copies an app's sessions from any other session service
(``SqliteSessionService``, ``DatabaseSessionService``, ...) with their events and state, each
session in one write (with the app and user state it shows), all or nothing. A session the
target already holds with the same events is skipped, so a copy cut short is finished by running
it again; one that holds the first of its events (copied before the source went on) takes the
events it lacks and the state, in one write; one it holds with other events is refused with
ADK's ``AlreadyExistsError``, writing nothing.
A conversation longer than one request (16 MiB, or the server's ``--max-body-bytes``) goes in
several writes, each under the one before (``Client.copy_conversation``).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid
from collections.abc import Mapping, Sequence
from itertools import islice, takewhile
from typing import Any, Optional

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.genai import types
from pydantic_core import to_jsonable_python

from .client import (
    Client,
    Copied,
    CopyConflict,
    HeldPaths,
    SessiondbError,
    bounded_id,
    joined_id,
    message_id_for,
)

EVENT_KEY = "adkEvent"
APP_KEY = "adkApp"
USER_KEY = "adkUserId"
SESSION_KEY = "adkSessionId"
# The metadata key of a memory session: its app, user and session.
MEMORY_KEY = "adkMemory"
PAGE_SIZE = 100


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The sessiondb session holding an ADK session."""
    return bounded_id(joined_id("adk", app_name, user_id, session_id))


def app_state_key(app_name: str) -> str:
    """The sessiondb session whose state is an app's ``app:`` state."""
    return bounded_id(joined_id("adk-app", app_name))


def user_state_key(app_name: str, user_id: str) -> str:
    """The sessiondb session whose state is a user's ``user:`` state in an app."""
    return bounded_id(joined_id("adk-user", app_name, user_id))


def split_state(delta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``delta`` as JSON values by scope (``app``, ``user``, ``session``), prefixes removed and
    ``temp:`` keys left out. A value JSON cannot hold is stored as its ``repr``."""
    scopes: dict[str, dict[str, Any]] = {"app": {}, "user": {}, "session": {}}
    for key, value in delta.items():
        if key.startswith(State.TEMP_PREFIX):
            continue
        value = to_jsonable_python(value, fallback=repr)
        if key.startswith(State.APP_PREFIX):
            scopes["app"][key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            scopes["user"][key.removeprefix(State.USER_PREFIX)] = value
        else:
            scopes["session"][key] = value
    return scopes


def merged_state(app: dict[str, Any], user: dict[str, Any],
                 session: dict[str, Any]) -> dict[str, Any]:
    """The state an ADK session shows: its own keys, then the app's and user's with prefixes."""
    state = dict(session)
    state.update({State.APP_PREFIX + k: v for k, v in app.items()})
    state.update({State.USER_PREFIX + k: v for k, v in user.items()})
    return state


def _text_of(event: Event) -> str:
    parts = event.content.parts if event.content and event.content.parts else []
    return "\n".join(p.text for p in parts if p.text and not p.thought)


def _role_of(event: Event) -> str:
    if event.author == "user":
        return "user"
    parts = event.content.parts if event.content and event.content.parts else []
    if parts and all(p.function_response is not None for p in parts):
        return "tool"
    return "assistant"


def message_of_event(event: Event) -> dict:
    """The sessiondb message that stores one ADK event."""
    text = _text_of(event)
    whole = json.loads(event.model_dump_json(exclude_none=True))
    # An event of one text part is its text: kept once, as the message's content.
    if text and whole.get("content", {}).get("parts") == [{"text": text}]:
        del whole["content"]["parts"]
    return {"id": message_id_for(event.id), "role": _role_of(event), "content": text,
            "metadata": {EVENT_KEY: whole}}


def event_of(message: dict) -> Event:
    """The ADK event a stored message holds (see the module's documentation)."""
    stored = (message.get("metadata") or {}).get(EVENT_KEY)
    if isinstance(stored, dict):
        content, text = stored.get("content"), message.get("content")
        if isinstance(content, dict) and "parts" not in content and text:
            stored = {**stored, "content": {**content, "parts": [{"text": text}]}}
        return Event.model_validate(stored)
    content: Any = message.get("content")
    if not isinstance(content, str):
        content = "\n".join(p.get("text", "") for p in message.get("parts") or []
                            if p.get("type") == "text")
    role = "user" if message.get("role") == "user" else "model"
    return Event(id=message["id"], invocation_id="", author=role,
                 content=types.Content(role=role, parts=[types.Part(text=content)]),
                 timestamp=message.get("createdAt", 0) / 1000)


def _state_lines(values: dict[str, Any]) -> list[dict]:
    """Import lines that set these state keys."""
    return [{"state": {"key": k, "value": v}} for k, v in values.items()]


class SessiondbSessionService(BaseSessionService):
    """ADK sessions in sessiondb, through ``client`` (see the module's documentation)."""

    def __init__(self, client: Client):
        self.client = client
        # Per session key (for the 256 used last), the session's stored path at its version as
        # this service last read or wrote it, so a whole read while the session is still at
        # that version transfers no events.
        self._held = HeldPaths()

    # -- ADK's interface --------------------------------------------------------------------

    async def create_session(self, *, app_name: str, user_id: str,
                             state: Optional[dict[str, Any]] = None,
                             session_id: Optional[str] = None) -> Session:
        # Ids are stripped of surrounding blanks, as ADK's in-memory service does.
        return await asyncio.to_thread(self._create, app_name, user_id, state or {},
                                       session_id.strip() if session_id else None)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: Optional[GetSessionConfig] = None) -> Optional[Session]:
        return await asyncio.to_thread(self._get, app_name, user_id, session_id.strip(),
                                       config or GetSessionConfig())

    async def list_sessions(self, *, app_name: str,
                            user_id: Optional[str] = None) -> ListSessionsResponse:
        return await asyncio.to_thread(self._list, app_name, user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        key = session_key(app_name, user_id, session_id.strip())
        self._held.pop(key)
        await asyncio.to_thread(self.client.delete_session, key, True)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.client.all_state, user_state_key(app_name, user_id))

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        # Temp keys reach the in-memory session for the rest of the invocation, never storage.
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        await asyncio.to_thread(self._store, session, event)
        session.last_update_time = event.timestamp
        session._storage_update_marker = message_id_for(event.id)
        return self._commit_event_to_session(session, event)

    # -- the requests, on a worker thread ---------------------------------------------------

    def _create(self, app_name: str, user_id: str, state: dict[str, Any],
                session_id: Optional[str]) -> Session:
        session_id = session_id or str(uuid.uuid4())
        key = session_key(app_name, user_id, session_id)
        metadata = {APP_KEY: app_name, USER_KEY: user_id, SESSION_KEY: session_id}
        scopes = split_state(state)
        created = {"session_id": key, "if_absent": True,
                   "lines": [{"session": {"userId": user_id, "metadata": metadata}}]
                   + _state_lines(scopes["session"])}
        try:
            self.client.import_together([created] + _scope_parts(app_name, user_id, scopes))
        except SessiondbError as error:
            if error.code == "conflict":
                raise AlreadyExistsError(f"Session with id {session_id} already exists.") from error
            raise
        record = self.client.get_session(key)
        state = merged_state(self.client.all_state(app_state_key(app_name)),
                             self.client.all_state(user_state_key(app_name, user_id)),
                             scopes["session"])
        return Session(id=session_id, app_name=app_name, user_id=user_id, state=state, events=[],
                       last_update_time=record["createdAt"] / 1000)

    def _get(self, app_name: str, user_id: str, session_id: str,
             config: GetSessionConfig) -> Optional[Session]:
        key = session_key(app_name, user_id, session_id)
        try:
            record = self.client.get_session(key)
        except SessiondbError as error:
            if error.code == "not_found":
                return None
            raise
        events = self._events(key, config)
        state = merged_state(self.client.all_state(app_state_key(app_name)),
                             self.client.all_state(user_state_key(app_name, user_id)),
                             self.client.all_state(key))
        session = Session(id=session_id, app_name=app_name, user_id=user_id, state=state,
                          events=events, last_update_time=record["updatedAt"] / 1000)
        session._storage_update_marker = record["leafId"]
        return session

    def _events(self, key: str, config: GetSessionConfig) -> list[Event]:
        """The events ``config`` asks for, oldest first."""
        wanted, after = config.num_recent_events, config.after_timestamp
        if wanted is None:
            path, held = self.client.held_stored_history(key, self._held.get(key))
            self._held.put(key, held)
            events = [event_of(m) for m in path]
            return [e for e in events if e.timestamp >= after] if after else events
        # The stored path newest first, read only as far as ``config`` needs.
        page_size = max(1, min(PAGE_SIZE, wanted))
        newest = map(event_of, self.client.iter_messages(key, order="desc", page_size=page_size))
        if after:
            newest = takewhile(lambda event: event.timestamp >= after, newest)
        return list(islice(newest, wanted))[::-1]

    def _list(self, app_name: str, user_id: Optional[str]) -> ListSessionsResponse:
        app = self.client.all_state(app_state_key(app_name))
        users: dict[str, dict[str, Any]] = {}
        sessions = []
        for record in self.client.list_sessions(user_id=user_id, sort="updatedAt", order="asc"):
            metadata = record.get("metadata") or {}
            owner = metadata.get(USER_KEY)
            if (metadata.get(APP_KEY) != app_name or SESSION_KEY not in metadata
                    or (user_id is not None and owner != user_id)):
                continue
            if owner not in users:
                users[owner] = self.client.all_state(user_state_key(app_name, owner))
            state = merged_state(app, users[owner], self.client.all_state(record["id"]))
            sessions.append(Session(id=metadata[SESSION_KEY], app_name=app_name, user_id=owner,
                                    state=state, events=[],
                                    last_update_time=record["updatedAt"] / 1000))
        return ListSessionsResponse(sessions=sessions)

    def _copy_in(self, session: Session) -> bool:
        """Stores ``session`` (another service's, whole) as a session that does not exist here
        yet, in one write: its record, state and events as ``create_session`` and
        ``append_event`` would have stored them; or, into one that holds the first of its
        events, the events it lacks with the state (see ``copy_sessions``)."""
        key = session_key(session.app_name, session.user_id, session.id)
        scopes = split_state(session.state)
        messages = [message_of_event(event) for event in session.events]
        record = {"userId": session.user_id, "metadata": {
            APP_KEY: session.app_name, USER_KEY: session.user_id, SESSION_KEY: session.id}}
        self._held.pop(key)
        try:
            return self.client.copy_conversation(
                key, messages, lambda stored, i: stored["id"] == messages[i]["id"], record,
                created_at=[int(event.timestamp * 1000) for event in session.events],
                also_lines=_state_lines(scopes["session"]),
                also_parts=_scope_parts(session.app_name, session.user_id, scopes))
        except CopyConflict as conflict:
            copied = ("the events it wrote before another writer changed the session stay"
                      if conflict.wrote_before else "nothing was copied")
            raise AlreadyExistsError(f"Session with id {session.id} already exists with events "
                                     f"the copy does not begin with; {copied}.") from None

    def _store(self, session: Session, event: Event) -> None:
        key = session_key(session.app_name, session.user_id, session.id)
        # What this object last read or wrote: its marker, else (a session built by hand or by
        # another service) its last event. The write goes in only while that is the stored leaf.
        leaf = session._storage_update_marker
        if leaf is None and session.events:
            leaf = message_id_for(session.events[-1].id)
        scopes = split_state(event.actions.state_delta if event.actions else {})
        message, created_at = message_of_event(event), int(event.timestamp * 1000)
        lines = [{"message": message, "parentId": leaf, "createdAt": created_at}]
        lines += _state_lines(scopes["session"])
        scope_parts = _scope_parts(session.app_name, session.user_id, scopes)
        held = self._held.pop(key)
        if held is not None and leaf is not None and held.last_id == leaf:
            # The path held ends where this object does: at the version held, the path after
            # the write is what is held plus this event (an import stores it as given).
            try:
                answer = self.client.import_together(
                    [{"session_id": key, "lines": lines, "if_version": held.version}] + scope_parts)
            except SessiondbError as error:
                if error.code not in ("conflict", "not_found"):
                    raise
            else:
                version = answer["parts"][0].get("version")
                if version is not None:
                    self._held.put(key, held.extended(
                        version, [{**message, "createdAt": created_at}]))
                return
        event_part = {"session_id": key, "lines": lines, "if_leaf": leaf}
        try:
            self.client.import_together([event_part] + scope_parts)
        except SessiondbError as error:
            if error.code == "not_found":
                raise SessionNotFoundError(f"Session {session.id} not found.") from error
            if error.code == "conflict":
                raise StaleSessionError(
                    "The session was written since this session object read it; get the "
                    f"session again before appending ({error.message}).") from error
            raise


def _scope_parts(app_name: str, user_id: str, scopes: dict[str, dict[str, Any]]) -> list[dict]:
    """Parts of an ``import_together`` that write the app and user state changes in
    ``scopes``, each creating its scope's session when it is new."""
    parts = []
    if scopes["app"]:
        record = {"metadata": {APP_KEY: app_name}}
        parts.append({"session_id": app_state_key(app_name),
                      "lines": [{"session": record}] + _state_lines(scopes["app"])})
    if scopes["user"]:
        record = {"userId": user_id, "metadata": {APP_KEY: app_name, USER_KEY: user_id}}
        parts.append({"session_id": user_state_key(app_name, user_id),
                      "lines": [{"session": record}] + _state_lines(scopes["user"])})
    return parts


async def copy_sessions(source: BaseSessionService, target: SessiondbSessionService, *,
                        app_name: str, user_id: Optional[str] = None) -> Copied:
    """Copies the app's sessions (one user's, or every user's) from ``source`` into ``target``,
    least recently updated first, each in one write (see the module's documentation): which
    were written and which skipped, as ``(user_id, session_id)`` pairs. A session's events
    keep their times; a session deleted from ``source`` while this runs is left out."""
    listed = await source.list_sessions(app_name=app_name, user_id=user_id)
    copied = Copied([], [])
    for record in sorted(listed.sessions, key=lambda s: s.last_update_time):
        session = await source.get_session(app_name=app_name, user_id=record.user_id,
                                           session_id=record.id)
        if session is None:
            continue
        done = await asyncio.to_thread(target._copy_in, session)
        (copied.copied if done else copied.skipped).append((session.user_id, session.id))
    return copied


def memory_owner(app_name: str, user_id: str) -> str:
    """The owner (``userId``) of a user's memory sessions in an app."""
    return bounded_id(joined_id("adk-memory", app_name, user_id))


def memory_key(app_name: str, user_id: str, session_id: str) -> str:
    """The sessiondb session keeping what a session gave a user's memory."""
    return bounded_id(joined_id("adk-memory", app_name, user_id, session_id))


# Where `add_events_to_memory` keeps events given without their session, as ADK's own services do.
UNKNOWN_SESSION_ID = "__unknown_session_id__"
# Memories a search returns at most.
MEMORY_RESULTS = 10


class SessiondbMemoryService(BaseMemoryService):
    """ADK's memory in sessiondb, through ``client`` (see the module's documentation)."""

    def __init__(self, client: Client, max_results: int = MEMORY_RESULTS):
        self.client = client
        self.max_results = max_results

    async def add_session_to_memory(self, session: Session) -> None:
        await asyncio.to_thread(self._keep, session.app_name, session.user_id, session.id,
                                session.events)

    async def add_events_to_memory(self, *, app_name: str, user_id: str,
                                   events: Sequence[Event], session_id: str | None = None,
                                   custom_metadata: Mapping[str, object] | None = None) -> None:
        await asyncio.to_thread(self._keep, app_name, user_id,
                                session_id or UNKNOWN_SESSION_ID, events)

    async def search_memory(self, *, app_name: str, user_id: str,
                            query: str) -> SearchMemoryResponse:
        return await asyncio.to_thread(self._search, app_name, user_id, query)

    async def delete_memory(self, *, app_name: str, user_id: str,
                            memory_id: str | None = None) -> None:
        if memory_id:
            await asyncio.to_thread(self._forget, app_name, user_id, memory_id)

    def _forget(self, app_name: str, user_id: str, memory_id: str) -> None:
        """Records the event as forgotten (so adding its session again keeps it no more), then
        deletes it from every memory session of the user that kept it. A call cut short in
        between is made again; until then the event may still be found."""
        owner, message_id = memory_owner(app_name, user_id), message_id_for(memory_id)
        self.client.put_state(owner, message_id, True)
        for record in self.client.list_sessions(user_id=owner):
            self.client.delete_messages(record["id"], [message_id])

    def _forgotten(self, app_name: str, user_id: str) -> dict:
        """The message ids of the user's forgotten events (state keys of the session named as
        the owner, which owns nothing itself)."""
        try:
            return self.client.all_state(memory_owner(app_name, user_id))
        except SessiondbError as error:
            if error.code == "not_found":
                return {}
            raise

    def _keep(self, app_name: str, user_id: str, session_id: str,
              events: Sequence[Event]) -> None:
        """Keeps the events that have content, chained in their order, in one write that skips
        the ones kept before (their ids are the events')."""
        # Its own metadata key: the session service lists an app's sessions by `adkApp`.
        record = {"userId": memory_owner(app_name, user_id),
                  "metadata": {MEMORY_KEY: {"app": app_name, "user": user_id,
                                            "session": session_id}}}
        lines: list[dict] = [{"session": record}]
        forgotten = self._forgotten(app_name, user_id)
        parent = None
        for event in events:
            if not (event.content and event.content.parts):
                continue
            message = message_of_event(event)
            if message["id"] in forgotten:
                continue
            lines.append({"message": message, "parentId": parent,
                          "createdAt": int(event.timestamp * 1000)})
            parent = message["id"]
        if parent is not None:
            self.client.import_lines(memory_key(app_name, user_id, session_id), lines)

    def _search(self, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        hits = self.client.search_all(query, user_id=memory_owner(app_name, user_id),
                                      limit=self.max_results, match="any")
        memories = []
        for hit in hits:
            try:
                event = event_of(self.client.get_message(hit["sessionId"], hit["id"]))
            except SessiondbError as error:
                if error.code == "not_found":  # forgotten since the search
                    continue
                raise
            if event.content is None:
                continue
            memories.append(MemoryEntry(
                id=event.id, content=event.content, author=event.author,
                timestamp=datetime.datetime.fromtimestamp(
                    event.timestamp, datetime.timezone.utc).isoformat()))
        return SearchMemoryResponse(memories=memories)

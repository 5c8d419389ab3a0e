"""The OpenAI Agents SDK's ``Session`` protocol on sessiondb.

``SessiondbSession`` keeps an agent's conversation in a sessiondb session, so
``Runner.run(agent, input, session=SessiondbSession("user-42", client))`` loads and saves its
history through a sessiondb server instead of a local SQLite file. It needs no import of the SDK
(the protocol is structural), and only the standard library.

How items are stored. The SDK's items are Responses API input items. An item with a ``role``
and ``content`` (a message) is stored as a message with that role and content, so search, the
converters, compaction and a UI read it like any other message; its other fields (``type``,
``id``, ``status``), if any, are kept under the metadata key ``openaiItem``. Any other item (a
function call, its output, reasoning, ...) is stored whole as the message's ``content``, with
``openaiItem`` set to ``"content"``, under the role ``tool`` for results (``*_output`` and
``*_result`` types, as the Python and JavaScript SDKs name them) and ``assistant`` otherwise.
The TypeScript client stores items the same way, so both read one conversation.

``get_items`` rebuilds every item exactly as it was added (sessiondb adds ``mediaType`` to a
chat-completions ``image_url`` object with a data URL, as for any client; the Responses API's
``input_image`` is kept as it is). A message written by another client (without
``openaiItem``) reads as ``{role, content}``, its text parts joined when it has only ``parts``;
a compaction's summary reads the same way, in place of the messages it covers.

Moving in. ``copy_session`` copies the conversation of any SDK session (``SQLiteSession``,
``SQLAlchemySession``, ``RedisSession``, ...: anything with ``get_items``) into a
``SessiondbSession``, and ``copy_sqlite_sessions`` every session of a ``SQLiteSession`` file.
Each conversation is copied in one write that creates its session, all or nothing; one the
target already holds is skipped, so a copy cut short is finished by running it again; one whose
target holds its first items (copied before the source went on) takes the rest in one write;
and one whose target holds other items is refused (``conflict``), writing nothing.
A conversation longer than one request (16 MiB, or the server's ``--max-body-bytes``) goes in
several writes, each under the one before (``Client.copy_conversation``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import pathlib
import sqlite3
from typing import Any

from .client import Client, Copied, SessiondbError

ITEM_KEY = "openaiItem"
WHOLE_ITEM = "content"


def message_of_item(item: dict) -> dict:
    """The sessiondb message that stores one SDK item."""
    role, content = item.get("role"), item.get("content")
    if isinstance(role, str) and role and content is not None:
        rest = {k: v for k, v in item.items() if k not in ("role", "content")}
        message = {"role": role, "content": content}
        if rest:
            message["metadata"] = {ITEM_KEY: rest}
        return message
    kind = item.get("type")
    is_result = isinstance(kind, str) and kind.endswith(("_output", "_result"))
    role = "tool" if is_result else "assistant"
    return {"role": role, "content": item, "metadata": {ITEM_KEY: WHOLE_ITEM}}


def item_of_message(message: dict) -> dict:
    """The SDK item a stored message holds (see the module's documentation)."""
    stored = (message.get("metadata") or {}).get(ITEM_KEY)
    if stored == WHOLE_ITEM:
        return message["content"]
    item: dict[str, Any] = dict(stored) if isinstance(stored, dict) else {}
    item["role"] = message["role"]
    if "content" in message:
        item["content"] = message["content"]
    else:
        texts = [p.get("text", "") for p in message.get("parts") or [] if p.get("type") == "text"]
        item["content"] = "\n".join(texts)
    return item


class SessiondbSession:
    """An OpenAI Agents SDK session kept in the sessiondb session ``session_id``.

    ``session_settings`` is the SDK's ``SessionSettings`` (its ``limit`` bounds ``get_items``
    when no limit is passed). Each call is one or two HTTP requests, run on a worker thread so
    the event loop never blocks; ``add_items`` stores its items in one write, all or none.

    The session keeps the items it last read or wrote with the session's version then, so a
    ``get_items`` after its own ``add_items``, with nothing else written meanwhile, transfers no
    history: the server answers that the session is still at that version (``304``).
    """

    def __init__(self, session_id: str, client: Client, session_settings: Any = None):
        self.session_id = session_id
        self.client = client
        self.session_settings = session_settings
        # The version and the items (each as JSON text, so each read hands out objects of its
        # own) of the whole conversation as this object last read or wrote it.
        self._held: tuple[int, list[str]] | None = None

    async def get_items(self, limit: int | None = None) -> list[dict]:
        """The conversation as the model should see it (compactions applied), oldest first;
        with a limit, only the newest ``limit`` items."""
        if limit is None and self.session_settings is not None:
            limit = getattr(self.session_settings, "limit", None)
        return await asyncio.to_thread(self._get_items, limit)

    def _get_items(self, limit: int | None) -> list[dict]:
        if limit is None:
            held = self._held
            read = self.client.versioned_history(self.session_id, held[0] if held else None)
            if read is None and held is not None:
                return json.loads("[" + ",".join(held[1]) + "]")
            version, messages = read or (0, [])
            items = [item_of_message(m) for m in messages]
            self._held = (version, [json.dumps(item) for item in items]) if version else None
            return items
        if limit <= 0:
            return []
        newest: list[dict] = []
        for message in self.client.history(self.session_id, order="newest"):
            newest.append(item_of_message(message))
            if len(newest) == limit:
                break
        newest.reverse()
        return newest

    async def add_items(self, items: list[dict]) -> None:
        if items:
            await asyncio.to_thread(self._add_items, items)

    def _add_items(self, items: list[dict]) -> None:
        messages = [message_of_item(item) for item in items]
        held, self._held = self._held, None
        if held is not None:
            # At the version read: what this object holds plus these is then the conversation.
            try:
                stored, version = self.client.append_batch_versioned(
                    self.session_id, messages, if_version=held[0])
            except SessiondbError as error:
                if error.code not in ("conflict", "not_found"):
                    raise
            else:
                if version is not None:
                    added = [json.dumps(item_of_message(m)) for m in stored]
                    self._held = (version, held[1] + added)
                return
        self.client.append_batch(self.session_id, messages)

    def _copy_in(self, items: list[dict], created_at: list[int | None] | None = None,
                 record: dict | None = None) -> bool:
        """Stores ``items`` as the session's conversation, or the items it lacks of them (see
        ``copy_session``); ``created_at`` and ``record`` as ``Client.copy_conversation`` takes
        them."""
        self._held = None
        return self.client.copy_conversation(
            self.session_id, [message_of_item(i) for i in items],
            lambda stored, i: item_of_message(stored) == items[i], record,
            created_at=created_at)

    async def pop_item(self) -> dict | None:
        """Deletes the newest stored message and returns its item (``None`` when empty)."""
        return await asyncio.to_thread(self._pop_item)

    def _pop_item(self) -> dict | None:
        self._held = None
        newest = self.client.messages(self.session_id, limit=1, order="desc")["items"]
        if not newest:
            return None
        self.client.delete_message(self.session_id, newest[0]["id"])
        return item_of_message(newest[0])

    async def clear_session(self) -> None:
        self._held = None
        await asyncio.to_thread(self.client.clear, self.session_id)


async def copy_session(source: Any, target: SessiondbSession) -> bool:
    """Copies the conversation ``source`` (any SDK session) holds into ``target``: ``True`` when it
    wrote; ``False`` when ``source`` is empty or ``target`` already holds its items (a copy run
    again; maybe with more after them, the agent having gone on there). An empty ``target``
    takes the items in one write; one that holds the first of them (a copy made before
    ``source`` went on) takes the rest in one write; one that holds other items is a
    ``conflict`` error, and nothing is written. What ``source.get_items()`` gives is copied
    (only the newest items, for a session with a ``limit`` in its settings). The messages are
    dated by the copy."""
    items = await source.get_items()
    return await asyncio.to_thread(target._copy_in, items)


async def copy_sqlite_sessions(db_path: str, client: Client, *,
                               sessions_table: str = "agent_sessions",
                               messages_table: str = "agent_messages") -> Copied:
    """Copies every session of a ``SQLiteSession`` database file into the sessiondb session of
    the same id (as ``copy_session`` does, oldest session first), its items read as
    ``SQLiteSession`` reads them (in the order they were added, an item whose JSON does not
    decode skipped), each session and item dated by the time the file holds for it
    (``created_at``; the copy's time where that is not a time). Sessions of the file with no
    items are skipped."""
    read_only = pathlib.Path(db_path).resolve().as_uri() + "?mode=ro"

    def query(sql: str, *parameters: Any) -> list[tuple]:
        with contextlib.closing(sqlite3.connect(read_only, uri=True)) as db:
            return db.execute(sql, parameters).fetchall()

    def items_of(session_id: str) -> tuple[list[dict], list[int | None]]:
        items, times = [], []
        for data, created_at in query(f'SELECT message_data, created_at FROM "{messages_table}" '
                                      "WHERE session_id = ? ORDER BY id", session_id):
            try:
                items.append(json.loads(data))
            except (json.JSONDecodeError, TypeError):
                continue
            times.append(_epoch_ms(created_at))
        return items, times

    copied = Copied([], [])
    sessions = await asyncio.to_thread(
        query, f'SELECT session_id, created_at FROM "{sessions_table}" '
        "ORDER BY created_at, session_id")
    for session_id, created_at in sessions:
        items, times = await asyncio.to_thread(items_of, session_id)
        started = _epoch_ms(created_at)
        done = bool(items) and await asyncio.to_thread(
            SessiondbSession(session_id, client)._copy_in, items, times,
            None if started is None else {"createdAt": started})
        (copied.copied if done else copied.skipped).append(session_id)
    return copied


def _epoch_ms(timestamp: Any) -> int | None:
    """Epoch milliseconds of a time as SQLite's ``CURRENT_TIMESTAMP`` writes it (UTC,
    ``YYYY-MM-DD HH:MM:SS``) or another ISO 8601 form; ``None`` for anything else."""
    try:
        moment = datetime.datetime.fromisoformat(timestamp)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return round(moment.timestamp() * 1000)

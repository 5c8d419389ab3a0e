"""A blocking client for the sessiondb HTTP API (standard library only)."""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
import urllib.parse
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from ._http import Answer, Connection

_OMITTED: Any = object()
# Idle connections a client keeps for the next requests; more are closed when returned.
MAX_IDLE_CONNECTIONS = 8


class SessiondbError(Exception):
    """An error answer of the server: its HTTP status and the typed error it sent.

    ``code`` is one of the API's error codes (``invalid_request``, ``not_found``, ``conflict``,
    ``quota_exceeded``, ...). A request that never got an answer is a ``SessiondbUnavailable``.
    """

    def __init__(self, status: int | None, code: str, message: str):
        super().__init__(f"{code}: {message}" if status is None else f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class SessiondbUnavailable(SessiondbError):
    """The server could not be reached, or the connection broke before an answer."""

    def __init__(self, message: str):
        super().__init__(None, "unavailable", message)


class CopyConflict(SessiondbError):
    """A ``conflict``: the session a copy writes to holds messages the copy does not begin with.
    ``wrote_before`` says whether parts of a copy written in several writes were stored before
    another writer changed the session (they stay, a prefix the next copy goes on from)."""

    def __init__(self, session_id: str, wrote_before: bool):
        super().__init__(409, "conflict", f"session {session_id!r} holds messages the copy does "
                         "not begin with; " + ("the messages it wrote before stay" if wrote_before
                                               else "nothing was copied"))
        self.wrote_before = wrote_before


MAX_ID_CHARS = 256
# Ids of the messages that stand for compactions in a read with compactions applied.
COMPACTION_PREFIX = "compaction_"
# The most a copy (``Client.copy_conversation``) puts in one request, a quarter of a server's
# default ``--max-body-bytes``: a longer conversation is copied in several writes.
COPY_REQUEST_BYTES = 16 * 1024 * 1024


def _segment(value: str) -> str:
    # Identifiers are single path segments: '/', '?', '%' and the rest are percent-encoded.
    return urllib.parse.quote(value, safe="")


def joined_id(*parts: str) -> str:
    """One identifier naming several strings: each percent-encoded, joined with ``/``, so no
    two lists of parts give the same result (the TypeScript client derives the same)."""
    return "/".join(_segment(p) for p in parts)


def bounded_id(name: str, prefix: str = "") -> str:
    """``prefix + name``, or ``prefix`` and a SHA-256 of it when that passes the API's 256
    characters."""
    name = prefix + name
    if len(name) <= MAX_ID_CHARS:
        return name
    return prefix + "sha256-" + hashlib.sha256(name.encode()).hexdigest()


def usable_name(value: Any) -> bool:
    """Whether sessiondb takes ``value`` as a role or an id: 1..256 characters, none of them a
    control character."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS
            and not any(c < "\x20" or "\x7f" <= c <= "\x9f" for c in value))


def usable_id(value: Any) -> bool:
    """Whether sessiondb takes ``value`` as a message id: a usable name without the reserved
    ``compaction_`` prefix."""
    return usable_name(value) and not value.startswith("compaction_")


def message_id_for(name: str) -> str:
    """``name`` as a message id when it is a usable one, else ``sha256:`` and its SHA-256 (the
    TypeScript client derives the same)."""
    return name if usable_id(name) else "sha256:" + hashlib.sha256(name.encode()).hexdigest()


class Copied(NamedTuple):
    """What a copy from a framework's own store did: the conversations it wrote (whole, or what
    came since an earlier copy), and those it skipped, as the target already held all of them
    (a copy run again) or they held nothing. Each is named as the framework names it."""

    copied: list
    skipped: list


class HeldPath(NamedTuple):
    """A session's stored path as a caller last read or wrote it, at the session's version:
    each message's JSON (parsed anew for every read, so readers never share objects), and the
    id of its last message."""

    version: int
    lines: tuple[bytes, ...]
    last_id: str | None

    def messages(self) -> list[dict]:
        return _json_lines(list(self.lines))

    def extended(self, version: int, added: list[dict]) -> HeldPath:
        """The path after a write at ``self.version`` that appended ``added`` (stored messages)
        and left the session at ``version``."""
        lines = tuple(json.dumps(m, ensure_ascii=False).encode() for m in added)
        return HeldPath(version, self.lines + lines, added[-1]["id"] if added else self.last_id)


# What an adapter remembers only to save a request (the sessions it created, the records it
# read) is forgotten all at once past this many entries, so a long-lived process stays bounded.
REMEMBERED = 4096


class RememberedIds(set):
    """Ids an adapter remembers only to skip a request, forgotten past ``REMEMBERED``."""

    def add(self, item: Any) -> None:
        if item not in self and len(self) >= REMEMBERED:
            self.clear()
        super().add(item)


class RememberedValues(dict):
    """Values an adapter remembers only to skip a request, forgotten past ``REMEMBERED``."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self and len(self) >= REMEMBERED:
            self.clear()
        super().__setitem__(key, value)


class HeldPaths:
    """The paths a caller holds (``HeldPath``) by session, for the ``capacity`` sessions used
    last: the least recently used is forgotten first. Safe to share between threads."""

    def __init__(self, capacity: int = 256):
        self._paths: OrderedDict[str, HeldPath] = OrderedDict()
        self._capacity = capacity
        self._guard = threading.Lock()

    def get(self, session_id: str) -> HeldPath | None:
        with self._guard:
            held = self._paths.get(session_id)
            if held is not None:
                self._paths.move_to_end(session_id)
            return held

    def pop(self, session_id: str) -> HeldPath | None:
        """What was held for the session, forgotten (a writer takes it while it writes)."""
        with self._guard:
            return self._paths.pop(session_id, None)

    def put(self, session_id: str, held: HeldPath | None) -> None:
        """Holds ``held`` for the session; ``None`` forgets what was held."""
        with self._guard:
            if held is None:
                self._paths.pop(session_id, None)
                return
            self._paths[session_id] = held
            self._paths.move_to_end(session_id)
            while len(self._paths) > self._capacity:
                self._paths.popitem(last=False)


class Client:
    """The sessiondb HTTP API at ``base_url`` (``http://127.0.0.1:8787`` is ``sessiondb serve``'s
    default). ``api_key`` is sent as ``Authorization: Bearer``; without one, requests are
    anonymous, which a server without configured keys accepts. An ``https`` URL trusts what the
    system trusts, or what ``ssl_context`` does.

    Methods cover sessions, messages, history, search, compactions and state, returning the
    API's JSON as plain dicts and lists; any other route is reached with ``request``. Connections
    are kept open between requests (a new one is about a third of a small request's time) and
    shared by the threads using the client.
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8787", api_key: str | None = None,
                 timeout: float = 30.0, ssl_context: ssl.SSLContext | None = None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        parts = urllib.parse.urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/path]: {base_url!r}")
        # What an https URL trusts: the caller's (``ssl.create_default_context(cafile=...)`` for
        # a private CA), else the system's, loaded once (~20 ms here), not per connection.
        self._ssl_context = None
        if parts.scheme == "https":
            self._ssl_context = ssl_context or ssl.create_default_context()
        self._host, self._port, self._prefix = parts.hostname, parts.port, parts.path
        self._idle: list[Connection] = []
        self._guard = threading.Lock()

    def close(self) -> None:
        """Closes the idle connections; the next request opens a new one."""
        with self._guard:
            connections, self._idle = self._idle, []
        for connection in connections:
            connection.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _connect(self) -> Connection:
        return Connection(self._host, self._port, self.timeout, self._ssl_context)

    def _checkout(self) -> tuple[Connection, bool]:
        """An idle connection (``True``: it served requests before) or a new one. Idle ones the
        server has closed meanwhile are passed over: a POST sent on one would fail with no way
        to tell whether it was applied."""
        while True:
            with self._guard:
                if not self._idle:
                    break
                connection = self._idle.pop()
            if not connection.closed_by_server():
                return connection, True
            connection.close()
        return self._connect(), False

    def _checkin(self, connection: Connection) -> None:
        with self._guard:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(connection)
                return
        connection.close()

    def _prepare(self, path: str, query: dict[str, Any] | None,
                 body: Any) -> tuple[str, bytes | None, dict[str, str]]:
        target = self._prefix + path
        pairs = {k: v for k, v in (query or {}).items() if v is not None}
        if pairs:
            target += "?" + urllib.parse.urlencode(pairs)
        headers = {"accept": "application/json"}
        data = None
        if isinstance(body, bytes):
            data = body
            headers["content-type"] = "application/x-ndjson"
        elif body is not _OMITTED:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        if self.api_key is not None:
            headers["authorization"] = f"Bearer {self.api_key}"
        return target, data, headers

    def _unavailable(self, method: str, target: str, failure: Exception) -> SessiondbUnavailable:
        return SessiondbUnavailable(f"{method} {target} on {self.base_url}: {failure!r}")

    def request(self, method: str, path: str, query: dict[str, Any] | None = None,
                body: Any = _OMITTED) -> Any:
        """Sends one request to ``path`` (``/v1/...``, segments already encoded) and returns the
        decoded JSON answer, or ``None`` for an empty one (204)."""
        raw = self._exchange(method, path, query, body)
        return json.loads(raw) if raw else None

    def _start(self, method: str, target: str, headers: dict[str, str],
               data: bytes | None) -> tuple[Connection, Answer]:
        """Sends a request on a kept (or new) connection and reads its answer's head."""
        for attempt in range(2):
            connection, reused = self._checkout()
            # An idle connection that the server has closed meanwhile fails before any answer,
            # and the request is sent again on a new one: always when sending failed (nothing
            # reached the server), and when no answer came unless it was a POST, which the
            # server may have received and applied.
            try:
                connection.send(method, target, headers, data)
            except OSError as failure:
                # A server may answer before it has read the whole body (a body over its limit)
                # and close the connection: the answer, when it came, is the request's.
                early = None if isinstance(failure, TimeoutError) else connection.early_answer()
                if early is not None:
                    return connection, early
                connection.close()
                if reused and attempt == 0 and not isinstance(failure, TimeoutError):
                    continue
                raise self._unavailable(method, target, failure) from None
            try:
                return connection, connection.answer()
            except OSError as failure:
                connection.close()
                dropped = isinstance(failure, ConnectionResetError)
                if reused and attempt == 0 and dropped and method != "POST":
                    continue
                raise self._unavailable(method, target, failure) from None
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _finish(self, connection: Connection, answer: Answer) -> None:
        """Keeps the connection of an answer read to its end, when the answer allows."""
        if answer.reusable:
            self._checkin(connection)
        else:
            connection.close()

    def _read(self, connection: Connection, answer: Answer, method: str, target: str) -> bytes:
        """The whole body of a 2xx answer (an error answer raises its typed error); the
        connection goes back to the pool, or is closed when reading failed."""
        try:
            raw = answer.read()
        except OSError as failure:
            connection.close()
            raise self._unavailable(method, target, failure) from None
        self._finish(connection, answer)
        if answer.status >= 400:
            raise _error_of(answer.status, answer.reason, raw)
        return raw

    def _exchange(self, method: str, path: str, query: dict[str, Any] | None,
                  body: Any) -> bytes:
        """One request; the whole body of a 2xx answer."""
        return self._answered(method, path, query, body)[0]

    def _answered(self, method: str, path: str, query: dict[str, Any] | None,
                  body: Any) -> tuple[bytes, Answer]:
        """One request; the whole body of a 2xx answer, and the answer (for its headers)."""
        target, data, headers = self._prepare(path, query, body)
        connection, answer = self._start(method, target, headers, data)
        return self._read(connection, answer, method, target), answer

    def _lines(self, path: str, query: dict[str, Any] | None) -> Iterator[dict]:
        """The JSON lines of an NDJSON answer, read as they arrive; its connection is kept for
        the next request once the stream was read to its end, and closed if it was left half
        read."""
        target, data, headers = self._prepare(path, query, _OMITTED)
        connection, answer = self._start("GET", target, headers, data)
        if answer.status >= 400:
            self._read(connection, answer, "GET", target)
        read_to_end = False
        try:
            # Parse each block's lines at once: one `json.loads` per line costs 3-4x one per
            # block (200 messages: 2.3 ms read line by line, 0.6 ms this way).
            pending = b""
            blocks = answer.blocks()
            while True:
                try:
                    block = next(blocks, b"")
                except OSError as failure:
                    raise self._unavailable("GET", target, failure) from None
                if not block:
                    break
                *complete, pending = (pending + block).split(b"\n")
                yield from _json_lines(complete)
            read_to_end = True
            yield from _json_lines([pending])
        finally:
            if read_to_end:
                self._finish(connection, answer)
            else:
                connection.close()

    def _session_path(self, session_id: str, *rest: str) -> str:
        return "/".join(["/v1/sessions", _segment(session_id), *(_segment(r) for r in rest)])

    # -- sessions ---------------------------------------------------------------------------

    def create_session(self, id: str | None = None, **fields: Any) -> dict:
        """``POST /v1/sessions``. ``fields``: ``name``, ``parentSessionId``, ``model``,
        ``source``, ``userId``, ``metadata``. An existing id is a ``conflict`` error."""
        body = dict(fields)
        if id is not None:
            body["id"] = id
        return self.request("POST", "/v1/sessions", body=body)

    def get_session(self, session_id: str) -> dict:
        return self.request("GET", self._session_path(session_id))

    def update_session(self, session_id: str, **fields: Any) -> dict:
        """``PATCH``: ``name``, ``model``, ``metadata`` (shallow merge, ``None`` deletes a key),
        ``settings``."""
        return self.request("PATCH", self._session_path(session_id), body=fields)

    def delete_session(self, session_id: str, missing_ok: bool = False) -> None:
        """Deletes the session with its messages, compactions, state and context; a missing
        one is a ``not_found`` error unless ``missing_ok``."""
        try:
            self.request("DELETE", self._session_path(session_id))
        except SessiondbError as error:
            if not (missing_ok and error.code == "not_found"):
                raise

    def delete_user_sessions(self, user_id: str) -> int:
        """Deletes every session of ``user_id``, each with everything in it, as erasing what a
        user left asks; returns how many."""
        return self.request("DELETE", "/v1/sessions", query={"userId": user_id})["deleted"]

    def list_sessions(self, user_id: str | None = None, sort: str | None = None,
                      order: str | None = None, page_size: int = 100) -> Iterator[dict]:
        """Every session of the namespace, following the listing's cursors page after page."""
        return self._paged("/v1/sessions", {"limit": page_size, "userId": user_id, "sort": sort,
                                            "order": order})

    def _paged(self, path: str, query: dict[str, Any]) -> Iterator[dict]:
        """Every item of the cursor listing at ``path``, one page at a time as it is taken."""
        after = None
        while True:
            page = self.request("GET", path, query={**query, "after": after})
            yield from page["items"]
            after = page.get("nextCursor")
            if after is None or not page["items"]:
                return

    def fork(self, session_id: str, at_message_id: str, id: str | None = None,
             name: str | None = None) -> dict:
        """A new session holding the path to ``at_message_id`` (with fresh message ids); the
        source stays as it is."""
        body = {"atMessageId": at_message_id, "id": id, "name": name}
        return self.request("POST", self._session_path(session_id, "fork"),
                            body={k: v for k, v in body.items() if v is not None})

    def split(self, session_id: str, summary: str, name: str | None = None) -> dict:
        """Ends the session (``endReason`` ``compaction``) and returns its continuation, a new
        session that starts from ``summary``."""
        body = {"summary": summary} if name is None else {"summary": summary, "name": name}
        return self.request("POST", self._session_path(session_id, "split"), body=body)

    def add_usage(self, session_id: str, input_tokens: int = 0, output_tokens: int = 0,
                  cost: float = 0.0) -> dict:
        """Adds what a model call reported to the session's counters; returns the session."""
        return self.request("POST", self._session_path(session_id, "usage"), body={
            "inputTokens": input_tokens, "outputTokens": output_tokens, "cost": cost})

    def search_all(self, query: str, user_id: str | None = None, limit: int | None = None,
                   role: str | None = None, since: int | None = None,
                   until: int | None = None, snippet_words: int | None = None,
                   match: str | None = None) -> list[dict]:
        """Full-text search across the namespace's sessions (or one user's), best first: messages
        holding every word, or with ``match="any"`` at least one (for a question in natural
        language); only ``role``'s messages, or those created from ``since`` to before ``until``
        (epoch milliseconds), when given. Each hit's ``snippet`` is the part of its ``content`` around
        the matched words (at most ``snippet_words``, 16 by default), as pieces alternating
        between plain text (even positions) and a matched word (odd positions)."""
        return self.request("GET", "/v1/search", query={
            "q": query, "userId": user_id, "limit": limit, "role": role, "since": since,
            "until": until, "snippetWords": snippet_words, "match": match})

    # -- messages ---------------------------------------------------------------------------

    def append(self, session_id: str, message: dict, parent: str | None = _OMITTED,
               if_leaf: str | None = _OMITTED, if_version: int | None = None) -> dict:
        """Appends one message; returns ``{inserted, message, version}`` (the session's version
        once the append committed). ``parent`` omitted appends under the active leaf, ``None``
        starts a new root, an id branches under that message. Appending to an unknown session
        creates it. With ``if_leaf`` (an id, or ``None`` for a session without messages) the
        append happens only while the session exists with that active leaf, with ``if_version``
        only while it is at that version: otherwise a ``not_found`` or ``conflict`` error, and
        nothing written."""
        query = _condition_query(if_leaf, if_version)
        if parent is not _OMITTED:
            query["parent"] = parent or ""
        appended, version = self._post_write(self._session_path(session_id, "messages"), query,
                                             message)
        return {**appended, "version": version}

    def append_batch(self, session_id: str, messages: list[dict],
                     parent_id: str | None = None, if_leaf: str | None = _OMITTED,
                     if_version: int | None = None) -> list[dict]:
        """Appends messages chained one after another in one write: all are stored or none
        (``if_leaf`` as for ``append``; ``if_version`` as for ``append_batch_versioned``)."""
        return self.append_batch_versioned(session_id, messages, parent_id, if_leaf,
                                           if_version)[0]

    def append_batch_versioned(self, session_id: str, messages: list[dict],
                               parent_id: str | None = None, if_leaf: str | None = _OMITTED,
                               if_version: int | None = None) -> tuple[list[dict], int | None]:
        """``append_batch``, with the session's version once the write committed. With
        ``if_version`` (a version the session had: ``get_session``'s, ``versioned_history``'s,
        an earlier write's) the write happens only while nothing changed the session since, an
        edit too: otherwise a ``not_found`` or ``conflict`` error, and nothing written. Not
        beside ``if_leaf``."""
        body: dict[str, Any] = {"messages": messages}
        if parent_id is not None:
            body["parentId"] = parent_id
        stored, version = self._post_write(self._session_path(session_id, "messages", "batch"),
                                           _condition_query(if_leaf, if_version), body)
        return stored["messages"], version

    def append_held(self, session_id: str, messages: list[dict], held: HeldPaths) -> list[dict]:
        """``append_batch`` for a caller that holds the session's path in ``held``: written at
        the version held, the held path extends by the messages; when nothing is held, or the
        session moved since, they are appended under the active leaf all the same and the path
        is forgotten (the next read transfers it)."""
        kept = held.pop(session_id)
        if kept is not None:
            try:
                written, version = self.append_batch_versioned(session_id, messages,
                                                               if_version=kept.version)
            except SessiondbError as error:
                if error.code not in ("conflict", "not_found"):
                    raise
            else:
                held.put(session_id, kept.extended(version, written) if version else None)
                return written
        return self.append_batch(session_id, messages)

    def append_missing(self, session_id: str, missing: Callable[[list[dict]], list[dict]],
                       held: HeldPaths, tail: int | None = None) -> list[dict]:
        """Appends what ``missing(stored)`` finds the session lacks, given its stored path (its
        last ``tail`` messages when given), in one write made only while the session is as that
        path was read: a write from elsewhere in between is read and compared again (three
        attempts, then a ``conflict``). The path held in ``held`` is compared without a read
        (the write's condition is the check) and extended by what was written. Returns it."""
        kept = held.get(session_id)
        for _ in range(3):
            condition: dict[str, Any]
            if kept is not None:
                stored = _json_lines(list(kept.lines[-tail:] if tail else kept.lines))
                condition = {"if_version": kept.version}
            else:
                stored, kept = self.held_stored_history(session_id, None)
                condition = {"if_leaf": stored[-1]["id"]} if stored else {}
                stored = stored[-tail:] if tail else stored
            added = missing(stored)
            if not added:
                held.put(session_id, kept)
                return []
            try:
                written, version = self.append_batch_versioned(session_id, added, **condition)
            except SessiondbError as error:
                if error.code not in ("conflict", "not_found"):
                    raise
                kept = None
                continue
            held.put(session_id, kept.extended(version, written)
                     if kept is not None and version else None)
            return written
        held.put(session_id, None)
        raise SessiondbError(409, "conflict", f"session {session_id!r} kept changing while "
                             "messages were written to it; nothing was written")

    def _post_write(self, path: str, query: dict[str, Any], body: Any) -> tuple[Any, int | None]:
        """POSTs a write: its decoded answer, and the session's version once it committed."""
        raw, answer = self._answered("POST", path, query, body)
        version = answer.headers.get("x-sessiondb-version")
        return json.loads(raw), int(version) if version is not None else None

    def messages(self, session_id: str, limit: int | None = None, order: str | None = None,
                 after: str | None = None, before: str | None = None) -> dict:
        """One page of the active path: ``{items, nextCursor?, previousCursor?}``."""
        return self.request("GET", self._session_path(session_id, "messages"), query={
            "limit": limit, "order": order, "after": after, "before": before})

    def get_message(self, session_id: str, message_id: str) -> dict:
        return self.request("GET", self._session_path(session_id, "messages", message_id))

    def replace_message(self, session_id: str, message_id: str, message: dict,
                        upsert: bool = False) -> dict:
        """``PUT``: the whole message; a missing one is a ``not_found`` error unless
        ``upsert``, which appends it."""
        return self.request("PUT", self._session_path(session_id, "messages", message_id),
                            query={"upsert": "true"} if upsert else None, body=message)

    def update_message(self, session_id: str, message_id: str, **fields: Any) -> dict:
        """``PATCH``: the given ``role``, ``parts``, ``content``, ``metadata`` replace."""
        return self.request("PATCH", self._session_path(session_id, "messages", message_id),
                            body=fields)

    def delete_message(self, session_id: str, message_id: str) -> None:
        """Deletes one message; its children re-attach to the nearest surviving ancestor."""
        self.request("DELETE", self._session_path(session_id, "messages", message_id))

    def delete_messages(self, session_id: str, message_ids: Iterable[str]) -> int:
        """Deletes these messages at once (ids the session lacks are passed over) and returns
        how many were deleted; children re-attach to their nearest surviving ancestor."""
        return self.request("POST", self._session_path(session_id, "messages", "delete"),
                            body={"ids": list(message_ids)})["deleted"]

    def clear(self, session_id: str) -> None:
        """Deletes every message of the session; the session and its metadata stay."""
        self.request("DELETE", self._session_path(session_id, "messages"))

    def history(self, session_id: str, order: str = "oldest",
                leaf: str | None = None) -> Iterator[dict]:
        """The path to ``leaf`` (the active leaf by default) with compactions applied, one
        message at a time as the server streams it; stopping early closes the stream."""
        return self._lines(self._session_path(session_id, "history"),
                           {"order": order, "leaf": leaf})

    def full_history(self, session_id: str, leaf: str | None = None) -> list[dict]:
        """The whole path to ``leaf`` (the active leaf by default) with compactions applied, oldest
        first, read at once on the kept connection (``history`` streams instead)."""
        raw = self._exchange("GET", self._session_path(session_id, "history"),
                             {"leaf": leaf}, _OMITTED)
        return _json_lines(raw.split(b"\n"))

    def versioned_history(self, session_id: str,
                          unless_version: int | None = None) -> tuple[int, list[dict]] | None:
        """The active path with compactions applied, as ``full_history`` reads it, with the
        session's version the read began at (0: no such session). With ``unless_version``, a
        version read before, returns ``None`` without transferring the path while the session
        is still at it (the server answers ``304 Not Modified``): what was read then is what a
        read would return."""
        read = self._versioned_lines(session_id, unless_version)
        return None if read is None else (read[0], _json_lines(read[1]))

    def _versioned_lines(self, session_id: str,
                         unless_version: int | None) -> tuple[int, list[bytes]] | None:
        """``versioned_history`` with the path as its NDJSON lines (each a message's JSON)."""
        target, data, headers = self._prepare(self._session_path(session_id, "history"), None,
                                              _OMITTED)
        if unless_version is not None:
            headers["if-none-match"] = f'"{unless_version}"'
        connection, answer = self._start("GET", target, headers, data)
        raw = self._read(connection, answer, "GET", target)
        if answer.status == 304:
            return None
        tag = answer.headers.get("etag", "").removeprefix("W/").strip('"')
        return int(tag) if tag else 0, [line for line in raw.split(b"\n") if line.strip()]

    def stored_history(self, session_id: str) -> list[dict]:
        """The active path as stored, oldest first: no compaction's summary in place of the
        messages it covers. One history read when no compaction stands in the path, else pages of
        ``messages``."""
        return self.held_stored_history(session_id, None)[0]

    def held_stored_history(self, session_id: str, held: HeldPath | None, start: int = 0
                            ) -> tuple[list[dict], HeldPath | None]:
        """The active path as stored (as ``stored_history`` reads it), for a caller that keeps
        it: ``held`` is what it kept, parsed again without a transfer while the session is still
        at its version. Returns the path from position ``start`` (objects of the caller's own;
        those before it are not parsed again) and what to keep from now on: ``None`` when there
        is nothing to keep (no session, or a compaction's summary in the path, whose stored path
        is then read in pages)."""
        path, kept = self.held_history(session_id, held, start)
        # Nothing kept of a path read: a compaction stands in it (maybe before `start`).
        if kept is None and (path or start):
            return list(self.iter_messages(session_id))[start:], None
        return path, kept

    def held_history(self, session_id: str, held: HeldPath | None, start: int = 0
                     ) -> tuple[list[dict], HeldPath | None]:
        """The active path with compactions applied (as ``versioned_history`` reads it), for a
        caller that keeps it: ``held`` is what it kept, parsed again without a transfer while
        the session is still at its version. Returns the path from position ``start`` (objects
        of the caller's own; those before it are not parsed again) and what to keep from now
        on: ``None`` when there is nothing to keep (no session, or a compaction's summary in the
        path); what is kept is also the path as stored."""
        read = self._versioned_lines(session_id, held.version if held else None)
        if read is None and held is not None:
            return _json_lines(list(held.lines[start:])), held
        version, lines = read or (0, [])
        path = _json_lines(lines)
        if not version or any(m["id"].startswith(COMPACTION_PREFIX) for m in path):
            return path[start:], None
        return path[start:], HeldPath(version, tuple(lines), path[-1]["id"] if path else None)

    def iter_messages(self, session_id: str, order: str = "asc",
                      page_size: int = 100) -> Iterator[dict]:
        """Every message of the active path as stored, in ``order``, read a page at a time as
        the iteration takes them."""
        return self._paged(self._session_path(session_id, "messages"),
                           {"limit": page_size, "order": order})

    def model_history(self, session_id: str, format: str = "openai",
                      leaf: str | None = None) -> Any:
        """The path to ``leaf`` with compactions applied, in a model API's format: ``openai``
        (Chat Completions messages), ``openai-responses`` (Responses input items) or
        ``anthropic`` (``{system, messages}``); tool calls are always followed by their
        results."""
        return self.request("GET", self._session_path(session_id, "history"),
                            query={"format": format, "leaf": leaf})

    def recent_history(self, session_id: str, max_bytes: int,
                       leaf: str | None = None) -> dict:
        """The longest end of the path to ``leaf`` whose messages fit in ``max_bytes`` (the leaf
        at least), compactions applied, oldest first: ``{messages, truncated, totalBytes}``,
        ``truncated`` telling whether older messages were left out, ``totalBytes`` the size of
        the whole path."""
        raw, answer = self._answered("GET", self._session_path(session_id, "history"),
                                     {"maxBytes": max_bytes, "leaf": leaf}, _OMITTED)
        return {"messages": _json_lines(raw.split(b"\n")),
                "truncated": answer.headers.get("x-sessiondb-truncated") == "true",
                "totalBytes": int(answer.headers.get("x-sessiondb-total-bytes", "0"))}

    def branches(self, session_id: str, message_id: str) -> list[dict]:
        """The children of a message, oldest first."""
        return self.request("GET", self._session_path(session_id, "branches", message_id))

    def rows(self, session_id: str, leaf: str | None = None) -> list[dict]:
        """The path to ``leaf`` (the active leaf by default), root first, as rows without
        content: ``{id, role, bytes, tokenEstimate}``."""
        return self.request("GET", self._session_path(session_id, "rows"), {"leaf": leaf})

    def export(self, session_id: str) -> Iterator[dict]:
        """The whole session as the server streams it: its record (``{session}``, what an import
        gives a session it creates), every message of the tree with its ``parentId``
        (``{message, parentId, createdAt}``), then compactions, state and context."""
        return self._lines(self._session_path(session_id, "export"), None)

    def import_lines(self, session_id: str, lines: Iterable[dict],
                     if_leaf: str | None = _OMITTED) -> dict:
        """Imports lines as ``export`` gives them into the session (created if needed), all or
        nothing; messages whose id the session has are skipped, unless their line has
        ``"replace": True`` (the stored message is then rewritten as ``replace_message`` does).
        ``if_leaf`` as for ``append``. ``{imported, skipped}``."""
        return self.request("POST", self._session_path(session_id, "import"),
                            query=_leaf_query(if_leaf), body=_ndjson(lines))

    def import_together(self, parts: Iterable[dict]) -> dict:
        """Imports into several sessions as one write: every part lands, or (on any error in
        any part) none. Each part is a dict with ``session_id``, ``lines`` (as ``import_lines``
        takes them) and, optionally, one condition: ``if_leaf`` (as for ``import_lines``:
        ``None`` for a session without messages), ``if_version`` (the session is still at this
        version, as for ``append_batch_versioned``) or ``if_absent=True`` (the session must not
        exist yet: it is created with these lines, else a ``conflict``).
        ``{imported, skipped, parts: [{sessionId, imported, skipped, version}]}``, each part's
        ``version`` the session's once the write committed."""
        return self.request("POST", "/v1/import", body=_import_body(parts))

    def copy_conversation(self, session_id: str, messages: list[dict],
                          same: Callable[[dict, int], bool], record: dict | None = None, *,
                          created_at: list[int] | None = None, also_lines: Sequence[dict] = (),
                          also_parts: Sequence[dict] = ()) -> bool:
        """Copies ``messages`` in as the session's active path, each under the one before, for
        a copy from another store: ``True`` when it wrote, ``False`` when the session already
        holds them all (and maybe more: the conversation went on there). ``same(stored, i)``
        tells whether a stored message is the ``i``-th of ``messages`` as the caller sees them.
        A session that does not exist is created with them (and ``record``, fields of an
        import's session line), as is one without messages; one whose stored path is the first
        of them (an earlier copy, before the source went on) takes the rest under its leaf; one
        holding anything else is a ``conflict`` (``CopyConflict``), and nothing is written.
        ``created_at`` dates each message (epoch milliseconds; else the copy's time);
        ``also_lines`` (state, say) go into the session and ``also_parts`` (as
        ``import_together`` takes them) into other sessions with the write of the last message.
        Messages without an id get one (``msg_`` and a UUID, the shape of the server's), as an
        import names each message's parent by id. With nothing to write (no messages, record,
        lines or parts), ``False``.

        What is to be written goes in one write, all or nothing, unless it is longer than
        ``COPY_REQUEST_BYTES`` or the server refuses it as too large (``--max-body-bytes``):
        then in several, each under the one before and no longer than the last one taken, so a
        copy cut short leaves the first messages, which the next copy goes on from. Another
        writer that changes the session between two of them makes the copy a ``CopyConflict``
        whose ``wrote_before`` is true: the parts written stay."""
        if not (messages or record or also_lines or also_parts):
            return False
        messages = [m if m.get("id") else {**m, "id": "msg_" + str(uuid.uuid4())}
                    for m in messages]
        held: list[dict] = []
        wrote = False
        budget = COPY_REQUEST_BYTES
        # Each round writes only while the session is as just read, so a write between the read
        # and the import (another copy, say) is read and compared again.
        for _ in range(3):
            start, leaf = len(held), held[-1]["id"] if held else None
            head = [{"session": record}] if record and leaf is None else []
            encoded: list[bytes] = []
            for i in range(start, len(messages)):
                line = {"message": messages[i], "parentId": leaf}
                if created_at is not None:
                    line["createdAt"] = created_at[i]
                encoded.append(_ndjson([line]))
                leaf = messages[i]["id"]
            tail = _ndjson(also_lines) + _import_body(also_parts)
            # Absent, it is created with them, else (it exists) written while it has no message
            # (when there are some to write); with messages, written while its leaf is the one
            # read, as is every later write of this round while its leaf is the one written.
            conditions = ([{"if_leaf": held[-1]["id"]}] if held else
                          [{"if_absent": True}] + ([{"if_leaf": None}] if messages else []))
            written = 0
            while True:
                end, size = written, 0
                while end < len(encoded) and (end == written
                                              or size + len(encoded[end]) <= budget):
                    size += len(encoded[end])
                    end += 1
                last = end == len(encoded)
                body = b"".join(encoded[written:end]) + (tail if last else b"")
                try:
                    if not self._import_first_met(session_id, conditions,
                                                  head if written == 0 else [], body):
                        break
                except SessiondbError as error:
                    if error.code != "payload_too_large" or end - written < 2:
                        raise
                    budget = size // 2
                    continue
                wrote = True
                if last:
                    return True
                written = end
                conditions = [{"if_leaf": messages[start + end - 1]["id"]}]
            held = self.stored_history(session_id)
            if not all(map(same, held, range(len(messages)))):
                break
            if len(held) >= len(messages):
                return wrote
        raise CopyConflict(session_id, wrote)

    def _import_first_met(self, session_id: str, conditions: list[dict], lines: list[dict],
                          encoded: bytes) -> bool:
        """Imports ``lines``, then the NDJSON ``encoded`` (more of the session's lines, then
        maybe other parts), under the first of ``conditions`` the session meets; ``False``
        when it meets none (each a ``conflict``)."""
        for condition in conditions:
            part = {"session_id": session_id, "lines": lines, **condition}
            try:
                self.request("POST", "/v1/import", body=_import_body([part]) + encoded)
                return True
            except SessiondbError as error:
                if error.code != "conflict":
                    raise
        return False

    def import_templates(self, lines: Iterable[dict]) -> dict:
        """Imports a templates' part of a dump (an optional ``{"templates": {}}`` line, then block
        and entry lines) into the namespace's context templates, all or nothing: a block
        replaces the template of its label, an entry the template entry of its key.
        ``{imported, skipped}``."""
        return self.request("POST", "/v1/context", body=_ndjson(lines))

    def search(self, session_id: str, query: str, limit: int | None = None,
               role: str | None = None, since: int | None = None,
               until: int | None = None, snippet_words: int | None = None,
               match: str | None = None) -> list[dict]:
        """Full-text search in the session, best first; matched, filtered and shown as
        ``search_all``."""
        return self.request("GET", self._session_path(session_id, "search"), query={
            "q": query, "limit": limit, "role": role, "since": since, "until": until,
            "snippetWords": snippet_words, "match": match})

    # -- compaction -------------------------------------------------------------------------

    def add_compaction(self, session_id: str, summary: str, from_message_id: str,
                       to_message_id: str) -> dict:
        """Shows ``summary`` in place of the messages from one id to the other in history;
        nothing is deleted."""
        return self.request("POST", self._session_path(session_id, "compactions"), body={
            "summary": summary, "fromMessageId": from_message_id,
            "toMessageId": to_message_id})

    def compactions(self, session_id: str) -> list[dict]:
        """The session's compactions, oldest first."""
        return self.request("GET", self._session_path(session_id, "compactions"))

    def compact(self, session_id: str) -> dict | None:
        """Runs the server's summarizer; ``None`` when there was nothing to compact."""
        return self.request("POST", self._session_path(session_id, "compact"))

    # -- state ------------------------------------------------------------------------------

    def get_state(self, session_id: str, key: str, default: Any = _OMITTED) -> Any:
        """The JSON value under ``key``; a missing key is a ``not_found`` error unless a
        ``default`` is given."""
        try:
            return self.request("GET", self._session_path(session_id, "state", key))
        except SessiondbError as error:
            if error.code == "not_found" and default is not _OMITTED:
                return default
            raise

    def put_state(self, session_id: str, key: str, value: Any) -> None:
        self.request("PUT", self._session_path(session_id, "state", key), body=value)

    def delete_state(self, session_id: str, key: str) -> None:
        self.request("DELETE", self._session_path(session_id, "state", key))

    def all_state(self, session_id: str) -> dict:
        return self.request("GET", self._session_path(session_id, "state"))


    # -- change feed ------------------------------------------------------------------------

    def events(self, session_id: str | None = None,
               last_event_id: str | None = None) -> Iterator[dict]:
        """The change feed as it happens, one ``{event, id, data}`` per durable write (``event``
        the change: ``append``, ``update``, ``delete``, ...; ``data`` decoded): a session's, or
        with ``None`` the whole namespace's. To resume, pass the last ``id`` seen as
        ``last_event_id``: the retained events after it come first, or a ``reset`` event when
        it is no longer retained (re-read what you need, then follow). The feed never ends by
        itself; stop iterating to close it. The server sends a keep-alive every 15 s, so the
        client's ``timeout`` must be longer than that."""
        path = self._session_path(session_id, "events") if session_id is not None \
            else "/v1/events"
        target, data, headers = self._prepare(path, None, _OMITTED)
        headers["accept"] = "text/event-stream"
        if last_event_id is not None:
            headers["last-event-id"] = last_event_id
        connection, answer = self._start("GET", target, headers, data)
        if answer.status >= 400:
            self._read(connection, answer, "GET", target)
        try:
            event: dict[str, Any] = {}
            pending = b""
            for block in answer.blocks():
                *complete, pending = (pending + block).split(b"\n")
                for raw in complete:
                    line = raw.rstrip(b"\r").decode()
                    if not line:
                        if "data" in event:
                            yield {"event": event.get("event", "message"),
                                   "id": event.get("id"), "data": json.loads(event["data"])}
                        event = {}
                        continue
                    if line.startswith(":"):
                        continue  # a keep-alive
                    name, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if name == "data" and "data" in event:
                        value = event["data"] + "\n" + value
                    event[name] = value
        except OSError as failure:
            raise self._unavailable("GET", target, failure) from None
        finally:
            # A feed is never read to its end: its connection cannot serve another request.
            connection.close()

    # -- context blocks, the prompt and the tools -------------------------------------------
    # A ``session_id`` of ``None`` addresses the namespace's templates, which every session
    # sees (a session writing a template's text gets its own copy).

    def _context_path(self, session_id: str | None, *rest: str) -> str:
        if session_id is None:
            return "/".join(["/v1/context", *(_segment(r) for r in rest)])
        return self._session_path(session_id, "context", *rest)

    def blocks(self, session_id: str | None) -> list[dict]:
        """Every block in prompt order: ``{label, kind, description, maxTokens, content,
        tokens}``."""
        return self.request("GET", self._context_path(session_id))

    def define_block(self, session_id: str | None, label: str, kind: str,
                     description: str | None = None, max_tokens: int | None = None,
                     content: str | None = None) -> dict:
        """Defines (or redefines) a block: ``kind`` is ``readonly``, ``writable``, ``skill`` or
        ``search``; text beyond ``max_tokens`` is refused."""
        body = {"kind": kind, "description": description, "maxTokens": max_tokens,
                "content": content}
        return self.request("PUT", self._context_path(session_id, label),
                            body={k: v for k, v in body.items() if v is not None})

    def append_to_block(self, session_id: str | None, label: str, content: str) -> dict:
        """Appends text to a writable block (on a line of its own); returns the block."""
        return self.request("POST", self._context_path(session_id, label, "append"),
                            body={"content": content})

    def delete_block(self, session_id: str | None, label: str) -> None:
        """Deletes a block with its entries; a missing one is a ``not_found`` error."""
        self.request("DELETE", self._context_path(session_id, label))

    def put_entry(self, session_id: str | None, label: str, key: str, content: str,
                  description: str | None = None) -> dict:
        """Stores an entry of a skill or search block under ``key``."""
        body = {"content": content} if description is None else {
            "content": content, "description": description}
        return self.request("PUT", self._context_path(session_id, label, "entries", key),
                            body=body)

    def get_entry(self, session_id: str | None, label: str, key: str) -> dict:
        """One entry (a session's own before its template's); missing: ``not_found``."""
        return self.request("GET", self._context_path(session_id, label, "entries", key))

    def delete_entry(self, session_id: str | None, label: str, key: str) -> None:
        """Deletes the scope's own entry of ``key`` (a session's template entry of that key then
        shows again); a missing one is a ``not_found`` error."""
        self.request("DELETE", self._context_path(session_id, label, "entries", key))

    def entries(self, session_id: str | None, label: str) -> list[dict]:
        """Every entry of a skill or search block, by key (a session's own in place of its
        template's), read a page of 100 at a time."""
        return list(self._paged(self._context_path(session_id, label, "entries"),
                                {"limit": 100}))

    def prompt(self, session_id: str) -> dict:
        """The session's system prompt, rendered and frozen on the first call:
        ``{prompt, frozenAt}``."""
        return self.request("GET", self._session_path(session_id, "prompt"))

    def refresh_prompt(self, session_id: str) -> dict:
        """Renders the prompt anew from the blocks as they are now and freezes that."""
        return self.request("POST", self._session_path(session_id, "prompt", "refresh"))

    def tools(self, session_id: str, format: str = "raw") -> list[dict]:
        """The tools the session's blocks call for, as ``raw`` JSON Schema, ``openai`` or
        ``anthropic`` definitions."""
        return self.request("GET", self._session_path(session_id, "tools"),
                            query={"format": format})

    def run_tool(self, session_id: str, name: str, arguments: dict) -> str:
        """Runs a tool call the model made; its output (a refusal is an ``Error: …`` output,
        not an exception)."""
        return self.request("POST", self._session_path(session_id, "tools", name),
                            body={"arguments": arguments})["output"]


def _leaf_query(if_leaf: str | None) -> dict[str, str]:
    """The ``ifLeaf`` condition of a write: omitted, ``None`` (no message yet) or a leaf id."""
    return {} if if_leaf is _OMITTED else {"ifLeaf": if_leaf or ""}


def _condition_query(if_leaf: str | None, if_version: int | None) -> dict[str, Any]:
    """The ``ifLeaf`` and ``ifVersion`` conditions of an append."""
    query: dict[str, Any] = _leaf_query(if_leaf)
    if if_version is not None:
        query["ifVersion"] = if_version
    return query


def _import_body(parts: Iterable[dict]) -> bytes:
    """The NDJSON body of an import into several sessions (``Client.import_together``)."""
    lines: list[dict] = []
    for part in parts:
        into: dict[str, Any] = {"sessionId": part["session_id"]}
        if "if_leaf" in part:
            into["ifLeaf"] = part["if_leaf"]
        if part.get("if_version") is not None:
            into["ifVersion"] = part["if_version"]
        if part.get("if_absent"):
            into["ifAbsent"] = True
        lines.append({"into": into})
        lines.extend(part["lines"])
    return _ndjson(lines)


def _ndjson(lines: Iterable[dict]) -> bytes:
    """An NDJSON request body of ``lines``."""
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _json_lines(lines: list[bytes]) -> list:
    """The JSON values of NDJSON lines (no line holds a raw newline), parsed in one call."""
    values = [line for line in lines if line.strip()]
    return json.loads(b"[" + b",".join(values) + b"]") if values else []


def _error_of(status: int, reason: str, raw: bytes) -> SessiondbError:
    try:
        error = json.loads(raw)["error"]
        return SessiondbError(status, error["code"], error["message"])
    except (ValueError, KeyError, TypeError):
        # Not the API's error shape (a proxy in between, or the HTTP layer's own answer).
        return SessiondbError(status, "http_error", raw.decode(errors="replace") or reason)

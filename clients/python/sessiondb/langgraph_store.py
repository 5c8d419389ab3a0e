"""LangGraph's long-term memory store on sessiondb: ``graph.compile(store=SessiondbStore(client))``.

How items are stored. Each namespace (a tuple of strings) is one sessiondb session, whose id
joins the percent-encoded parts with ``/`` after the store's ``prefix`` (a SHA-256 of that past
256 characters), recorded for the user ``prefix + "langgraph-store"`` with the namespace in its
metadata under ``langgraphNamespace``, so one listing finds every namespace. Each item is one
message of its namespace's session: the key as its id (``sha256:`` and a SHA-256 of the key
when it is not a usable id), the value as its content and the key in its metadata under
``storeKey``. So a put is one request that stores the value or changes it in place (``PUT``
with ``upsert``), the server keeps the item's creation time and stamps its updates, and a get
is one read by id.

Searches read the matching namespaces' items and filter them here, newest update first (as
LangGraph's SQL stores order them). With an ``index`` (LangGraph's ``IndexConfig``: ``embed``
and ``fields``), a put embeds the texts at the item's fields (or the op's own ``index``) and
keeps their vectors in the item's metadata under ``storeVectors`` (path to the float64 values,
little-endian, in base64: exact and a third of the size of JSON numbers); a search with a
``query`` ranks the matching items by the cosine similarity of the query's embedding with their
closest vector, as ``InMemoryStore`` does, and says so in ``score``. Without an index
``query`` is ignored, as there. A namespace holds at most the server's
``--max-messages-per-session`` items (10,000 by default).

Time to live (``ttl=`` on a put, the store's ``ttl`` config), as LangGraph's SQL stores keep it:
an item put with a TTL expires that many minutes after it was last put or read (reads restart
it unless ``refresh_ttl`` is false or the config's ``refresh_on_read`` is), ``sweep_ttl`` (or the
thread ``start_ttl_sweeper`` runs) deletes expired items, and until then they are still read
unless the config's ``omit_expired`` is set. The TTL is in the item's metadata (``storeTtl``,
minutes), written with its value, so a put without one drops it; the time it last restarted is
a state key of the namespace's session (``ttl:<item's message id>``), so a read that restarts it
changes neither the item nor its ``updated_at``.

Moving in. ``copy_store`` copies every namespace's items from any other store (``InMemoryStore``,
``PostgresStore``, ``SqliteStore``, ...) with a put each, embedded by the target's index. Each
namespace is compared with the target's before any of its items is written: an item the target
holds with the same value is skipped (so a copy run again writes nothing), and a namespace where
the target holds an item with another value is refused (``conflict``), writing nothing of it.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
import math
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

from .client import (
    Client,
    Copied,
    RememberedIds,
    SessiondbError,
    bounded_id,
    joined_id,
    message_id_for,
)

NAMESPACE_KEY = "langgraphNamespace"
ITEM_KEY = "storeKey"
VECTORS_KEY = "storeVectors"
TTL_KEY = "storeTtl"
OWNER = "langgraph-store"

logger = logging.getLogger(__name__)


def _restarted_key(message_id: str) -> str:
    """The state key holding when an item's TTL last restarted (epoch ms)."""
    return bounded_id(message_id, "ttl:")


def _expires_at(message: dict, restarted: dict[str, Any]) -> float | None:
    """When an item expires (epoch ms): its TTL after it last restarted (``restarted``: restart
    times by state key), or after its last put when that time was never recorded; None without
    a TTL."""
    minutes = (message.get("metadata") or {}).get(TTL_KEY)
    if minutes is None:
        return None
    started = restarted.get(_restarted_key(message["id"]))
    if started is None:
        started = message.get("updatedAt") or message["createdAt"]
    return started + minutes * 60_000


def _encode_vector(vector: Sequence[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}d", *vector)).decode()


def _decode_vector(stored: str) -> tuple[float, ...]:
    raw = base64.b64decode(stored)
    return struct.unpack(f"<{len(raw) // 8}d", raw)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b)) / norms if norms else 0.0


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: nested objects match key by key, lists element by element,
    an object of ``$eq $ne $gt $gte $lt $lte`` compares, anything else is equality."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_compare(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(wanted)
                and all(_matches(v, w) for v, w in zip(value, wanted)))
    return value == wanted


def _compare(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return value == operand
    if operator == "$ne":
        return value != operand
    if operator in ("$gt", "$gte", "$lt", "$lte"):
        if value is None:
            return False
        a, b = float(value), float(operand)
        return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[operator]
    raise ValueError(f"unsupported filter operator {operator!r}")


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """A ``prefix`` or ``suffix`` condition, where ``*`` matches any one part."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path))
    else:
        raise ValueError(f"unsupported match type {condition.match_type!r}")
    return all(p == "*" or p == n for n, p in pairs)


class SessiondbStore(BaseStore):
    """A LangGraph ``BaseStore`` on the sessiondb server behind ``client``.

    ``prefix`` is put before every session id and the owner this store writes, to keep its
    namespaces apart from other sessions of the sessiondb namespace. The async methods run the
    blocking calls on a worker thread.
    """

    supports_ttl = True

    def __init__(self, client: Client, prefix: str = "", *, index: IndexConfig | None = None,
                 ttl: TTLConfig | None = None):
        self.client = client
        self.prefix = prefix
        self._created = RememberedIds()
        self.ttl_config = ttl
        self._sweeper: threading.Thread | None = None
        self._stop_sweeping = threading.Event()
        # The clock TTLs run on (epoch ms).
        self._now_ms = lambda: int(time.time() * 1000)
        self.index_config = index
        self.embeddings = ensure_embeddings(index["embed"]) if index else None
        self._fields = [(f, f if f == "$" else tokenize_path(f))
                        for f in ((index or {}).get("fields") or ["$"])]

    def _session(self, namespace: tuple[str, ...]) -> str:
        return bounded_id(joined_id(*namespace), self.prefix)

    def _owner(self) -> str:
        return bounded_id(OWNER, self.prefix)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        indexed, texts, queries = self._to_embed(ops)
        documents = self.embeddings.embed_documents(texts) if texts else []
        return self._run(ops, indexed, dict(zip(texts, documents)),
                         {q: self.embeddings.embed_query(q) for q in queries})

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        indexed, texts, queries = self._to_embed(ops)
        documents = await self.embeddings.aembed_documents(texts) if texts else []
        embedded = await asyncio.gather(*(self.embeddings.aembed_query(q) for q in queries))
        return await asyncio.to_thread(self._run, ops, indexed, dict(zip(texts, documents)),
                                       dict(zip(queries, embedded)))

    def _to_embed(self, ops: list[Op]) -> tuple[list[list[tuple[str, str]]], list[str], list[str]]:
        """The (path, text) pairs each op indexes (none but for puts), and the texts and the
        search queries to embed, each once."""
        indexed = [self._texts(op) if isinstance(op, PutOp) else [] for op in ops]
        texts = {text: None for pairs in indexed for _, text in pairs}
        queries = {op.query: None for op in ops if isinstance(op, SearchOp) and op.query} \
            if self.embeddings is not None else {}
        return indexed, list(texts), list(queries)

    def _texts(self, op: PutOp) -> list[tuple[str, str]]:
        """(path, text) pairs a put indexes: at the store's fields, or at the op's own; a field
        holding several texts gives ``path.0``, ``path.1``, … as ``InMemoryStore`` names them."""
        if self.embeddings is None or op.value is None or op.index is False:
            return []
        fields = self._fields if op.index is None else [(f, tokenize_path(f)) for f in op.index]
        found = []
        for path, field in fields:
            texts = get_text_at_path(op.value, field)
            if len(texts) == 1:
                found.append((path, texts[0]))
            else:
                found.extend((f"{path}.{i}", text) for i, text in enumerate(texts))
        return found

    def _run(self, ops: list[Op], indexed: list[list[tuple[str, str]]],
             documents: dict[str, list[float]], queries: dict[str, list[float]]) -> list[Result]:
        results: list[Result] = []
        for op, pairs in zip(ops, indexed):
            if isinstance(op, GetOp):
                results.append(self._get(op.namespace, op.key, op.refresh_ttl))
            elif isinstance(op, PutOp):
                self._put(op, {path: documents[text] for path, text in pairs})
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op, queries.get(op.query) if op.query else None))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise ValueError(f"unknown store operation {type(op).__name__}")
        return results

    def _item(self, namespace: tuple[str, ...], message: dict) -> Item:
        created = message["createdAt"]
        return Item(value=message["content"], key=message["metadata"][ITEM_KEY],
                    namespace=namespace, created_at=_time(created),
                    updated_at=_time(message.get("updatedAt") or created))

    def _omit_expired(self) -> bool:
        return bool((self.ttl_config or {}).get("omit_expired"))

    def _get(self, namespace: tuple[str, ...], key: str, refresh: bool) -> Item | None:
        session_id = self._session(namespace)
        try:
            message = self.client.get_message(session_id, message_id_for(key))
        except SessiondbError as error:
            if error.code == "not_found":
                return None
            raise
        if (message.get("metadata") or {}).get(TTL_KEY) is not None:
            restarted_key = _restarted_key(message["id"])
            if self._omit_expired():
                restarted = self.client.get_state(session_id, restarted_key, default=None)
                if _expires_at(message, {restarted_key: restarted}) < self._now_ms():
                    return None
            if refresh:
                self.client.put_state(session_id, restarted_key, self._now_ms())
        return self._item(namespace, message)

    def _put(self, op: PutOp, vectors: dict[str, list[float]]) -> None:
        namespace = tuple(op.namespace)
        session_id = self._session(namespace)
        message_id = message_id_for(op.key)
        if op.value is None:
            try:
                self.client.delete_message(session_id, message_id)
            except SessiondbError as error:
                if error.code != "not_found":
                    raise
            return
        if not isinstance(op.value, dict):
            raise TypeError(f"a store value is a dict, not {type(op.value).__name__}")
        if session_id not in self._created:
            try:
                self.client.create_session(session_id, userId=self._owner(),
                                           metadata={NAMESPACE_KEY: list(namespace)})
            except SessiondbError as error:
                if error.code != "conflict":
                    raise
            self._created.add(session_id)
        metadata: dict[str, Any] = {ITEM_KEY: op.key}
        if vectors:
            metadata[VECTORS_KEY] = {path: _encode_vector(v) for path, v in vectors.items()}
        if op.ttl is not None:
            metadata[TTL_KEY] = op.ttl
        self.client.replace_message(session_id, message_id, {
            "role": "item", "content": op.value, "metadata": metadata}, upsert=True)
        if op.ttl is not None:
            # An unchanged value is not written again, so its update time does not restart
            # the TTL; this does.
            self.client.put_state(session_id, _restarted_key(message_id), self._now_ms())

    def _namespaces(self, *, emptied: bool = False) -> list[tuple[str, ...]]:
        """Every namespace holding at least one item (and with ``emptied`` those holding
        none any more)."""
        found = []
        for session in self.client.list_sessions(user_id=self._owner()):
            stored = (session.get("metadata") or {}).get(NAMESPACE_KEY)
            if isinstance(stored, list) and (emptied or session["messageCount"] > 0) \
                    and session["id"] == self._session(tuple(stored)):
                found.append(tuple(stored))
        return found

    def _read_namespace(self, session_id: str) -> tuple[list[dict], dict[str, Any]]:
        """A namespace's item messages in their order, and its TTL restart times by state key
        (one export)."""
        messages, restarted = [], {}
        for line in self.client.export(session_id):
            message, state = line.get("message"), line.get("state")
            if message is not None and ITEM_KEY in (message.get("metadata") or {}):
                messages.append(message)
            elif state is not None and state["key"].startswith("ttl:"):
                restarted[state["key"]] = state["value"]
        return messages, restarted

    def _search(self, op: SearchOp, query: list[float] | None) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        now = self._now_ms()
        found: list[tuple[int, int, Item, dict[str, str]]] = []
        restartable: dict[tuple, tuple[str, str]] = {}  # item -> its session and state key
        for namespace in self._namespaces():
            if namespace[:len(prefix)] != prefix:
                continue
            session_id = self._session(namespace)
            messages, restarted = self._read_namespace(session_id)
            for position, message in enumerate(messages):
                metadata = message["metadata"]
                item = self._item(namespace, message)
                if not all(_matches(item.value.get(k), v) for k, v in (op.filter or {}).items()):
                    continue
                expires = _expires_at(message, restarted)
                if expires is not None:
                    if self._omit_expired() and expires < now:
                        continue
                    restartable[(namespace, item.key)] = (session_id,
                                                          _restarted_key(message["id"]))
                found.append((message.get("updatedAt") or message["createdAt"], position,
                              item, metadata.get(VECTORS_KEY) or {}))
        results = self._ranked(op, query, found)
        if op.refresh_ttl:
            for result in results:
                if (result.namespace, result.key) in restartable:
                    self.client.put_state(*restartable[(result.namespace, result.key)], now)
        return results

    def _ranked(self, op: SearchOp, query: list[float] | None,
                found: list[tuple[int, int, Item, dict[str, str]]]) -> list[SearchItem]:
        """The page of ``found`` a search returns: newest update first, or by meaning."""
        found.sort(key=lambda f: (f[0], f[1]), reverse=True)
        if query is None:
            return [self._search_item(item, None)
                    for _, _, item, _ in found[op.offset:op.offset + op.limit]]
        # As InMemoryStore ranks: an item scores with its closest vector; items without vectors
        # only fill a page that scored items leave short.
        scored = sorted(((max(_cosine(query, _decode_vector(v)) for v in vectors.values()), item)
                         for _, _, item, vectors in found if vectors),
                        key=lambda pair: pair[0], reverse=True)
        kept = [(score, item) for score, item in scored[op.offset:op.offset + op.limit]]
        scoreless = [item for _, _, item, vectors in found if not vectors]
        kept += [(None, item) for item in scoreless[:max(0, op.limit - len(kept))]]
        return [self._search_item(item, score) for score, item in kept]

    @staticmethod
    def _search_item(item: Item, score: float | None) -> SearchItem:
        return SearchItem(namespace=item.namespace, key=item.key, value=item.value,
                          created_at=item.created_at, updated_at=item.updated_at, score=score)

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces = [ns for ns in self._namespaces()
                      if all(_namespace_matches(c, ns) for c in op.match_conditions or ())]
        if self._omit_expired():
            namespaces = [ns for ns in namespaces if self._holds_live_items(ns)]
        if op.max_depth is not None:
            namespaces = [ns[:op.max_depth] for ns in namespaces]
        return sorted(set(namespaces))[op.offset:op.offset + op.limit]

    def _holds_live_items(self, namespace: tuple[str, ...]) -> bool:
        messages, restarted = self._read_namespace(self._session(namespace))
        now = self._now_ms()
        return any((_expires_at(m, restarted) or now) >= now for m in messages)

    # -- time to live ------------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Deletes the items whose TTL has run out, and the restart times of items that are gone
        or have no TTL; returns how many items it deleted."""
        deleted = 0
        # Emptied namespaces too: deleted items may have left their restart times there.
        for namespace in self._namespaces(emptied=True):
            session_id = self._session(namespace)
            messages, restarted = self._read_namespace(session_id)
            now = self._now_ms()
            expired, live = [], set()
            for message in messages:
                expires = _expires_at(message, restarted)
                if expires is not None and expires < now:
                    expired.append(message["id"])
                elif expires is not None:
                    live.add(_restarted_key(message["id"]))
            if expired:
                deleted += self.client.delete_messages(session_id, expired)
            for key in restarted.keys() - live:
                self.client.delete_state(session_id, key)
        return deleted

    def start_ttl_sweeper(self, sweep_interval_minutes: int | None = None
                          ) -> concurrent.futures.Future[None]:
        """Runs ``sweep_ttl`` on a thread every ``sweep_interval_minutes`` (the config's, else 5)
        until ``stop_ttl_sweeper``; the future is done when the thread ends. Without a TTL
        config there is nothing to sweep, and the future is done at once."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        if not self.ttl_config or (self._sweeper is not None and self._sweeper.is_alive()):
            done.set_result(None)
            return done
        interval = float(sweep_interval_minutes or self.ttl_config.get("sweep_interval_minutes")
                         or 5)
        self._stop_sweeping.clear()

        def sweep() -> None:
            while not self._stop_sweeping.wait(interval * 60):
                try:
                    swept = self.sweep_ttl()
                    if swept:
                        logger.info("swept %d expired store items", swept)
                except Exception:  # a failed sweep is retried at the next interval
                    logger.exception("sweeping expired store items failed")
            done.set_result(None)

        self._sweeper = threading.Thread(target=sweep, name="sessiondb-ttl-sweeper", daemon=True)
        self._sweeper.start()
        return done

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stops the sweeper thread; whether it has ended within ``timeout`` seconds."""
        if self._sweeper is None:
            return True
        self._stop_sweeping.set()
        self._sweeper.join(timeout)
        return not self._sweeper.is_alive()


# Items and namespaces read per request of a copy.
COPY_PAGE = 100


def copy_store(source: BaseStore, target: SessiondbStore) -> Copied:
    """Copies every item of ``source`` into ``target`` (see the module's documentation): the
    namespaces written, and those skipped as the target held all their items already. Items get
    the copy's times. An async store (``AsyncPostgresStore``) is read from a worker thread:
    ``await asyncio.to_thread(copy_store, source, target)``."""
    copied = Copied([], [])
    for namespace in _paged(lambda offset: source.list_namespaces(limit=COPY_PAGE, offset=offset)):
        items = _items(source, namespace)
        held = _items(target, namespace)
        differing = sorted(k for k, v in items.items() if k in held and held[k] != v)
        if differing:
            raise SessiondbError(409, "conflict", f"the namespace {namespace!r} holds other "
                                 f"values under {differing[:5]!r}; nothing of it was copied")
        missing = [PutOp(namespace, key, value) for key, value in items.items() if key not in held]
        if missing:
            target.batch(missing)
        (copied.copied if missing else copied.skipped).append(namespace)
    return copied


def _items(store: BaseStore, namespace: tuple[str, ...]) -> dict[str, Any]:
    """The values of the items of ``namespace`` itself (not of the namespaces below it)."""
    return {item.key: item.value
            for item in _paged(lambda offset: store.search(namespace, limit=COPY_PAGE,
                                                            offset=offset))
            if item.namespace == namespace}


def _paged(page: Any) -> list:
    """Everything ``page(offset)`` gives, page by page until one comes back short."""
    found: list = []
    while True:
        batch = page(len(found))
        found.extend(batch)
        if len(batch) < COPY_PAGE:
            return found

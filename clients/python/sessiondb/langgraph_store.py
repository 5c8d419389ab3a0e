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
"""

from __future__ import annotations

import asyncio
import base64
import math
import struct
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
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

from .client import Client, SessiondbError, bounded_id, joined_id, message_id_for

NAMESPACE_KEY = "langgraphNamespace"
ITEM_KEY = "storeKey"
VECTORS_KEY = "storeVectors"
OWNER = "langgraph-store"


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

    supports_ttl = False

    def __init__(self, client: Client, prefix: str = "", *, index: IndexConfig | None = None):
        self.client = client
        self.prefix = prefix
        self._created: set[str] = set()
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
        texts, queries = self._to_embed(ops)
        documents = self.embeddings.embed_documents(texts) if texts else []
        return self._run(ops, dict(zip(texts, documents)),
                         {q: self.embeddings.embed_query(q) for q in queries})

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        texts, queries = self._to_embed(ops)
        documents = await self.embeddings.aembed_documents(texts) if texts else []
        embedded = await asyncio.gather(*(self.embeddings.aembed_query(q) for q in queries))
        return await asyncio.to_thread(self._run, ops, dict(zip(texts, documents)),
                                       dict(zip(queries, embedded)))

    def _to_embed(self, ops: list[Op]) -> tuple[list[str], list[str]]:
        """The texts the puts of ``ops`` index and the queries of its searches, each once."""
        if self.embeddings is None:
            return [], []
        texts = {text: None for op in ops if isinstance(op, PutOp)
                 for _, text in self._texts(op)}
        queries = {op.query: None for op in ops if isinstance(op, SearchOp) and op.query}
        return list(texts), list(queries)

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

    def _run(self, ops: list[Op], documents: dict[str, list[float]],
             queries: dict[str, list[float]]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op.namespace, op.key))
            elif isinstance(op, PutOp):
                self._put(op, {path: documents[text] for path, text in self._texts(op)})
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

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        try:
            message = self.client.get_message(self._session(namespace), message_id_for(key))
        except SessiondbError as error:
            if error.code == "not_found":
                return None
            raise
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
        self.client.replace_message(session_id, message_id, {
            "role": "item", "content": op.value, "metadata": metadata}, upsert=True)

    def _namespaces(self) -> list[tuple[str, ...]]:
        """Every namespace holding at least one item."""
        found = []
        for session in self.client.list_sessions(user_id=self._owner()):
            stored = (session.get("metadata") or {}).get(NAMESPACE_KEY)
            if isinstance(stored, list) and session["messageCount"] > 0 \
                    and session["id"] == self._session(tuple(stored)):
                found.append(tuple(stored))
        return found

    def _search(self, op: SearchOp, query: list[float] | None) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        found: list[tuple[int, int, Item, dict[str, str]]] = []
        for namespace in self._namespaces():
            if namespace[:len(prefix)] != prefix:
                continue
            for position, line in enumerate(self.client.export(self._session(namespace))):
                message = line.get("message")
                metadata = (message or {}).get("metadata") or {}
                if ITEM_KEY not in metadata:
                    continue
                item = self._item(namespace, message)
                if all(_matches(item.value.get(k), v) for k, v in (op.filter or {}).items()):
                    found.append((message.get("updatedAt") or message["createdAt"], position,
                                  item, metadata.get(VECTORS_KEY) or {}))
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
        if op.max_depth is not None:
            namespaces = [ns[:op.max_depth] for ns in namespaces]
        return sorted(set(namespaces))[op.offset:op.offset + op.limit]

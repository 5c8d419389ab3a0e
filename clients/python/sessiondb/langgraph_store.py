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
LangGraph's SQL stores order them); ``query`` needs an embedding index, which this store does
not have, so it is ignored, as ``InMemoryStore`` without an index ignores it. A namespace holds
at most the server's ``--max-messages-per-session`` items (10,000 by default).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from .client import Client, SessiondbError, bounded_id, joined_id, message_id_for

NAMESPACE_KEY = "langgraphNamespace"
ITEM_KEY = "storeKey"
OWNER = "langgraph-store"


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

    def __init__(self, client: Client, prefix: str = ""):
        self.client = client
        self.prefix = prefix
        self._created: set[str] = set()

    def _session(self, namespace: tuple[str, ...]) -> str:
        return bounded_id(joined_id(*namespace), self.prefix)

    def _owner(self) -> str:
        return bounded_id(OWNER, self.prefix)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op.namespace, op.key))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise ValueError(f"unknown store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

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

    def _put(self, op: PutOp) -> None:
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
        self.client.replace_message(session_id, message_id, {
            "role": "item", "content": op.value, "metadata": {ITEM_KEY: op.key}}, upsert=True)

    def _namespaces(self) -> list[tuple[str, ...]]:
        """Every namespace holding at least one item."""
        found = []
        for session in self.client.list_sessions(user_id=self._owner()):
            stored = (session.get("metadata") or {}).get(NAMESPACE_KEY)
            if isinstance(stored, list) and session["messageCount"] > 0 \
                    and session["id"] == self._session(tuple(stored)):
                found.append(tuple(stored))
        return found

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        found: list[tuple[int, int, Item]] = []
        for namespace in self._namespaces():
            if namespace[:len(prefix)] != prefix:
                continue
            for position, line in enumerate(self.client.export(self._session(namespace))):
                message = line.get("message")
                if message is None or ITEM_KEY not in (message.get("metadata") or {}):
                    continue
                item = self._item(namespace, message)
                if all(_matches(item.value.get(k), v) for k, v in (op.filter or {}).items()):
                    found.append((message.get("updatedAt") or message["createdAt"], position,
                                  item))
        found.sort(key=lambda f: (f[0], f[1]), reverse=True)
        return [SearchItem(namespace=item.namespace, key=item.key, value=item.value,
                           created_at=item.created_at, updated_at=item.updated_at)
                for _, _, item in found[op.offset:op.offset + op.limit]]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces = [ns for ns in self._namespaces()
                      if all(_namespace_matches(c, ns) for c in op.match_conditions or ())]
        if op.max_depth is not None:
            namespaces = [ns[:op.max_depth] for ns in namespaces]
        return sorted(set(namespaces))[op.offset:op.offset + op.limit]

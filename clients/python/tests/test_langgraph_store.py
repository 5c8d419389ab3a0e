"""The LangGraph store on a real server: the same random operations on LangGraph's own
``InMemoryStore`` and on sessiondb give the same answers, and a graph keeps memories in it."""

from __future__ import annotations

import asyncio
import pathlib
import random
import sqlite3
import time
import unittest
import zlib
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, ListNamespacesOp, MatchCondition
from langgraph.store.memory import InMemoryStore, _does_match
from langgraph.store.sqlite import SqliteStore
from served import ServedTest

from sessiondb import SessiondbError
from sessiondb.langgraph import SessiondbStore, copy_store

NAMESPACES = [("users", "ada"), ("users", "bob"), ("users", "ada", "notes"), ("team",),
              ("team", "x y/z", "ü")]
KEYS = ["pref", "food", "a/b", "x" * 300, "tab\there", "compaction_1", "100%"]


def random_value(rng: random.Random) -> dict:
    return {"n": rng.randint(0, 5), "kind": rng.choice(["fact", "todo", None]),
            "tags": rng.choice([["a"], ["a", "b"], []]),
            "nested": {"level": rng.randint(0, 2), "text": rng.choice(["x", "y"])}}


FILTERS = [None, {"kind": "fact"}, {"n": {"$gte": 3}}, {"n": {"$lt": 2}, "kind": "todo"},
           {"tags": ["a", "b"]}, {"nested": {"level": 1}}, {"kind": {"$ne": "fact"}},
           {"n": {"$gt": 1, "$lte": 4}}, {"missing": None}]


WORDS = ["tea", "cat", "go", "rain", "bike", "jazz", "map", "salt"]


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic stand-in for a model: how often each word of ``WORDS`` occurs, and a
    dimension from a checksum of the text, so that different texts never tie."""
    return [[float(text.split().count(w)) for w in WORDS] + [zlib.crc32(text.encode()) / 2**32]
            for text in texts]


def found(items) -> list[tuple]:
    return sorted((item.namespace, item.key, repr(item.value)) for item in items)


class StoreTest(ServedTest):
    def store(self) -> SessiondbStore:
        return SessiondbStore(self.client, prefix=self.fresh_prefix())

    def test_answers_as_langgraphs_in_memory_store_does(self):
        rng = random.Random(7)
        ours, theirs = self.store(), InMemoryStore()
        alive: dict[tuple, set] = {}
        for step in range(300):
            namespace, key = rng.choice(NAMESPACES), rng.choice(KEYS)
            roll = rng.random()
            if roll < 0.45:
                value = random_value(rng)
                ours.put(namespace, key, value)
                theirs.put(namespace, key, value)
                alive.setdefault(namespace, set()).add(key)
            elif roll < 0.6:
                ours.delete(namespace, key)
                theirs.delete(namespace, key)
                alive.get(namespace, set()).discard(key)
            elif roll < 0.8:
                mine, expected = ours.get(namespace, key), theirs.get(namespace, key)
                self.assertEqual(mine is None, expected is None, (step, namespace, key))
                if expected is not None:
                    self.assertEqual((mine.namespace, mine.key, mine.value),
                                     (expected.namespace, expected.key, expected.value))
            elif roll < 0.93:
                prefix = rng.choice([(), ("users",), ("users", "ada"), ("team",), ("none",)])
                wanted = rng.choice(FILTERS)
                self.assertEqual(found(ours.search(prefix, filter=wanted, limit=1000)),
                                 found(theirs.search(prefix, filter=wanted, limit=1000)),
                                 (step, prefix, wanted))
            else:
                condition = rng.choice([None, MatchCondition("prefix", ("users",)),
                                        MatchCondition("prefix", ("users", "*", "notes")),
                                        MatchCondition("suffix", ("ada",)),
                                        MatchCondition("suffix", ("*",))])
                depth, limit, offset = rng.choice([None, 1, 2]), rng.randint(1, 5), rng.randint(0, 2)
                op = ListNamespacesOp(match_conditions=(condition,) if condition else None,
                                      max_depth=depth, limit=limit, offset=offset)
                # Namespaces holding items, as LangGraph's SQL stores list them (InMemoryStore
                # also lists namespaces that were only read, or emptied).
                holding = [ns for ns, keys in alive.items() if keys
                           and (condition is None or _does_match(condition, ns))]
                cut = sorted({ns[:depth] if depth else ns for ns in holding})
                self.assertEqual(ours.batch([op])[0], cut[offset:offset + limit], (step, op))

    def test_ranks_by_meaning_as_langgraphs_in_memory_store_does(self):
        rng = random.Random(11)
        index = {"dims": len(WORDS) + 1, "embed": embed, "fields": ["text", "notes[*]"]}
        ours = SessiondbStore(self.client, prefix=self.fresh_prefix(), index=index)
        theirs = InMemoryStore(index=index)
        namespaces = [("docs", "a"), ("docs", "b"), ("other",)]
        for step in range(120):
            namespace, key = rng.choice(namespaces), f"k{rng.randint(0, 14)}"
            roll = rng.random()
            if roll < 0.5:
                value = {"text": f"{sentence(rng)} #{step}", "title": f"{rng.choice(WORDS)} {step}",
                         "n": rng.randint(0, 3)}
                if rng.random() < 0.3:
                    value["notes"] = [f"{sentence(rng)} #{step}a", f"{sentence(rng)} #{step}b"]
                if rng.random() < 0.2:
                    del value["text"]
                fields = rng.choice([None, None, ["title"], ["notes[0]"]])
                ours.put(namespace, key, value, index=fields)
                # InMemoryStore keeps the vectors of a key's earlier value at paths a later put
                # does not index; LangGraph's SQL stores replace them, as this store does.
                theirs.delete(namespace, key)
                theirs.put(namespace, key, value, index=fields)
            elif roll < 0.6:
                ours.delete(namespace, key)
                theirs.delete(namespace, key)
            else:
                prefix = rng.choice([(), ("docs",), ("docs", "b"), ("other",)])
                query = sentence(rng)
                wanted = rng.choice([None, {"n": {"$gte": 1}}])
                limit, offset = rng.randint(1, 8), rng.randint(0, 3)
                mine = ours.search(prefix, query=query, filter=wanted, limit=limit,
                                   offset=offset)
                expected = theirs.search(prefix, query=query, filter=wanted, limit=limit,
                                         offset=offset)
                scored = [(i.namespace, i.key, i.score) for i in expected if i.score is not None]
                self.assertEqual([(i.namespace, i.key) for i in mine if i.score is not None],
                                 [(ns, key) for ns, key, _ in scored], (step, query))
                for item, (_, _, score) in zip(mine, scored):
                    self.assertAlmostEqual(item.score, score, places=9)
                # Items without vectors fill a short page, each store taking them in its own
                # order (this one newest update first).
                self.assertEqual(len(mine), len(expected), step)
        # Another store on the same server, with the same index, ranks from the stored vectors.
        other = SessiondbStore(self.client, prefix=ours.prefix, index=index)
        query = "tea cat"
        self.assertEqual([(i.key, i.score) for i in other.search(("docs",), query=query)],
                         [(i.key, i.score) for i in ours.search(("docs",), query=query)])
        # An async caller embeds through the async interface.
        mine = asyncio.run(ours.asearch(("docs",), query=query, limit=3))
        self.assertEqual([i.key for i in mine],
                         [i.key for i in theirs.search(("docs",), query=query, limit=3)])

    def test_an_item_put_without_index_has_no_vectors(self):
        store = SessiondbStore(self.client, prefix=self.fresh_prefix(),
                               index={"dims": len(WORDS) + 1, "embed": embed})
        store.put(("n",), "indexed", {"text": "tea"})
        store.put(("n",), "plain", {"text": "tea"}, index=False)
        store.put(("n",), "again", {"text": "tea"})
        store.put(("n",), "again", {"text": "cat"}, index=False)
        ranked = [(i.key, i.score is not None) for i in store.search(("n",), query="tea")]
        self.assertEqual(ranked[0], ("indexed", True))
        self.assertEqual(sorted(ranked[1:]), [("again", False), ("plain", False)])

    def test_items_expire_as_their_ttl_says(self):
        clock = [1_000_000]
        store = SessiondbStore(self.client, prefix=self.fresh_prefix(),
                               ttl={"default_ttl": 2.0})
        store._now_ms = lambda: clock[0]

        def minutes(n: float) -> None:
            clock[0] += int(n * 60_000)

        store.put(("t",), "short", {"v": 1}, ttl=1.0)
        store.put(("t",), "default", {"v": 2})  # the config's 2 minutes
        store.put(("t",), "forever", {"v": 3}, ttl=None)
        store.put(("t",), "dropped", {"v": 4}, ttl=1.0)
        store.put(("t",), "dropped", {"v": 4}, ttl=None)  # a put without a TTL drops it
        minutes(0.9)
        self.assertIsNotNone(store.get(("t",), "short"))  # a read restarts it
        minutes(0.9)
        self.assertEqual(store.sweep_ttl(), 0)
        self.assertIsNotNone(store.get(("t",), "short", refresh_ttl=False))
        minutes(0.3)  # 1.2 minutes after "short" was last read, 2.1 after "default" was put
        # Expired items are read until swept (the config does not omit them).
        self.assertEqual(len(store.search(("t",), refresh_ttl=False)), 4)
        self.assertEqual(store.sweep_ttl(), 2)
        self.assertEqual(sorted(i.key for i in store.search(("t",))), ["dropped", "forever"])
        minutes(1_000)
        self.assertEqual(store.sweep_ttl(), 0)
        # A search restarts the TTLs of what it returns.
        store.put(("u",), "a", {"v": 1}, ttl=1.0)
        store.put(("u",), "b", {"v": 2}, ttl=1.0)
        minutes(0.9)
        self.assertEqual([i.key for i in store.search(("u",), limit=1)], ["b"])
        minutes(0.2)
        self.assertEqual(store.sweep_ttl(), 1)
        self.assertEqual([i.key for i in store.search(("u",))], ["b"])
        # No restart times are left behind for items that are gone or have no TTL, also where
        # a delete emptied the namespace.
        store.put(("v",), "x", {"v": 1}, ttl=1.0)
        store.delete(("v",), "x")
        self.assertEqual(store.sweep_ttl(), 0)
        left = {key for ns in [("t",), ("u",), ("v",)]
                for key in self.client.all_state(store._session(ns))}
        self.assertEqual(left, {"ttl:b"})

    def test_expired_items_can_be_omitted_before_the_sweep(self):
        clock = [5_000_000]
        store = SessiondbStore(self.client, prefix=self.fresh_prefix(),
                               ttl={"omit_expired": True, "refresh_on_read": False})
        store._now_ms = lambda: clock[0]
        store.put(("gone",), "k", {"v": 1}, ttl=1.0)
        store.put(("kept",), "k", {"v": 2}, ttl=1.0)
        clock[0] += 30_000
        self.assertIsNotNone(store.get(("kept",), "k", refresh_ttl=True))
        clock[0] += 40_000
        self.assertIsNone(store.get(("gone",), "k"))
        self.assertEqual(store.search(("gone",)), [])
        self.assertEqual(store.list_namespaces(), [("kept",)])
        self.assertEqual(store.get(("kept",), "k").value, {"v": 2})
        # The sweeper runs sweep_ttl until stopped.
        done = store.start_ttl_sweeper(sweep_interval_minutes=0.001)
        for _ in range(200):
            if not self.client.messages(store._session(("gone",)))["items"]:
                break
            time.sleep(0.05)
        self.assertTrue(store.stop_ttl_sweeper(timeout=5))
        self.assertIsNone(done.result(timeout=5))
        self.assertEqual(self.client.messages(store._session(("gone",)))["items"], [])

    def test_searches_give_the_newest_update_first_and_keep_creation_times(self):
        store = self.store()
        for key in ["a", "b", "c"]:
            store.put(("docs",), key, {"v": key})
            time.sleep(0.005)
        created = store.get(("docs",), "a").created_at
        store.put(("docs",), "a", {"v": "a2"})
        self.assertEqual([i.key for i in store.search(("docs",))], ["a", "c", "b"])
        self.assertEqual([i.key for i in store.search(("docs",), limit=1, offset=1)], ["c"])
        again = store.get(("docs",), "a")
        self.assertEqual((again.value, again.created_at), ({"v": "a2"}, created))
        self.assertGreater(again.updated_at, created)
        # Another process (a store of its own, same server) sees the same items.
        other = SessiondbStore(self.client, prefix=store.prefix)
        self.assertEqual(other.get(("docs",), "a").value, {"v": "a2"})
        self.assertEqual(asyncio.run(other.alist_namespaces()), [("docs",)])
        with self.assertRaises(TypeError):
            store.put(("docs",), "bad", ["not", "a", "dict"])

    def test_a_graph_keeps_memories_across_threads(self):
        class State(TypedDict):
            user: str
            said: str
            recalled: list[str]

        def remember(state: State, *, store: BaseStore):
            namespace = ("memories", state["user"])
            store.put(namespace, f"m{len(store.search(namespace))}", {"text": state["said"]})
            recalled = [item.value["text"] for item in store.search(namespace, limit=100)]
            return {"recalled": sorted(recalled)}

        builder = StateGraph(State)
        builder.add_node("remember", remember)
        builder.add_edge(START, "remember")
        builder.add_edge("remember", END)
        store = self.store()
        app = builder.compile(store=store)
        app.invoke({"user": "ada", "said": "likes tea"}, {"configurable": {"thread_id": "t1"}})
        out = app.invoke({"user": "ada", "said": "has a cat"}, {"configurable": {"thread_id": "t2"}})
        self.assertEqual(out["recalled"], ["has a cat", "likes tea"])
        other = builder.compile(store=SessiondbStore(self.client, prefix=store.prefix))
        out = other.invoke({"user": "bob", "said": "plays go"}, {"configurable": {"thread_id": "t3"}})
        self.assertEqual(out["recalled"], ["plays go"])
        self.assertEqual(store.list_namespaces(prefix=("memories",)),
                         [("memories", "ada"), ("memories", "bob")])

    def test_a_sqlite_store_is_copied_in_once_and_a_different_value_refused(self):
        connection = sqlite3.connect(pathlib.Path(self.served.data) / f"{self.id()}.db",
                                     check_same_thread=False, isolation_level=None)
        self.addCleanup(connection.close)
        source = SqliteStore(connection)
        source.setup()
        rng = random.Random(11)
        for namespace in NAMESPACES:
            for key in KEYS:
                source.put(namespace, key, {**random_value(rng), "text": sentence(rng)})
        for i in range(130):  # more than a page of a copy's reads
            source.put(("bulk",), f"item-{i}", {"i": i, "text": sentence(rng)})

        def everything(store) -> list[tuple]:
            return found(item for namespace in store.list_namespaces(limit=1000)
                         for item in store.search(namespace, limit=1000)
                         if item.namespace == namespace)

        prefix = self.fresh_prefix()
        target = SessiondbStore(self.client, prefix=prefix,
                                index={"dims": len(WORDS) + 1, "embed": embed, "fields": ["text"]})
        copied = copy_store(source, target)
        self.assertEqual(sorted(copied.copied), sorted(NAMESPACES + [("bulk",)]))
        self.assertEqual(everything(target), everything(source))
        # The target's index embedded what it was given.
        best = target.search(("bulk",), query="jazz jazz jazz", limit=1)[0]
        self.assertIsNotNone(best.score)
        self.assertIn("jazz", best.value["text"])

        again = copy_store(source, SessiondbStore(self.client, prefix=prefix))
        self.assertEqual((again.copied, len(again.skipped)), ([], len(NAMESPACES) + 1))
        source.put(("team",), "new", {"text": "added since"})
        self.assertEqual(copy_store(source, target).copied, [("team",)])
        self.assertEqual(target.get(("team",), "new").value, {"text": "added since"})

        target.put(("users", "bob"), "pref", {"changed": "here"})
        source.put(("users", "bob"), "more", {"text": "not copied"})
        with self.assertRaises(SessiondbError) as raised:
            copy_store(source, target)
        self.assertEqual(raised.exception.code, "conflict")
        self.assertIsNone(target.get(("users", "bob"), "more"))


if __name__ == "__main__":
    unittest.main()

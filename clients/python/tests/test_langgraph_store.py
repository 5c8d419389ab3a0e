"""The LangGraph store on a real server: the same random operations on LangGraph's own
``InMemoryStore`` and on sessiondb give the same answers, and a graph keeps memories in it."""

from __future__ import annotations

import asyncio
import random
import time
import unittest
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, ListNamespacesOp, MatchCondition
from langgraph.store.memory import InMemoryStore, _does_match
from served import ServedTest

from sessiondb.langgraph import SessiondbStore

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


if __name__ == "__main__":
    unittest.main()

"""The LangGraph checkpointer on a real server: LangGraph's own conformance suite
(langgraph-checkpoint-conformance from PyPI) and real graphs."""

from __future__ import annotations

import asyncio
import operator
import pathlib
import sqlite3
import unittest
from typing import Annotated, TypedDict

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from served import ServedTest

from sessiondb import Client
from sessiondb.langgraph import MAX_EXTENSION_DEPTH, SessiondbSaver, acopy_threads, copy_threads


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    topic: str


def graph(checkpointer, *, ask: bool = False, quote_topic: bool = True):
    """Two nodes after each other, each adding a step that names the topic (or does not, when
    not ``quote_topic``); the second asks a human first when ``ask``."""
    def about(state: State) -> str:
        return state["topic"] if quote_topic else "it"

    def research(state: State):
        return {"steps": [f"research {about(state)}"]}

    def write(state: State):
        if ask:
            approved = interrupt({"question": f"write about {state['topic']}?"})
            if not approved:
                return {"steps": ["declined"]}
        return {"steps": [f"write {about(state)}"]}

    builder = StateGraph(State)
    builder.add_node("research", research)
    builder.add_node("write", write)
    builder.add_edge(START, "research")
    builder.add_edge("research", "write")
    builder.add_edge("write", END)
    return builder.compile(checkpointer=checkpointer)


class SaverTest(ServedTest):
    def saver(self) -> SessiondbSaver:
        return SessiondbSaver(self.client, prefix=self.fresh_prefix())

    def test_langgraphs_conformance_suite_passes(self):
        # Without its memory of checkpoints too, so every value is read from the server.
        for cache_bytes in [32 << 20, 0]:
            @checkpointer_test(name="SessiondbSaver")
            async def sessiondb_saver():
                yield SessiondbSaver(self.client, prefix=self.fresh_prefix(),
                                     cache_bytes=cache_bytes)

            report = asyncio.run(validate(sessiondb_saver))
            failures = {name: result.failures for name, result in report.results.items()
                        if result.passed is False}
            self.assertEqual(failures, {}, cache_bytes)
            self.assertTrue(report.passed_all_base())
            for capability in ["put", "put_writes", "get_tuple", "list", "delete_thread",
                               "copy_thread", "prune", "delete_for_runs"]:
                self.assertTrue(report.results[capability].passed, capability)
                self.assertGreater(report.results[capability].tests_passed, 0, capability)

    def test_a_graph_resumes_from_another_saver(self):
        config = {"configurable": {"thread_id": "essay-1"}}
        saver = self.saver()
        first = graph(saver).invoke({"topic": "otters", "steps": []}, config)
        self.assertEqual(first["steps"], ["research otters", "write otters"])
        # A second process (another saver, same server) sees the thread and continues it.
        again = graph(SessiondbSaver(self.client, prefix=saver.prefix))
        self.assertEqual(again.get_state(config).values["steps"], first["steps"])
        more = again.invoke({"topic": "otters", "steps": ["revise"]}, config)
        self.assertEqual(more["steps"], ["research otters", "write otters", "revise",
                                         "research otters", "write otters"])

    def test_interrupts_survive_and_resume(self):
        config = {"configurable": {"thread_id": "ask-1"}}
        saver = self.saver()
        paused = graph(saver, ask=True).invoke({"topic": "bees", "steps": []}, config)
        self.assertEqual(paused["__interrupt__"][0].value, {"question": "write about bees?"})
        resumed = graph(SessiondbSaver(self.client, prefix=saver.prefix), ask=True).invoke(
            Command(resume=True), config)
        self.assertEqual(resumed["steps"], ["research bees", "write bees"])

    def test_history_and_time_travel_branch(self):
        config = {"configurable": {"thread_id": "travel-1"}}
        saver = self.saver()
        app = graph(saver)
        app.invoke({"topic": "owls", "steps": []}, config)
        history = list(app.get_state_history(config))
        self.assertEqual([len(s.values.get("steps", [])) for s in history], [2, 1, 0, 0])
        after_research = history[1]
        self.assertEqual(after_research.next, ("write",))
        forked = app.update_state(after_research.config, {"topic": "crows"})
        replay = app.invoke(None, forked)
        self.assertEqual(replay["steps"], ["research owls", "write crows"])
        latest = app.get_state(config)
        self.assertEqual(latest.values["steps"], ["research owls", "write crows"])
        # The replay is a branch: the original run's checkpoints are all still there.
        self.assertEqual(len(list(app.get_state_history(config))), len(history) + 2)

    def test_unchanged_values_are_stored_once(self):
        config = {"configurable": {"thread_id": "blobs-1"}}
        saver = self.saver()
        graph(saver, quote_topic=False).invoke({"topic": "a" * 50_000, "steps": []}, config)
        checkpoints, _ = saver._sessions("blobs-1", "")
        contents = [line["message"]["content"] for line in self.client.export(checkpoints)
                    if "message" in line]
        self.assertGreaterEqual(len(contents), 3)
        holding = [c for c in contents if "topic" in c["values"]]
        self.assertEqual(len(holding), 1, "one stored value for a topic set once")
        # The topic is ~67 kB in base64, stored with the topic channel and once more in the
        # graph's input (`__start__`); a copy per checkpoint would pass 250 kB.
        self.assertLess(self.client.get_session(checkpoints)["contentBytes"], 150_000)
        topic = SessiondbSaver(self.client, prefix=saver.prefix).get_tuple(config)
        self.assertEqual(topic.checkpoint["channel_values"]["topic"], "a" * 50_000)

    def test_a_growing_list_is_stored_as_what_each_step_added(self):
        config = {"configurable": {"thread_id": "grow-1"}}
        saver = self.saver()
        app = graph(saver, quote_topic=False)
        line = "x" * 300
        expected: list[str] = []
        for turn in range(40):
            app.invoke({"topic": "t", "steps": [f"{turn} {line}"]}, config)
            expected += [f"{turn} {line}", "research it", "write it"]
        checkpoints, _ = saver._sessions("grow-1", "")
        stored = [line["message"]["content"]["values"].get("steps")
                  for line in self.client.export(checkpoints) if "message" in line]
        steps = [value for value in stored if value and value["type"] != "empty"]
        extended = [value for value in steps if "base" in value]
        self.assertGreater(len(extended), len(steps) // 2, "most versions are extensions")
        self.assertTrue(all(value["depth"] <= MAX_EXTENSION_DEPTH for value in extended))
        self.assertGreater(len(steps) - len(extended), 2, "chains end in whole values")
        # Whole copies of the list at every version would take the square of its length:
        # 120 versions of up to 120 items of ~300 bytes, ~2.9 MB in base64.
        self.assertLess(self.client.get_session(checkpoints)["contentBytes"], 600_000)

        # Another process (a client and saver of its own) reads the latest state cold: the
        # chain under it comes in one request, not a request per link.
        with Client(self.served.url) as other:
            requests = []
            start = other._start
            other._start = lambda *a, **k: requests.append(a[:2]) or start(*a, **k)
            state = graph(SessiondbSaver(other, prefix=saver.prefix),
                          quote_topic=False).get_state(config)
            self.assertEqual(state.values["steps"], expected)
            self.assertLessEqual(len(requests), 5, requests)

        # Every version reads back right in another process with no memory, cold.
        fresh = graph(SessiondbSaver(self.client, prefix=saver.prefix, cache_bytes=0),
                      quote_topic=False)
        self.assertEqual(fresh.get_state(config).values["steps"], expected)
        history = list(fresh.get_state_history(config))
        for state in history:
            steps_then = state.values.get("steps", [])
            self.assertEqual(steps_then, expected[:len(steps_then)])
        self.assertEqual(sorted({len(s.values.get("steps", [])) for s in history}),
                         [0] + list(range(1, len(expected) + 1)))
        # The saver that wrote them reads them back from memory as they were.
        self.assertEqual(app.get_state(config).values["steps"], expected)
        # A copy keeps the chains, which lead to the copied checkpoints.
        saver.copy_thread("grow-1", "grow-1-copy")
        copied = {"configurable": {"thread_id": "grow-1-copy"}}
        self.assertEqual(fresh.get_state(copied).values["steps"], expected)

    def test_a_prune_elsewhere_leaves_extensions_readable_from_memory(self):
        config = {"configurable": {"thread_id": "grow-2"}}
        saver = self.saver()
        app = graph(saver, quote_topic=False)
        for turn in range(12):
            app.invoke({"topic": "t", "steps": [f"{turn} " + "y" * 400]}, config)
        before = app.get_state(config).values
        # Another process prunes: the chain under the latest checkpoint's list goes, its value
        # moves whole. This saver still remembers checkpoint contents from before the prune.
        other = SessiondbSaver(self.client, prefix=saver.prefix)
        other.prune(["grow-2"])
        # As if this saver's memory had since dropped the values it rebuilt and the oldest
        # contents: the chain it remembers now leads to checkpoints the prune deleted.
        saver._values.entries.clear()
        for key in list(saver._contents.entries)[:-3]:
            del saver._contents.entries[key]
        self.assertEqual(app.get_state(config).values, before)
        fresh = graph(SessiondbSaver(self.client, prefix=saver.prefix, cache_bytes=0),
                      quote_topic=False)
        self.assertEqual(fresh.get_state(config).values, before)
        # The thread goes on from the pruned one, extending the moved value.
        more = app.invoke({"topic": "t", "steps": ["after"]}, config)
        self.assertEqual(more["steps"], before["steps"] + ["after", "research it", "write it"])
        self.assertEqual(fresh.get_state(config).values, more)

    def test_list_narrows_by_thread_and_namespace(self):
        saver = self.saver()
        for thread in ["list-a", "list-b"]:
            for namespace in ["", "child:1"]:
                config = {"configurable": {"thread_id": thread, "checkpoint_ns": namespace}}
                saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})

        def where(config):
            return sorted((t.config["configurable"]["thread_id"],
                           t.config["configurable"]["checkpoint_ns"]) for t in saver.list(config))

        both = [("list-a", ""), ("list-a", "child:1"), ("list-b", ""), ("list-b", "child:1")]
        self.assertEqual(where(None), both)
        self.assertEqual(where({"configurable": {}}), both)
        self.assertEqual(where({"configurable": {"checkpoint_ns": "child:1"}}),
                         [("list-a", "child:1"), ("list-b", "child:1")])
        self.assertEqual(where({"configurable": {"thread_id": "list-b"}}),
                         [("list-b", ""), ("list-b", "child:1")])
        self.assertEqual(where({"configurable": {"thread_id": "list-b", "checkpoint_ns": ""}}),
                         [("list-b", "")])

    def test_delete_thread_removes_every_namespace(self):
        config = {"configurable": {"thread_id": "gone-1"}}
        saver = self.saver()
        graph(saver).invoke({"topic": "x", "steps": []}, config)
        other = {"configurable": {"thread_id": "kept-1"}}
        graph(saver).invoke({"topic": "y", "steps": []}, other)
        remembered = saver.get_tuple(config).config
        saver.delete_thread("gone-1")
        self.assertIsNone(saver.get_tuple(config))
        # Nor does a checkpoint the saver remembers come back by its id.
        self.assertIsNone(saver.get_tuple(remembered))
        self.assertEqual(list(saver.list(config)), [])
        self.assertEqual(graph(saver).get_state(other).values["topic"], "y")
        self.assertEqual([s["id"] for s in self.client.list_sessions(user_id=f"{saver.prefix}gone-1")], [])

    def test_copy_thread_copies_an_interrupted_thread_that_then_resumes_on_its_own(self):
        saver = self.saver()
        source = {"configurable": {"thread_id": "copy-src"}}
        copy = {"configurable": {"thread_id": "copy-dst"}}
        paused = graph(saver, ask=True).invoke({"topic": "moths", "steps": []}, source)
        self.assertIn("__interrupt__", paused)
        saver.copy_thread("copy-src", "copy-dst")
        # Another process, reading only from the server, resumes the copy.
        other = graph(SessiondbSaver(self.client, prefix=saver.prefix, cache_bytes=0), ask=True)
        history = [s.config["configurable"]["checkpoint_id"]
                   for s in other.get_state_history(source)]
        self.assertEqual([s.config["configurable"]["checkpoint_id"]
                          for s in other.get_state_history(copy)], history)
        declined = other.invoke(Command(resume=False), copy)
        self.assertEqual(declined["steps"], ["research moths", "declined"])
        # The source is still waiting for its answer.
        self.assertEqual(other.get_state(source).next, ("write",))
        approved = other.invoke(Command(resume=True), source)
        self.assertEqual(approved["steps"], ["research moths", "write moths"])

    def test_prune_keeps_the_latest_checkpoint_with_every_value_it_reads(self):
        saver = self.saver()
        config = {"configurable": {"thread_id": "prune-1"}}
        app = graph(saver, quote_topic=False)
        # The topic is written by the first checkpoints only; the latest reads it from them.
        app.invoke({"topic": "t" * 5_000, "steps": []}, config)
        before = app.get_state(config)
        # A prune cut short before its deletes left an empty message for a holder of the
        # topic; this one replaces it.
        checkpoints, side = saver._sessions("prune-1", "")
        latest = self.client.messages(checkpoints, limit=1, order="desc")["items"][0]
        holder = latest["content"]["holders"]["topic"][0]
        self.assertNotEqual(holder, latest["id"])
        self.client.append(side, {"id": f"values:{holder}", "role": "values",
                                  "content": {"values": {}}}, parent=None)
        saver.prune(["prune-1"])
        fresh = graph(SessiondbSaver(self.client, prefix=saver.prefix, cache_bytes=0),
                      quote_topic=False)
        states = list(fresh.get_state_history(config))
        self.assertEqual(len(states), 1)
        self.assertEqual(states[0].values, before.values)
        self.assertEqual(states[0].config, before.config)

        def moved_values() -> set[str]:
            return {line["message"]["id"].removeprefix("values:")
                    for line in self.client.export(side)
                    if line.get("message", {}).get("role") == "values"}

        first_moved = moved_values()
        self.assertTrue(first_moved, "the topic's holder was pruned and its value moved")
        # The thread goes on from the kept checkpoint, and prunes again.
        more = fresh.invoke({"topic": "u", "steps": ["again"]}, config)
        self.assertEqual(more["steps"], ["research it", "write it", "again", "research it",
                                         "write it"])
        saver.prune(["prune-1"])
        self.assertEqual(fresh.get_state(config).values, more)
        # Moved values stay exactly while the kept checkpoint reads them: the new topic's
        # holder moved, the old topic's went.
        latest = self.client.messages(checkpoints, limit=1, order="desc")["items"][0]["content"]
        read = {holder for holder, _ in latest["holders"].values()}
        self.assertTrue(moved_values() and moved_values() <= read, (moved_values(), read))
        self.assertFalse(moved_values() & first_moved)

    def test_delete_for_runs_keeps_the_other_runs_whole(self):
        saver = self.saver()
        app = graph(saver)

        def run(thread: str, run_id: str, values):
            config = {"configurable": {"thread_id": thread}, "metadata": {"run_id": run_id}}
            return app.invoke(values, config)

        run("runs-1", "first", {"topic": "seals", "steps": []})
        second = run("runs-1", "second", {"topic": "seals", "steps": ["more"]})
        run("runs-2", "first", {"topic": "gulls", "steps": []})
        saver.delete_for_runs(["first"])
        fresh = SessiondbSaver(self.client, prefix=saver.prefix, cache_bytes=0)
        left = {t.metadata.get("run_id") for t in fresh.list({"configurable": {"thread_id": "runs-1"}})}
        self.assertEqual(left, {"second"})
        self.assertEqual(list(fresh.list({"configurable": {"thread_id": "runs-2"}})), [])
        self.assertEqual(graph(fresh).get_state({"configurable": {"thread_id": "runs-1"}}).values,
                         second)


if __name__ == "__main__":
    unittest.main()


def checkpoints_of(saver, thread_id: str) -> list:
    """Every checkpoint of a thread, every namespace, as comparable values."""
    found = [(t.config, t.checkpoint, t.metadata, t.parent_config,
              sorted(t.pending_writes or [], key=repr))
             for t in saver.list({"configurable": {"thread_id": thread_id}})]
    return sorted(found, key=lambda t: (t[0]["configurable"]["checkpoint_ns"], t[1]["id"]))


class MovingInTest(ServedTest):
    """Threads of LangGraph's own SqliteSaver file, copied into sessiondb."""

    def setUp(self):
        connection = sqlite3.connect(pathlib.Path(self.served.data) / f"{self.id()}.db",
                                     check_same_thread=False)
        self.addCleanup(connection.close)
        self.source = SqliteSaver(connection)
        self.target = SessiondbSaver(self.client, prefix=self.fresh_prefix())

    def test_threads_are_copied_with_branches_interrupts_and_namespaces(self):
        travel = {"configurable": {"thread_id": "travel"}}
        app = graph(self.source)
        app.invoke({"topic": "owls", "steps": []}, travel)
        after_research = list(app.get_state_history(travel))[1]
        app.invoke(None, app.update_state(after_research.config, {"topic": "crows"}))
        asked = {"configurable": {"thread_id": "asked"}}
        graph(self.source, ask=True).invoke({"topic": "bees", "steps": []}, asked)
        nested = {"configurable": {"thread_id": "nested", "checkpoint_ns": "inner:1"}}
        self.source.put(nested, empty_checkpoint(), {"source": "input", "step": -1}, {})

        copied = copy_threads(self.source, self.target)
        self.assertEqual(sorted(copied.copied), ["asked", "nested", "travel"])
        for thread_id in ("travel", "asked", "nested"):
            expected = checkpoints_of(self.source, thread_id)
            self.assertEqual(checkpoints_of(self.target, thread_id), expected)
            # Another process reads the same from the server alone.
            cold = SessiondbSaver(self.client, prefix=self.target.prefix, cache_bytes=0)
            self.assertEqual(checkpoints_of(cold, thread_id), expected)
        self.assertEqual(len(checkpoints_of(self.target, "travel")), 6)
        self.assertEqual(graph(self.target).get_state(travel).values["steps"],
                         ["research owls", "write crows"])
        # The interrupted thread resumes on sessiondb with the answer it waited for.
        resumed = graph(self.target, ask=True).invoke(Command(resume=True), asked)
        self.assertEqual(resumed["steps"], ["research bees", "write bees"])

    def test_a_second_copy_writes_only_what_came_since(self):
        essay = {"configurable": {"thread_id": "essay"}}
        graph(self.source).invoke({"topic": "otters", "steps": []}, essay)
        graph(self.source).invoke({"topic": "seals", "steps": []},
                                  {"configurable": {"thread_id": "other"}})
        self.assertEqual(sorted(copy_threads(self.source, self.target).copied),
                         ["essay", "other"])
        stored = self.client.get_session(self.target._sessions("other", "")[0])["version"]
        graph(self.source).invoke({"topic": "otters", "steps": ["revise"]}, essay)

        again = copy_threads(self.source, self.target)
        self.assertEqual((again.copied, again.skipped), (["essay"], ["other"]))
        self.assertEqual(self.client.get_session(self.target._sessions("other", "")[0])["version"],
                         stored)
        self.assertEqual(checkpoints_of(self.target, "essay"), checkpoints_of(self.source, "essay"))
        self.assertEqual(copy_threads(self.source, self.target, ["essay"]).skipped, ["essay"])

    def test_an_async_checkpointer_is_copied_through_its_async_methods(self):
        path = str(pathlib.Path(self.served.data) / f"{self.id()}-async.db")

        async def copy():
            async with AsyncSqliteSaver.from_conn_string(path) as source:
                await graph(source, ask=True).ainvoke({"topic": "ants", "steps": []},
                                                      {"configurable": {"thread_id": "ants"}})
                copied = await acopy_threads(source, self.target)
                return copied, [(t.config, t.checkpoint, t.metadata, t.parent_config)
                                async for t in source.alist(None)]

        copied, expected = asyncio.run(copy())
        self.assertEqual((copied.copied, copied.skipped), (["ants"], []))
        self.assertEqual([t[:4] for t in checkpoints_of(self.target, "ants")][::-1], expected)
        resumed = graph(self.target, ask=True).invoke(Command(resume=True),
                                                     {"configurable": {"thread_id": "ants"}})
        self.assertEqual(resumed["steps"], ["research ants", "write ants"])

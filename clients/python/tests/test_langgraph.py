"""The LangGraph checkpointer on a real server: LangGraph's own conformance suite
(langgraph-checkpoint-conformance from PyPI) and real graphs."""

from __future__ import annotations

import asyncio
import operator
import unittest
from typing import Annotated, TypedDict

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from served import ServedTest

from sessiondb.langgraph import SessiondbSaver


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
            for capability in ["put", "put_writes", "get_tuple", "list", "delete_thread"]:
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
        saver.delete_thread("gone-1")
        self.assertIsNone(saver.get_tuple(config))
        self.assertEqual(list(saver.list(config)), [])
        self.assertEqual(graph(saver).get_state(other).values["topic"], "y")
        self.assertEqual([s["id"] for s in self.client.list_sessions(user_id=f"{saver.prefix}gone-1")], [])


if __name__ == "__main__":
    unittest.main()

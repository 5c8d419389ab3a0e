"""Haystack's chat message store on a real server, in Haystack pipelines (the chat message
retriever, an Agent with a scripted chat generator, the chat message writer), and compared with
Haystack's InMemoryChatMessageStore."""

from __future__ import annotations

import itertools
import random
import unittest
from typing import Any

from haystack import Pipeline, component
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import Tool
from haystack_experimental.chat_message_stores.in_memory import InMemoryChatMessageStore
from haystack_experimental.components.retrievers import ChatMessageRetriever
from haystack_experimental.components.writers import ChatMessageWriter
from served import ServedTest

from sessiondb.haystack import SessiondbChatMessageStore

HISTORIES = itertools.count()


@component
class ScriptedChatGenerator:
    """Answers with how many messages it was shown and the text of the last one; asked to
    ``shout`` with a tool at hand, calls it first."""

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None, **kwargs: Any):
        last = messages[-1]
        if tools and last.text and "shout" in last.text:
            call = ToolCall(tool_name="shout", arguments={"word": "hi"}, id=f"c{len(messages)}")
            return {"replies": [ChatMessage.from_assistant(tool_calls=[call])]}
        shown = last.text if last.text is not None else last.tool_call_result.result
        return {"replies": [ChatMessage.from_assistant(f"shown {len(messages)}, last {shown}")]}


SHOUT = Tool(name="shout", description="Says a word loudly.",
             parameters={"type": "object", "properties": {"word": {"type": "string"}}},
             function=lambda word: word.upper())


def shown(messages: list[ChatMessage]) -> list[tuple]:
    """What a model sees of messages: roles, texts, tool calls and results (not their ids)."""
    return [(m.role.value, m.texts, [(c.tool_name, c.arguments, c.id) for c in m.tool_calls],
             [(r.result, r.origin.id) for r in m.tool_call_results]) for m in messages]


class ChatMessageStoreTest(ServedTest):
    def setUp(self):
        self.prefix = self.fresh_prefix()
        self.store = self.opened(SessiondbChatMessageStore(self.served.url, prefix=self.prefix))

    def opened(self, store: SessiondbChatMessageStore) -> SessiondbChatMessageStore:
        self.addCleanup(store.close)
        return store

    def conversation(self, store=None) -> Pipeline:
        """The conversational pipeline: the history retrieved before the new message, an
        agent's run, and what it ran written back."""
        store = store or self.store
        pipeline = Pipeline()
        pipeline.add_component("retriever", ChatMessageRetriever(store))
        pipeline.add_component("agent", Agent(chat_generator=ScriptedChatGenerator(),
                                              tools=[SHOUT]))
        pipeline.add_component("writer", ChatMessageWriter(store))
        pipeline.connect("retriever.messages", "agent.messages")
        pipeline.connect("agent.messages", "writer.messages")
        return pipeline

    def turn(self, pipeline: Pipeline, text: str, history: str = "chat") -> dict:
        return pipeline.run({"retriever": {"chat_history_id": history,
                                           "current_messages": [ChatMessage.from_user(text)]},
                             "writer": {"chat_history_id": history}},
                            include_outputs_from={"agent"})["agent"]

    def test_an_agent_keeps_its_conversation_across_stores_and_processes(self):
        first = self.turn(self.conversation(), "hello")
        # Another store (another process, say) retrieves the conversation and goes on.
        elsewhere = self.opened(SessiondbChatMessageStore(self.served.url, prefix=self.prefix))
        second = self.turn(self.conversation(elsewhere), "shout please")
        self.assertEqual(first["last_message"].text, "shown 1, last hello")
        self.assertEqual(second["last_message"].text, "shown 5, last HI")
        stored = self.client.full_history(self.prefix + "chat")
        self.assertEqual([(m["role"], m["content"]) for m in stored], [
            ("user", "hello"), ("assistant", "shown 1, last hello"), ("user", "shout please"),
            ("assistant", ""), ("tool", ""), ("assistant", "shown 5, last HI")])
        # Plain text is kept once: as the message's content, not again in the metadata.
        self.assertNotIn("content", stored[0]["metadata"]["haystackMessage"])
        self.assertEqual([h["content"] for h in self.client.search(self.prefix + "chat", "hello")],
                         ["hello", "shown 1, last hello"])
        # The tool call and its result come back as the agent held them.
        self.assertEqual(shown(self.store.retrieve_messages("chat", last_k=None)),
                         shown(second["messages"]))
        self.assertEqual(self.store.count_messages("chat"), 6)
        # A third turn: the pipeline hands back the history it retrieved; only the turn is new.
        self.turn(self.conversation(), "again")
        self.assertEqual(self.store.count_messages("chat"), 8)

    def test_a_pipeline_with_the_store_serialises_and_loads(self):
        pipeline = Pipeline()
        pipeline.add_component("writer", ChatMessageWriter(self.store))
        pipeline.add_component("retriever", ChatMessageRetriever(self.store))
        # Haystack loads classes of the modules it is told to trust.
        loaded = Pipeline.loads(pipeline.dumps(), allowed_modules=["sessiondb.haystack"])
        loaded.run({"writer": {"chat_history_id": "p", "messages": [
            ChatMessage.from_user("a"), ChatMessage.from_assistant("b")]},
                    "retriever": {"chat_history_id": "p"}})
        self.assertEqual(shown(self.store.retrieve_messages("p")),
                         shown([ChatMessage.from_user("a"), ChatMessage.from_assistant("b")]))
        store = self.opened(loaded.get_component("writer").chat_message_store)
        self.opened(loaded.get_component("retriever").chat_message_store)
        self.assertEqual((type(store), store.url, store.prefix, store.last_k),
                         (SessiondbChatMessageStore, self.served.url, self.prefix, 10))

    def test_a_compacted_history_reads_its_summary_which_is_never_stored_again(self):
        messages = [ChatMessage.from_user(f"q{i}") if i % 2 == 0
                    else ChatMessage.from_assistant(f"a{i}") for i in range(6)]
        self.store.write_messages("c", messages)
        stored = self.client.full_history(self.prefix + "c")
        self.client.add_compaction(self.prefix + "c", "the first four", stored[0]["id"],
                                   stored[3]["id"])
        retrieved = self.store.retrieve_messages("c", last_k=None)
        self.assertEqual([m.text for m in retrieved], ["the first four", "q4", "a5"])
        written = self.store.write_messages("c", retrieved + [ChatMessage.from_user("next")])
        self.assertEqual(written, 1)
        self.assertEqual([m["content"] for m in self.client.stored_history(self.prefix + "c")],
                         ["q0", "a1", "q2", "a3", "q4", "a5", "next"])

    def test_messages_another_client_wrote_read_with_their_ids(self):
        self.store.write_messages("o", [ChatMessage.from_user("mine")])
        self.client.append(self.prefix + "o", {"id": "theirs", "role": "assistant",
                                               "content": "from elsewhere"})
        self.client.append(self.prefix + "o", {"role": "critic", "content": "a note"})
        retrieved = self.store.retrieve_messages("o")
        self.assertEqual([(m.role.value, m.text) for m in retrieved], [
            ("user", "mine"), ("assistant", "from elsewhere"), ("user", "a note")])
        self.assertEqual(retrieved[1].meta["chat_message_id"], "theirs")
        # Handed back with a new message, only the new one is written.
        self.assertEqual(self.store.write_messages("o", retrieved + [
            ChatMessage.from_user("more")]), 1)
        self.assertEqual(self.store.count_messages("o"), 4)

    def test_deleting_touches_only_this_stores_histories(self):
        other = self.opened(SessiondbChatMessageStore(self.served.url,
                                                      prefix=self.prefix + "other/"))
        for store in (self.store, other):
            store.write_messages("d", [ChatMessage.from_user("x")])
        self.client.append(self.prefix + "not-haystack", {"role": "user", "content": "keep"})
        self.store.delete_messages("d")
        self.assertEqual(self.store.retrieve_messages("d"), [])
        self.store.write_messages("e", [ChatMessage.from_user("y")])
        # A history first written by another client is listed once this store writes to it.
        self.client.append(self.prefix + "f", {"role": "user", "content": "before"})
        self.store.write_messages("f", [ChatMessage.from_user("z")])
        other.delete_all_messages()
        self.assertEqual(other.count_messages("d"), 0)
        self.assertEqual(self.store.count_messages("e"), 1)
        self.store.delete_all_messages()
        self.assertEqual((self.store.count_messages("e"), self.store.count_messages("f")), (0, 0))
        self.assertEqual(len(self.client.full_history(self.prefix + "not-haystack")), 1)

    def test_bad_input_is_refused_as_by_the_in_memory_store(self):
        for store in (self.store, InMemoryChatMessageStore()):
            with self.assertRaises(ValueError):
                store.write_messages("bad", ["not a message"])
            with self.assertRaises(ValueError):
                store.write_messages("bad", 7)
            self.assertEqual(store.write_messages("bad", (m for m in [])), 0)
            with self.assertRaises(ValueError):
                store.retrieve_messages("bad", last_k=-1)
        self.assertEqual(self.store.count_messages("bad"), 0)


class SameAsInMemoryTest(ServedTest):
    """Random writes (new messages, histories handed back, system messages, tool calls) and
    retrievals, on Haystack's in-memory store and on sessiondb, answer alike."""

    def test_random_calls_answer_as_the_in_memory_store_does(self):
        rng = random.Random(7)
        for case in range(20):
            options = {"skip_system_messages": rng.random() < 0.5, "last_k": rng.choice([None, 2])}
            memory = InMemoryChatMessageStore(**options)
            ours = SessiondbChatMessageStore(self.served.url, prefix=f"same-{case}:", **options)
            self.addCleanup(ours.close)
            history = f"h{next(HISTORIES)}"
            retrieved = {id(memory): [], id(ours): []}
            for step in range(12):
                new = self.random_messages(rng, step)
                handed_back = rng.random() < 0.5
                last_k = rng.choice([None, 0, 1, 3])
                for store in (memory, ours):
                    given = (retrieved[id(store)] if handed_back else []) + new
                    written = store.write_messages(history, given)
                    retrieved[id(store)] = store.retrieve_messages(history, last_k=last_k)
                    if store is memory:
                        expected = written
                    else:
                        self.assertEqual(written, expected)
                self.assertEqual(shown(retrieved[id(ours)]), shown(retrieved[id(memory)]))
                self.assertEqual(ours.count_messages(history), memory.count_messages(history))
            memory.delete_messages(history)

    def test_a_history_moves_in_from_the_in_memory_store_once(self):
        memory = InMemoryChatMessageStore()
        history = f"h{next(HISTORIES)}"
        memory.write_messages(history, self.random_messages(random.Random(3), 1)
                              + self.random_messages(random.Random(5), 2))
        ours = SessiondbChatMessageStore(self.served.url, prefix="moved:")
        self.addCleanup(ours.close)
        every = memory.retrieve_messages(history, last_k=None)
        self.assertEqual(ours.write_messages(history, every), len(every))
        self.assertEqual(ours.write_messages(history, every), 0, "run again, it writes nothing")
        self.assertEqual(shown(ours.retrieve_messages(history, last_k=None)), shown(every))
        memory.delete_messages(history)

    @staticmethod
    def random_messages(rng: random.Random, step: int) -> list[ChatMessage]:
        call = ToolCall(tool_name="f", arguments={"n": step}, id=f"t{step}")
        choices = [
            [ChatMessage.from_user(f"q{step}"), ChatMessage.from_assistant(f"a{step}")],
            [ChatMessage.from_system(f"s{step}")],
            [ChatMessage.from_user(f"q{step}"), ChatMessage.from_assistant(tool_calls=[call]),
             ChatMessage.from_tool(f"r{step}", origin=call),
             ChatMessage.from_assistant(f"done {step}")],
            [ChatMessage.from_assistant(f"partial {step}", meta={"model": "m", "n": step})],
        ]
        return rng.choice(choices)


if __name__ == "__main__":
    unittest.main()

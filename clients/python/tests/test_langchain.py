"""LangChain's chat message history on a real server."""

from __future__ import annotations

import asyncio
import unittest
import warnings

from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from served import ServedTest

from sessiondb import SessiondbError
from sessiondb.langchain import SessiondbChatMessageHistory, copy_history

EVERY_KIND = [
    SystemMessage("Answer in one line."),
    HumanMessage("What is the weather in Rome?", id="h1", name="ada"),
    AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Rome"}, "id": "call_1"}],
              usage_metadata={"input_tokens": 12, "output_tokens": 5, "total_tokens": 17},
              response_metadata={"model_name": "m"}, id="run-1"),
    ToolMessage("sunny", tool_call_id="call_1", name="weather"),
    AIMessage([{"type": "text", "text": "Sunny in Rome."}], additional_kwargs={"refusal": None}),
    ChatMessage(role="critic", content="Too short."),
    FunctionMessage(name="legacy", content="{}"),
]


class ChatMessageHistoryTest(ServedTest):
    def history(self, name: str) -> SessiondbChatMessageHistory:
        return SessiondbChatMessageHistory(self.fresh_prefix() + name, self.client)

    def test_every_kind_of_message_comes_back_as_added(self):
        history = self.history("kinds")
        history.add_messages(EVERY_KIND[:3])
        history.add_message(EVERY_KIND[3])
        history.add_messages(EVERY_KIND[4:])
        self.assertEqual(history.messages, EVERY_KIND)
        # Other clients read ordinary messages: the chat role and the content.
        stored = self.client.full_history(history.session_id)
        self.assertEqual([(m["role"], m["content"]) for m in stored[:4]], [
            ("system", "Answer in one line."), ("user", "What is the weather in Rome?"),
            ("assistant", ""), ("tool", "sunny")])
        self.assertEqual([m["role"] for m in stored[4:]], ["assistant", "critic", "function"])
        self.assertEqual(stored[2]["metadata"]["langchainMessage"]["tool_calls"][0]["id"],
                         "call_1")
        # A streamed chunk is stored as the message it makes.
        history.add_message(AIMessageChunk(content="streamed"))
        self.assertEqual(history.messages[-1], AIMessage("streamed"))
        history.clear()
        self.assertEqual(history.messages, [])
        self.assertEqual(self.client.get_session(history.session_id)["messageCount"], 0)

    def test_another_history_is_copied_in_then_what_came_since_and_a_different_one_refused(self):
        source = InMemoryChatMessageHistory(messages=EVERY_KIND)
        target = self.history("moved")
        self.assertTrue(asyncio.run(copy_history(source, target)))
        self.assertEqual(target.messages, EVERY_KIND)
        version = self.client.get_session(target.session_id)["version"]
        self.assertFalse(asyncio.run(copy_history(source, target)), "a second copy")
        self.assertFalse(asyncio.run(copy_history(InMemoryChatMessageHistory(), target)))
        self.assertEqual(self.client.get_session(target.session_id)["version"], version)

        # A history that holds the first of the source's messages takes the rest.
        begun = self.history("begun")
        begun.add_messages(EVERY_KIND[:2])
        first = [m["id"] for m in self.client.full_history(begun.session_id)]
        self.assertTrue(asyncio.run(copy_history(source, begun)))
        self.assertEqual(begun.messages, EVERY_KIND)
        self.assertEqual([m["id"] for m in self.client.full_history(begun.session_id)][:2], first)

        taken = self.history("taken")
        taken.add_messages(EVERY_KIND[1:3])
        with self.assertRaises(SessiondbError) as raised:
            asyncio.run(copy_history(source, taken))
        self.assertEqual(raised.exception.code, "conflict")
        self.assertEqual(taken.messages, EVERY_KIND[1:3])

    def test_messages_of_other_clients_and_compactions_read_as_chat_messages(self):
        history = self.history("others")
        sid = history.session_id
        self.client.append_batch(sid, [
            {"id": "q", "role": "user", "content": "first question"},
            {"id": "a", "role": "assistant",
             "parts": [{"type": "text", "text": "first"}, {"type": "text", "text": "answer"}]},
            {"id": "q2", "role": "user", "content": "second question"},
            {"id": "d", "role": "developer", "content": "be kind"}])
        self.assertEqual(history.messages, [
            HumanMessage("first question"), AIMessage("first\nanswer"),
            HumanMessage("second question"), ChatMessage(role="developer", content="be kind")])
        self.client.add_compaction(sid, "Asked twice.", "q", "a")
        self.assertEqual(history.messages[0], AIMessage("Asked twice."))
        self.assertEqual(len(history.messages), 3)

    def test_async_methods_and_runnable_with_message_history(self):
        history = self.history("async")

        async def turn():
            await history.aadd_messages([HumanMessage("hi"), AIMessage("hello")])
            read = await history.aget_messages()
            await history.aclear()
            return read, await history.aget_messages()

        read, cleared = asyncio.run(turn())
        self.assertEqual(read, [HumanMessage("hi"), AIMessage("hello")])
        self.assertEqual(cleared, [])

        # A chain that answers with how many messages it was given: the history grows by a
        # question and an answer each turn, and is given back on the next.
        model = RunnableLambda(lambda messages: AIMessage(f"seen {len(messages)}"))
        prefix = self.fresh_prefix()
        with warnings.catch_warnings():
            # Deprecated upstream in favour of LangGraph's persistence (the checkpointer in
            # sessiondb.langgraph); still the way chains keep their history.
            warnings.simplefilter("ignore", DeprecationWarning)
            chain = RunnableWithMessageHistory(
                model, lambda session_id: SessiondbChatMessageHistory(prefix + session_id,
                                                                      self.client))
        config = {"configurable": {"session_id": "user-42"}}
        self.assertEqual(chain.invoke("one", config).content, "seen 1")
        self.assertEqual(chain.invoke("two", config).content, "seen 3")
        self.assertEqual(
            [m.content for m in SessiondbChatMessageHistory(prefix + "user-42",
                                                            self.client).messages],
            ["one", "seen 1", "two", "seen 3"])


if __name__ == "__main__":
    unittest.main()

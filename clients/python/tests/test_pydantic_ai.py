"""Pydantic AI's message history on a real server, with Pydantic AI's offline models."""

from __future__ import annotations

import asyncio
import unittest

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from served import ServedTest

from sessiondb.pydantic_ai import SessiondbMessageHistory


def dumped(messages) -> list:
    return ModelMessagesTypeAdapter.dump_python(messages, mode="json")


def weather_agent() -> Agent:
    agent = Agent(TestModel(), system_prompt="Be brief.")

    @agent.tool_plain
    def weather(city: str) -> str:
        return f"sunny in {city}"

    return agent


class MessageHistoryTest(ServedTest):
    def history(self, name: str) -> SessiondbMessageHistory:
        return SessiondbMessageHistory(self.fresh_prefix() + name, self.client)

    def test_a_run_with_tool_calls_comes_back_as_it_was(self):
        history = self.history("run")
        result = weather_agent().run_sync("Weather in Rome?", message_history=history.messages())
        history.add(result.new_messages())
        self.assertEqual(dumped(history.messages()), dumped(result.all_messages()))
        # Other clients read ordinary messages: a role and the text.
        stored = self.client.full_history(history.session_id)
        self.assertEqual([m["role"] for m in stored], ["user", "assistant", "tool", "assistant"])
        self.assertEqual(stored[0]["content"], "Be brief.\nWeather in Rome?")
        self.assertEqual(stored[2]["content"], "sunny in a")
        self.assertEqual(stored[1]["content"], "")

    def test_the_next_run_sees_the_stored_conversation(self):
        history = self.history("turns")
        seen: list[int] = []

        def answer(messages, info: AgentInfo) -> ModelResponse:
            seen.append(len(messages))
            return ModelResponse(parts=[TextPart(f"turn {len(seen)}")])

        agent = Agent(FunctionModel(answer))
        for prompt in ["one", "two"]:
            result = agent.run_sync(prompt, message_history=history.messages())
            history.add(result.new_messages())
        self.assertEqual(seen, [1, 3])
        self.assertEqual([m.parts[0].content for m in history.messages()],
                         ["one", "turn 1", "two", "turn 2"])

        async def cleared():
            await history.aclear()
            return await history.amessages()

        self.assertEqual(asyncio.run(cleared()), [])

    def test_messages_of_other_clients_and_compactions_read_as_model_messages(self):
        history = self.history("others")
        sid = history.session_id
        self.client.append_batch(sid, [
            {"id": "s", "role": "system", "content": "Be kind."},
            {"id": "q", "role": "user", "content": "first question"},
            {"id": "a", "role": "assistant",
             "parts": [{"type": "text", "text": "first"}, {"type": "text", "text": "answer"}]}])
        read = history.messages()
        self.assertIsInstance(read[0], ModelRequest)
        self.assertIsInstance(read[0].parts[0], SystemPromptPart)
        self.assertEqual(read[0].parts[0].content, "Be kind.")
        self.assertIsInstance(read[1].parts[0], UserPromptPart)
        self.assertEqual(read[1].parts[0].content, "first question")
        self.assertIsInstance(read[2], ModelResponse)
        self.assertEqual(read[2].parts[0].content, "first\nanswer")
        self.client.add_compaction(sid, "Asked once.", "q", "a")
        compacted = history.messages()
        self.assertEqual(len(compacted), 2)
        self.assertIsInstance(compacted[1], ModelResponse)
        self.assertEqual(compacted[1].parts[0].content, "Asked once.")


if __name__ == "__main__":
    unittest.main()

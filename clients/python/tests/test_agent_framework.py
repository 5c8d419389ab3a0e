"""Microsoft Agent Framework's history provider and session store on a real server, driven by
the framework's own Agent with a scripted chat client."""

from __future__ import annotations

import asyncio
import logging
import random
import tempfile
import unittest
import warnings
from collections.abc import Iterable

from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    ChatResponse,
    Content,
    FileHistoryProvider,
    InMemoryHistoryProvider,
    Message,
)
from agent_framework._sessions import filter_new_messages
from served import ServedTest

from sessiondb import CopyConflict
from sessiondb.agent_framework import (
    SessiondbHistoryProvider,
    SessiondbSessionStore,
    copy_history,
    framework_message_of,
)

# The scripted client does not invoke functions, which the framework warns about on each agent.
logging.getLogger("agent_framework").setLevel(logging.ERROR)


class ScriptedChatClient(BaseChatClient):
    """Answers with how many messages it was shown and the text of the last one."""

    async def _inner_get_response(self, *, messages, stream, options, **kwargs):
        text = f"shown {len(messages)}, last {messages[-1].text!r}"
        return ChatResponse(messages=[Message("assistant", [text])], response_id="scripted")


def agent(provider) -> Agent:
    return Agent(client=ScriptedChatClient(), context_providers=[provider])


def texts(messages: Iterable[Message]) -> list[str]:
    return [m.text for m in messages]


class HistoryProviderTest(ServedTest):
    def setUp(self):
        self.prefix = self.fresh_prefix()
        self.provider = SessiondbHistoryProvider(self.client, prefix=self.prefix)

    def test_an_agent_keeps_its_conversation_across_providers_and_processes(self):
        async def turns():
            session = AgentSession(session_id="chat")
            first = await agent(self.provider).run("hello", session=session)
            # Another provider (another process, say) loads the conversation and goes on.
            other = SessiondbHistoryProvider(self.client, prefix=self.prefix)
            second = await agent(other).run("again", session=AgentSession(session_id="chat"))
            third = await agent(self.provider).run("and once more", session=session)
            return first.text, second.text, third.text

        self.assertEqual(asyncio.run(turns()), ("shown 1, last 'hello'", "shown 3, last 'again'",
                                                "shown 5, last 'and once more'"))
        stored = self.client.full_history(self.prefix + "chat")
        self.assertEqual([(m["role"], m["content"]) for m in stored], [
            ("user", "hello"), ("assistant", "shown 1, last 'hello'"),
            ("user", "again"), ("assistant", "shown 3, last 'again'"),
            ("user", "and once more"), ("assistant", "shown 5, last 'and once more'")])
        # Searchable like any conversation.
        hits = self.client.search(self.prefix + "chat", "shown again")
        self.assertEqual([h["content"] for h in hits], ["shown 3, last 'again'"])

    def test_messages_round_trip_with_calls_results_and_data(self):
        call = Content.from_function_call(call_id="c1", name="weather", arguments={"city": "Oslo"})
        result = Content.from_function_result(call_id="c1", result="sunny")
        image = Content.from_uri("data:image/png;base64,iVBORw0KGgo=", media_type="image/png")
        messages = [
            Message("user", ["What is the weather?", image], message_id="u1"),
            Message("assistant", [call], author_name="forecaster",
                    additional_properties={"turn": 1}),
            Message("tool", [result]),
            Message("assistant", ["Sunny in Oslo."]),
        ]
        asyncio.run(self.provider.save_messages("calls", messages))
        fresh = SessiondbHistoryProvider(self.client, prefix=self.prefix)
        loaded = asyncio.run(fresh.get_messages("calls"))
        self.assertEqual([m.to_dict() for m in loaded], [m.to_dict() for m in messages])
        stored = self.client.full_history(self.prefix + "calls")
        self.assertEqual([m["content"] for m in stored],
                         ["What is the weather?", "", "", "Sunny in Oslo."])
        # A message of one plain text keeps it once, as its content.
        kept = [m["metadata"]["agentFrameworkMessage"] for m in stored]
        self.assertEqual(["contents" in k for k in kept], [True, True, True, False])

    def test_a_replayed_transcript_stores_only_what_came_since(self):
        chat = [Message("user", ["hi"]), Message("assistant", ["hello"]),
                Message("user", ["how are you?"]), Message("assistant", ["fine"])]
        asyncio.run(self.provider.save_messages("replay", chat[:2]))
        # The whole transcript again, from this provider and from one that holds nothing.
        asyncio.run(self.provider.save_messages("replay", chat[:3]))
        other = SessiondbHistoryProvider(self.client, prefix=self.prefix)
        asyncio.run(other.save_messages("replay", chat))
        self.assertEqual([m["content"] for m in self.client.full_history(self.prefix + "replay")],
                         ["hi", "hello", "how are you?", "fine"])
        # A message said again after the transcript is a new turn, and is kept.
        asyncio.run(self.provider.save_messages("replay", [Message("user", ["fine"])]))
        self.assertEqual(len(self.client.full_history(self.prefix + "replay")), 5)

    def test_a_write_from_elsewhere_between_load_and_save_is_kept(self):
        session = self.prefix + "raced"
        asyncio.run(self.provider.save_messages("raced", [Message("user", ["first"])]))
        self.assertEqual(texts(asyncio.run(self.provider.get_messages("raced"))), ["first"])
        client, answers = self.recording_client("raced")
        provider = SessiondbHistoryProvider(client, prefix=self.prefix)
        self.assertEqual(texts(asyncio.run(provider.get_messages("raced"))), ["first"])
        self.client.append(session, {"role": "user", "content": "from elsewhere"})
        asyncio.run(provider.save_messages("raced", [Message("assistant", ["answer"])]))
        self.assertEqual([m["content"] for m in self.client.full_history(session)],
                         ["first", "from elsewhere", "answer"])
        # The write at the version it read was refused, the path read again, then written.
        self.assertEqual([status for _, status in answers], [200, 409, 200, 201])
        # What it wrote it holds: the next load transfers nothing.
        answers.clear()
        self.assertEqual(texts(asyncio.run(provider.get_messages("raced"))),
                         ["first", "from elsewhere", "answer"])
        self.assertEqual(answers, [("GET", 304)])

    def test_compactions_apply_to_loads_and_messages_of_other_clients_read_as_text(self):
        session = self.prefix + "compacted"
        first = self.client.append(session, {"role": "user", "content": "one"})["message"]
        second = self.client.append(session, {"role": "assistant",
                                              "parts": [{"type": "text", "text": "two"}]})["message"]
        asyncio.run(self.provider.save_messages("compacted", [Message("user", ["three"])]))
        self.assertEqual(texts(asyncio.run(self.provider.get_messages("compacted"))),
                         ["one", "two", "three"])
        self.client.request("POST", f"/v1/sessions/{session}/compactions",
                            body={"summary": "one and two", "fromMessageId": first["id"],
                                  "toMessageId": second["id"]})
        loaded = asyncio.run(self.provider.get_messages("compacted"))
        self.assertEqual(texts(loaded), ["one and two", "three"])
        # A save compares with the stored path, which the compaction left whole.
        asyncio.run(self.provider.save_messages(
            "compacted", [Message("user", ["one"]), Message("assistant", ["two"]),
                          Message("user", ["three"]), Message("user", ["four"])]))
        self.assertEqual(texts(map(framework_message_of, self.client.stored_history(session))),
                         ["one", "two", "three", "four"])

    def test_an_empty_session_id_is_refused(self):
        with self.assertRaises(ValueError):
            asyncio.run(self.provider.get_messages(None))
        with self.assertRaises(ValueError):
            asyncio.run(self.provider.save_messages("", [Message("user", ["x"])]))


class ComparedTailTest(unittest.TestCase):
    def test_new_messages_are_found_from_the_stored_tail_as_long_as_what_is_given(self):
        # The provider compares a save with the last len(given) stored messages only.
        rng = random.Random(7)
        pool = [Message(role, [text]) for role in ("user", "assistant") for text in "abc"]
        pool.append(Message("user", ["a"], message_id="m1"))
        for _ in range(3000):
            stored = rng.choices(pool, k=rng.randint(0, 8))
            given = rng.choices(pool, k=rng.randint(1, 5))
            if rng.random() < 0.3 and stored:  # a replay of a stretch of what is stored
                start = rng.randrange(len(stored))
                given = stored[start:] + given
            whole = filter_new_messages(stored, given)
            tail = filter_new_messages(stored[-len(given):], given)
            self.assertEqual([m.to_dict() for m in tail], [m.to_dict() for m in whole],
                             (stored, given))


class SessionStoreTest(ServedTest):
    def test_snapshots_are_kept_replaced_and_deleted(self):
        prefix = self.fresh_prefix()
        store = SessiondbSessionStore(self.client, prefix=prefix)
        provider = SessiondbHistoryProvider(self.client, prefix=prefix)

        async def run():
            self.assertIsNone(await store.get("s1"))
            session = AgentSession(session_id="s1", service_session_id="thread-9")
            session.state["progress"] = {"step": 2, "notes": ["a", "b"]}
            await agent(provider).run("hi", session=session)
            await store.set("s1", session)
            restored = await store.get("s1")
            self.assertEqual(restored.to_dict(), session.to_dict())
            # The restored session goes on with its conversation.
            answer = await agent(provider).run("more", session=restored)
            self.assertEqual(answer.text, "shown 3, last 'more'")
            restored.state["progress"]["step"] = 3
            await store.set("s1", restored)
            self.assertEqual((await store.get("s1")).state["progress"]["step"], 3)
            await store.delete("s1")
            await store.delete("s1")
            self.assertIsNone(await store.get("s1"))
            with self.assertRaises(ValueError):
                await store.get("")

        asyncio.run(run())
        # The snapshot went; the conversation beside it stays.
        self.assertEqual(len(self.client.full_history(prefix + "s1")), 4)


class MovingInTest(ServedTest):
    def test_a_file_history_is_copied_once_and_a_taken_session_is_refused(self):
        prefix = self.fresh_prefix()
        target = SessiondbHistoryProvider(self.client, prefix=prefix)
        with tempfile.TemporaryDirectory() as folder:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the framework marks it experimental
                source = FileHistoryProvider(folder)

            async def run():
                await agent(source).run("hello", session=AgentSession(session_id="a"))
                await agent(source).run("again", session=AgentSession(session_id="a"))
                await agent(source).run("hi", session=AgentSession(session_id="b"))
                await target.save_messages("b", [Message("user", ["something else"])])
                with self.assertRaises(CopyConflict):
                    await copy_history(source, target, ["b"])
                copied = await copy_history(source, target, ["a", "empty"])
                self.assertEqual((copied.copied, copied.skipped), (["a"], ["empty"]))
                self.assertEqual([m.to_dict() for m in await target.get_messages("a")],
                                 [m.to_dict() for m in await source.get_messages("a")])
                again = await copy_history(source, target, ["a"])
                self.assertEqual((again.copied, again.skipped), ([], ["a"]))
                # The agent went on in the old store: the copy adds what came since.
                await agent(source).run("third", session=AgentSession(session_id="a"))
                self.assertEqual((await copy_history(source, target, ["a"])).copied, ["a"])
                self.assertEqual(texts(await target.get_messages("a"))[-2:],
                                 ["third", "shown 5, last 'third'"])
                # ... and goes on from the copy.
                answer = await agent(target).run("fourth", session=AgentSession(session_id="a"))
                self.assertEqual(answer.text, "shown 7, last 'fourth'")

            asyncio.run(run())
        self.assertEqual([m["content"] for m in self.client.full_history(prefix + "b")],
                         ["something else"])

    def test_sessions_held_in_their_own_state_are_copied(self):
        prefix = self.fresh_prefix()
        source = InMemoryHistoryProvider()
        session = AgentSession(session_id="kept")

        async def run():
            await agent(source).run("hello", session=session)
            target = SessiondbHistoryProvider(self.client, prefix=prefix)
            self.assertEqual((await copy_history(source, target, [session])).copied, ["kept"])
            return texts(await target.get_messages("kept"))

        self.assertEqual(asyncio.run(run()), ["hello", "shown 1, last 'hello'"])


if __name__ == "__main__":
    unittest.main()

"""The OpenAI Agents SDK session on a real server, with the real SDK (openai-agents from PyPI)
and a local stand-in for the model API."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import pathlib
import sqlite3
import time
import unittest

from agents import (Agent, Runner, SessionSettings, function_tool, set_default_openai_api,
                    set_default_openai_client, set_tracing_disabled)
from agents.memory import Session, SQLiteSession
from agents.models.openai_responses import OpenAIResponsesModel
from fake_responses import FakeResponses
from openai import AsyncOpenAI
from served import Served, ServedTest

from sessiondb import Client, SessiondbError
from sessiondb.openai_agents import SessiondbSession, copy_session, copy_sqlite_sessions

set_tracing_disabled(True)

# Items of every kind the SDK keeps in a session, in the shapes it produces them.
ITEMS = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "user", "content": [{"type": "input_text", "text": "and in Rome?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look up"}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather",
     "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 °C"},
    {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
     "content": [{"type": "output_text", "text": "Sunny in Paris 🌞", "annotations": []}]},
    {"role": "system", "content": "be brief"},
]


def run(coroutine):
    return asyncio.run(coroutine)


class SessionProtocolTest(ServedTest):
    def test_is_an_sdk_session(self):
        self.assertIsInstance(SessiondbSession("s", self.client), Session)

    def test_items_round_trip_exactly(self):
        session = SessiondbSession("round-trip", self.client)
        run(session.add_items(ITEMS[:3]))
        run(session.add_items(ITEMS[3:]))
        self.assertEqual(run(session.get_items()), ITEMS)
        self.assertEqual(run(session.get_items(limit=2)), ITEMS[-2:])
        self.assertEqual(run(session.get_items(limit=100)), ITEMS)
        self.assertEqual(run(session.get_items(limit=0)), [])
        # Another client of the same server sees the same conversation.
        with Client(self.served.url) as other:
            self.assertEqual(run(SessiondbSession("round-trip", other).get_items()), ITEMS)

    def test_images_round_trip_exactly(self):
        image = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 40).decode()
        items = [
            {"role": "user", "content": [{"type": "input_text", "text": "what is this?"},
                                         {"type": "input_image", "image_url": image,
                                          "detail": "auto"}]},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_image", "image_url": image}]},
        ]
        session = SessiondbSession("images", self.client)
        run(session.add_items(items))
        self.assertTrue(run(session.get_items()) == items, "the images came back changed")

    def test_stored_messages_are_ordinary_messages(self):
        session = SessiondbSession("stored", self.client)
        run(session.add_items(ITEMS))
        stored = list(self.client.history("stored"))
        self.assertEqual([m["role"] for m in stored],
                         ["user", "user", "assistant", "assistant", "tool", "assistant", "system"])
        self.assertEqual(stored[0]["content"], "What is the weather in Paris?")
        self.assertNotIn("metadata", stored[0], "a plain message item needs nothing extra")
        self.assertEqual(stored[5]["metadata"],
                         {"openaiItem": {"type": "message", "id": "msg_1", "status": "completed"}})
        self.assertEqual(stored[3]["metadata"], {"openaiItem": "content"})
        self.assertEqual([h["content"] for h in self.client.search("stored", "weather")],
                         ["What is the weather in Paris?"])

    def test_pop_and_clear(self):
        session = SessiondbSession("pop", self.client)
        self.assertIsNone(run(session.pop_item()))
        run(session.add_items(ITEMS[:4]))
        self.assertEqual(run(session.pop_item()), ITEMS[3])
        self.assertEqual(run(session.pop_item()), ITEMS[2])
        self.assertEqual(run(session.get_items()), ITEMS[:2])
        run(session.add_items([ITEMS[4]]))
        self.assertEqual(run(session.get_items()), [*ITEMS[:2], ITEMS[4]],
                         "items added after a pop follow the remaining ones")
        run(session.clear_session())
        self.assertEqual(run(session.get_items()), [])
        self.assertIsNone(run(session.pop_item()))
        run(session.clear_session())

    def test_a_read_after_its_own_write_transfers_nothing(self):
        client, statuses = self.recording_client()
        session = SessiondbSession(self.fresh_prefix() + "held", client)
        run(session.add_items(ITEMS[:2]))
        self.assertEqual(run(session.get_items()), ITEMS[:2])
        run(session.add_items(ITEMS[2:4]))
        statuses.clear()
        items = run(session.get_items())
        self.assertEqual(items, ITEMS[:4])
        self.assertEqual(statuses, [("GET", 304)], "the session is as this object wrote it")
        items[0]["content"] = "changed by the caller"
        self.assertEqual(run(session.get_items()), ITEMS[:4], "each read has objects of its own")

        # Another writer's items: the next read transfers the conversation.
        with Client(self.served.url) as other:
            run(SessiondbSession(session.session_id, other).add_items([ITEMS[4]]))
        statuses.clear()
        self.assertEqual(run(session.get_items()), ITEMS[:5])
        self.assertEqual(statuses, [("GET", 200)])

        # A write elsewhere between a read and this object's add: the add, refused at the
        # version read, lands after it anyway, and the next read transfers the conversation.
        with Client(self.served.url) as other:
            run(SessiondbSession(session.session_id, other).add_items([ITEMS[5]]))
        statuses.clear()
        run(session.add_items([ITEMS[6]]))
        self.assertEqual(statuses, [("POST", 409), ("POST", 201)])
        statuses.clear()
        self.assertEqual(run(session.get_items()), ITEMS)
        self.assertEqual(statuses, [("GET", 200)])

    def test_add_items_stores_all_or_nothing(self):
        session = SessiondbSession("atomic", self.client)
        run(session.add_items(ITEMS[:1]))
        bad = {"role": "user\u0000", "content": "a NUL in the role"}
        with self.assertRaises(SessiondbError) as caught:
            run(session.add_items([ITEMS[1], bad]))
        self.assertEqual(caught.exception.code, "invalid_request")
        self.assertEqual(run(session.get_items()), ITEMS[:1])

    def test_session_settings_limit(self):
        session = SessiondbSession("limited", self.client,
                                   session_settings=SessionSettings(limit=3))
        run(session.add_items(ITEMS))
        self.assertEqual(run(session.get_items()), ITEMS[-3:])
        self.assertEqual(run(session.get_items(limit=1)), ITEMS[-1:])

    def test_compactions_show_their_summary(self):
        session = SessiondbSession("compacted", self.client)
        run(session.add_items(ITEMS))
        ids = [m["id"] for m in self.client.history("compacted")]
        self.assertEqual(len(ids), len(ITEMS))
        self.client.add_compaction("compacted", "Asked about the weather in Paris.", ids[0], ids[4])
        self.assertEqual(run(session.get_items()),
                         [{"role": "assistant", "content": "Asked about the weather in Paris."},
                          *ITEMS[5:]])
        self.assertEqual(len(self.client.messages("compacted", limit=100)["items"]), len(ITEMS),
                         "compaction hides messages from the model, it deletes none")

    def test_auto_compaction_shortens_what_the_model_is_sent(self):
        """With `compactAfter` on the session, the server summarises the middle of a long
        conversation by itself; the SDK then gets the summary in place of those items, while
        every item stays stored."""
        self.client.create_session("auto-compacted")
        self.client.update_session("auto-compacted",
                                   settings={"compactAfter": 1500, "keepRecentTokens": 300})
        session = SessiondbSession("auto-compacted", self.client)
        added = []
        for turn in range(25):
            items = [{"role": "user", "content": f"question {turn}: " + "why " * 40},
                     {"role": "assistant", "content": f"answer {turn}: " + "because " * 40}]
            run(session.add_items(items))
            added += items
        shown = run(session.get_items())
        for _ in range(100):  # the server may still be summarising the last append
            if len(shown) < len(added):
                break
            time.sleep(0.02)
            shown = run(session.get_items())
        self.assertLess(len(shown), len(added) // 2)
        self.assertEqual(shown[:3], added[:3], "the first messages stay")
        self.assertEqual(shown[-2:], added[-2:], "the most recent turn stays")
        summaries = [item for item in shown if item not in added]
        self.assertGreaterEqual(len(summaries), 1)
        self.assertTrue(all(item["role"] == "assistant" for item in summaries), summaries)
        self.assertEqual(len(self.client.messages("auto-compacted", limit=100)["items"]),
                         len(added), "nothing is deleted")

    def test_items_survive_a_server_kill(self):
        served = Served()
        with Client(served.url) as client:
            run(SessiondbSession("durable", client).add_items(ITEMS))
        served.stop(keep_data=True)
        again = Served(like=served)
        try:
            with Client(again.url) as client:
                self.assertEqual(run(SessiondbSession("durable", client).get_items()), ITEMS)
        finally:
            again.stop()
            served.stop()


class MovingInTest(ServedTest):
    """Conversations of the SDK's own SQLiteSession file, copied into sessiondb."""

    def sqlite_file(self, conversations: dict[str, list[dict]]) -> str:
        path = str(pathlib.Path(self.served.data) / f"{self.id()}.sqlite3")
        for session_id, items in conversations.items():
            source = SQLiteSession(session_id, path)
            run(source.add_items(items))
            if not items:
                run(source.add_items([{"role": "user", "content": "gone"}]))
                run(source.pop_item())
            source.close()
        return path

    def test_a_file_of_sessions_is_copied_whole_and_a_second_copy_writes_nothing(self):
        conversations = {"ada": ITEMS, "bob": ITEMS[:2] + ITEMS[5:6], "empty": []}
        path = self.sqlite_file(conversations)
        # Times as the file keeps them, a minute apart, and a row the SDK skips as not JSON.
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE agent_messages SET created_at = "
                       "datetime('2025-01-01 10:00:00', '+' || id || ' minutes')")
            db.execute("UPDATE agent_sessions SET created_at = '2025-01-01 09:30:00'")
            db.execute("INSERT INTO agent_messages (session_id, message_data) "
                       "VALUES ('ada', '{not json')")
        copied = run(copy_sqlite_sessions(path, self.client))
        self.assertEqual(sorted(copied.copied), ["ada", "bob"])
        self.assertEqual(copied.skipped, ["empty"])
        for session_id in ("ada", "bob"):
            self.assertEqual(run(SessiondbSession(session_id, self.client).get_items()),
                             conversations[session_id])
        self.assertEqual(self.client.get_session("ada")["messageCount"], len(ITEMS))
        at_ten = 1735725600000  # 2025-01-01 10:00:00 UTC
        with contextlib.closing(sqlite3.connect(path)) as db:
            ids = [row[0] for row in db.execute(
                "SELECT id FROM agent_messages WHERE session_id = 'bob' ORDER BY id")]
        self.assertEqual([m["createdAt"] for m in self.client.full_history("bob")],
                         [at_ten + i * 60_000 for i in ids])
        self.assertEqual(self.client.get_session("bob")["createdAt"], at_ten - 30 * 60_000)
        with self.assertRaises(SessiondbError) as raised:
            self.client.get_session("empty")
        self.assertEqual(raised.exception.code, "not_found")

        versions = {s: self.client.get_session(s)["version"] for s in ("ada", "bob")}
        again = run(copy_sqlite_sessions(path, self.client))
        self.assertEqual((again.copied, sorted(again.skipped)), ([], ["ada", "bob", "empty"]))
        self.assertEqual({s: self.client.get_session(s)["version"] for s in versions}, versions)
        # The copies are ordinary sessions the agent goes on with.
        target = SessiondbSession("bob", self.client)
        run(target.add_items([{"role": "user", "content": "and now?"}]))
        self.assertEqual(run(target.get_items())[-1], {"role": "user", "content": "and now?"})

    def test_a_second_copy_after_the_source_went_on_writes_only_the_new_items(self):
        path = self.sqlite_file({"cy": ITEMS[:3]})
        self.assertEqual(run(copy_sqlite_sessions(path, self.client)).copied, ["cy"])
        first = [m["id"] for m in self.client.full_history("cy")]
        # The agent went on with the file until it moved over.
        source = SQLiteSession("cy", path)
        run(source.add_items(ITEMS[3:]))
        source.close()
        self.assertEqual(run(copy_sqlite_sessions(path, self.client)).copied, ["cy"])
        self.assertEqual(run(SessiondbSession("cy", self.client).get_items()), ITEMS)
        self.assertEqual([m["id"] for m in self.client.full_history("cy")][:3], first)
        self.assertEqual(run(copy_sqlite_sessions(path, self.client)).skipped, ["cy"])

    def test_a_target_holding_other_items_is_refused_and_left_as_it_was(self):
        path = self.sqlite_file({"taken": ITEMS[:3]})
        run(SessiondbSession("taken", self.client).add_items(ITEMS[3:5]))
        source = SQLiteSession("taken", path)
        try:
            with self.assertRaises(SessiondbError) as raised:
                run(copy_session(source, SessiondbSession("taken", self.client)))
        finally:
            source.close()
        self.assertEqual(raised.exception.code, "conflict")
        self.assertEqual(run(SessiondbSession("taken", self.client).get_items()), ITEMS[3:5])
        with self.assertRaises(SessiondbError):
            run(copy_sqlite_sessions(path, self.client))

    def test_a_session_that_exists_without_messages_takes_the_copy(self):
        self.client.create_session("made-before", name="kept")
        source = SQLiteSession("made-before")
        run(source.add_items(ITEMS))
        self.assertTrue(run(copy_session(source, SessiondbSession("made-before", self.client))))
        source.close()
        self.assertEqual(run(SessiondbSession("made-before", self.client).get_items()), ITEMS)
        self.assertEqual(self.client.get_session("made-before")["name"], "kept")


class AgentRunTest(ServedTest):
    """`Runner.run` with a sessiondb session: the SDK loads the history from sessiondb before
    each turn and saves the turn's items after it."""

    def setUp(self):
        self.model_api = FakeResponses()
        self.addCleanup(self.model_api.close)
        self.model = OpenAIResponsesModel(
            model="gpt-4o", openai_client=AsyncOpenAI(base_url=self.model_api.url, api_key="x"))

    def test_turns_see_the_earlier_turns(self):
        agent = Agent(name="helper", instructions="Answer briefly.", model=self.model)
        session = SessiondbSession("agent-turns", self.client)
        self.model_api.reply("Hi Ada!")
        first = run(Runner.run(agent, "Hello, I am Ada.", session=session))
        self.assertEqual(first.final_output, "Hi Ada!")
        self.model_api.reply("You are Ada.")
        second = run(Runner.run(agent, "What is my name?", session=session))
        self.assertEqual(second.final_output, "You are Ada.")

        sent = self.model_api.requests[1]["input"]
        self.assertEqual(sent[0], {"role": "user", "content": "Hello, I am Ada."})
        self.assertEqual(sent[1]["role"], "assistant")
        self.assertEqual(sent[1]["content"][0]["text"], "Hi Ada!")
        self.assertEqual(sent[-1], {"role": "user", "content": "What is my name?"})
        self.assertEqual(len(sent), 3)
        stored = list(self.client.history("agent-turns"))
        self.assertEqual([m["role"] for m in stored], ["user", "assistant", "user", "assistant"])
        self.assertEqual(stored[3]["content"][0]["text"], "You are Ada.")

    def test_tool_calls_are_kept_and_sent_back(self):
        calls = []

        @function_tool
        def weather(city: str) -> str:
            """The weather in a city."""
            calls.append(city)
            return f"sunny in {city}"

        agent = Agent(name="forecaster", model=self.model, tools=[weather])
        session = SessiondbSession("agent-tools", self.client)
        self.model_api.call_tool("weather", {"city": "Rome"}, "call_rome")
        self.model_api.reply("It is sunny in Rome.")
        result = run(Runner.run(agent, "Weather in Rome?", session=session))
        self.assertEqual(result.final_output, "It is sunny in Rome.")
        self.assertEqual(calls, ["Rome"])

        self.model_api.reply("You asked about Rome.")
        run(Runner.run(agent, "Which city did I ask about?", session=session))
        sent = self.model_api.requests[2]["input"]
        kinds = [item.get("type") or item.get("role") for item in sent]
        self.assertEqual(kinds, ["user", "function_call", "function_call_output", "message", "user"])
        self.assertEqual(sent[1]["call_id"], "call_rome")
        self.assertEqual(sent[2], {"type": "function_call_output", "call_id": "call_rome",
                                   "output": "sunny in Rome"})
        self.assertEqual(run(session.get_items())[:4], sent[:4])


class ReadmeExampleTest(unittest.TestCase):
    """The README's example, as written, with the SDK's default model client pointed at the
    stand-in and the server's address replaced by the test server's."""

    def test_readme_example_runs(self):
        readme = (pathlib.Path(__file__).parents[3] / "README.md").read_text()
        block = readme.split("<!-- python-example -->\n```python\n", 1)[1].split("```", 1)[0]
        served = Served()
        self.addCleanup(served.stop)
        model_api = FakeResponses()
        self.addCleanup(model_api.close)
        set_default_openai_client(AsyncOpenAI(base_url=model_api.url, api_key="x"),
                                  use_for_tracing=False)
        set_default_openai_api("responses")
        model_api.reply("San Francisco.")
        model_api.reply("California.")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(block.replace("http://127.0.0.1:8787", served.url), {})
        self.assertEqual(printed.getvalue(), "California.\n")
        sent = model_api.requests[1]["input"]
        self.assertEqual(sent[0]["content"], "What city is the Golden Gate Bridge in?")
        self.assertEqual(sent[1]["content"][0]["text"], "San Francisco.")
        with Client(served.url) as client:
            stored = list(client.history("user-42"))
        self.assertEqual([m["role"] for m in stored], ["user", "assistant", "user", "assistant"])


if __name__ == "__main__":
    unittest.main()

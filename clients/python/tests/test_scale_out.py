"""Several servers in front of one PostgreSQL database, each framework writing through one and
reading through another. Only the PostgreSQL run of the suite has tests here: an embedded store
is opened by one process at a time."""

from __future__ import annotations

import asyncio
import unittest

from served import ON_POSTGRESQL, Served
from test_langgraph import graph

from langgraph.types import Command

from sessiondb import Client
from sessiondb.claude_agent_sdk import SessiondbSessionStore
from sessiondb.langgraph import SessiondbSaver
from sessiondb.openai_agents import SessiondbSession


if ON_POSTGRESQL:
    class ScaleOutTest(unittest.TestCase):
        @classmethod
        def setUpClass(cls):
            cls.first = Served()
            cls.second = Served(database=cls.first.database)
            cls.a, cls.b = Client(cls.first.url), Client(cls.second.url)

        @classmethod
        def tearDownClass(cls):
            for client in (cls.a, cls.b):
                client.close()
            cls.second.stop()
            cls.first.stop()

        def test_an_agent_conversation_moves_between_servers(self):
            items = [{"role": "user", "content": f"turn {i}"} for i in range(6)]
            for i, item in enumerate(items):
                client = self.a if i % 2 == 0 else self.b
                asyncio.run(SessiondbSession("roaming", client).add_items([item]))
            for client in (self.a, self.b):
                self.assertEqual(asyncio.run(SessiondbSession("roaming", client).get_items()),
                                 items)

        def test_a_graph_interrupted_on_one_server_resumes_on_another(self):
            config = {"configurable": {"thread_id": "ask-across"}}
            paused = graph(SessiondbSaver(self.a), ask=True).invoke(
                {"topic": "moths", "steps": []}, config)
            self.assertIn("__interrupt__", paused)
            resumed = graph(SessiondbSaver(self.b), ask=True).invoke(Command(resume=True), config)
            self.assertEqual(resumed["steps"], ["research moths", "write moths"])

        def test_a_transcript_mirrored_through_one_server_loads_through_another(self):
            key = {"project_key": "-repo", "session_id": "transcript-across"}
            entries = [{"type": "user", "uuid": f"u{i}",
                        "message": {"role": "user", "content": f"line {i}"}} for i in range(4)]
            asyncio.run(SessiondbSessionStore(self.a).append(key, entries[:2]))
            asyncio.run(SessiondbSessionStore(self.b).append(key, entries[2:]))
            for client in (self.a, self.b):
                self.assertEqual(asyncio.run(SessiondbSessionStore(client).load(key)), entries)

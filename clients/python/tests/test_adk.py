"""ADK's session service on a real server, driven by ADK's own Runner with a scripted model."""

from __future__ import annotations

import asyncio
import datetime
import logging
import pathlib
import unittest
import unittest.mock
from typing import AsyncGenerator

from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from served import ServedTest

import sessiondb.client
from sessiondb import SessiondbError
from sessiondb.adk import (
    SessiondbMemoryService,
    SessiondbSessionService,
    copy_sessions,
    session_key,
)

# The scripted model reports no token usage, which ADK logs at every answer.
logging.getLogger("google_adk").setLevel(logging.ERROR)


class ScriptedLlm(BaseLlm):
    """Calls the tool `count_visit` once per turn, then answers with the turn's number and how
    many messages it was shown."""

    model: str = "scripted"

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        if any(p.function_response for p in last.parts or []):
            visits = last.parts[0].function_response.response["visits"]
            text = f"visit {visits}, shown {len(llm_request.contents)} contents"
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
        else:
            call = types.FunctionCall(name="count_visit", args={})
            yield LlmResponse(content=types.Content(role="model",
                                                    parts=[types.Part(function_call=call)]))


def count_visit(tool_context: ToolContext) -> dict:
    """Counts the user's visits (user state), the app's (app state) and this session's."""
    visits = tool_context.state.get("user:visits", 0) + 1
    tool_context.state["user:visits"] = visits
    tool_context.state["app:total"] = tool_context.state.get("app:total", 0) + 1
    tool_context.state["turns"] = tool_context.state.get("turns", 0) + 1
    tool_context.state["temp:scratch"] = "never stored"
    return {"visits": visits}


def agent() -> LlmAgent:
    return LlmAgent(name="counter", model=ScriptedLlm(), instruction="Count visits.",
                    tools=[count_visit], output_key="last_answer")


def dumped(events: list[Event]) -> list[dict]:
    return [e.model_dump(mode="json", exclude_none=True) for e in events]


class AppTest(ServedTest):
    """An app of its own per test, its service, and a runner's turn."""

    def setUp(self):
        self.app = self.fresh_prefix() + "app"
        self.service = SessiondbSessionService(self.client)

    def run_turn(self, service, user: str, session: str, text: str) -> list[Event]:
        runner = Runner(app_name=self.app, agent=agent(), session_service=service)

        async def turn() -> list[Event]:
            message = types.Content(role="user", parts=[types.Part(text=text)])
            return [e async for e in runner.run_async(user_id=user, session_id=session,
                                                      new_message=message)]
        return asyncio.run(turn())

    def get(self, user: str, session: str, config: GetSessionConfig | None = None):
        return asyncio.run(self.service.get_session(app_name=self.app, user_id=user,
                                                    session_id=session, config=config))


class SessionServiceTest(AppTest):
    def test_a_runner_keeps_its_conversation_and_state_across_processes(self):
        asyncio.run(self.service.create_session(app_name=self.app, user_id="ann",
                                                session_id="s1", state={"lang": "en"}))
        first = self.run_turn(self.service, "ann", "s1", "hello")
        self.assertEqual(first[-1].content.parts[0].text, "visit 1, shown 3 contents")
        # A new service (another process, say) reads everything back and runs on from it.
        second = self.run_turn(SessiondbSessionService(self.client), "ann", "s1", "again")
        self.assertEqual(second[-1].content.parts[0].text, "visit 2, shown 7 contents")

        session = self.get("ann", "s1")
        self.assertEqual(len(session.events), 8)
        self.assertEqual(dumped(session.events[-3:]), dumped(second))
        self.assertEqual(session.events[0].content.parts[0].text, "hello")
        self.assertEqual(session.state, {
            "lang": "en", "turns": 2, "last_answer": "visit 2, shown 7 contents",
            "user:visits": 2, "app:total": 2})
        # Other clients read ordinary messages.
        stored = self.client.full_history(session_key(self.app, "ann", "s1"))
        self.assertEqual([m["role"] for m in stored[:4]], ["user", "assistant", "tool", "assistant"])
        self.assertEqual(stored[3]["content"], "visit 1, shown 3 contents")
        self.assertNotIn("parts", stored[3]["metadata"]["adkEvent"]["content"],
                         "an event of one text keeps it once, as the message's content")
        self.assertIn("parts", stored[1]["metadata"]["adkEvent"]["content"], "a function call")
        self.assertEqual(self.client.search(session_key(self.app, "ann", "s1"), "again")[0]["id"],
                         session.events[4].id)

    def test_state_is_scoped_to_app_user_and_session(self):
        for user, session in [("ann", "a1"), ("ann", "a2"), ("bob", "b1")]:
            asyncio.run(self.service.create_session(app_name=self.app, user_id=user,
                                                    session_id=session))
            self.run_turn(self.service, user, session, "hi")
        self.assertEqual(self.get("ann", "a2").state["user:visits"], 2)
        self.assertEqual(self.get("ann", "a2").state["turns"], 1, "session state stays its own")
        self.assertEqual(self.get("bob", "b1").state["user:visits"], 1)
        self.assertEqual(self.get("bob", "b1").state["app:total"], 3, "app state is shared")
        self.assertNotIn("temp:scratch", self.get("ann", "a1").state)
        self.assertEqual(asyncio.run(self.service.get_user_state(app_name=self.app,
                                                                 user_id="ann")),
                         {"visits": 2})
        self.assertEqual(asyncio.run(self.service.get_user_state(app_name=self.app,
                                                                 user_id="nobody")), {})
        # Initial state goes to its scopes too, as JSON (a date as ISO text).
        created = asyncio.run(self.service.create_session(
            app_name=self.app, user_id="cy",
            state={"app:total": 10, "user:x": 1, "y": 2, "temp:z": 3,
                   "day": datetime.date(2024, 1, 2)}))
        expected = {"app:total": 10, "user:x": 1, "y": 2, "day": "2024-01-02"}
        self.assertEqual(created.state, expected)
        self.assertEqual(self.get("cy", created.id).state, expected)
        self.assertEqual(self.get("bob", "b1").state["app:total"], 10)

    def test_listing_deleting_and_creating_twice(self):
        for user, session in [("ann", "x"), ("ann", "y"), ("bob", "z")]:
            asyncio.run(self.service.create_session(app_name=self.app, user_id=user,
                                                    session_id=session,
                                                    state={"user:name": user}))
        self.run_turn(self.service, "ann", "x", "hi")
        listed = asyncio.run(self.service.list_sessions(app_name=self.app, user_id="ann"))
        self.assertEqual([s.id for s in listed.sessions], ["y", "x"], "oldest update first")
        self.assertEqual(listed.sessions[1].state["user:name"], "ann")
        self.assertEqual(listed.sessions[1].events, [])
        everyone = asyncio.run(self.service.list_sessions(app_name=self.app))
        self.assertEqual(sorted((s.user_id, s.id) for s in everyone.sessions),
                         [("ann", "x"), ("ann", "y"), ("bob", "z")])
        other_app = asyncio.run(self.service.list_sessions(app_name=self.app + "-other"))
        self.assertEqual(other_app.sessions, [])

        with self.assertRaises(AlreadyExistsError):
            asyncio.run(self.service.create_session(app_name=self.app, user_id="ann",
                                                    session_id="x"))
        asyncio.run(self.service.delete_session(app_name=self.app, user_id="ann",
                                                session_id="x"))
        asyncio.run(self.service.delete_session(app_name=self.app, user_id="ann",
                                                session_id="x"))
        self.assertIsNone(self.get("ann", "x"))
        self.assertIsNone(self.get("ann", "never"))

    def test_recent_events_and_events_after_a_time(self):
        asyncio.run(self.service.create_session(app_name=self.app, user_id="ann",
                                                session_id="t"))
        session = self.get("ann", "t")
        for i in range(250):
            event = Event(author="user" if i % 2 == 0 else "counter", invocation_id=f"i{i}",
                          timestamp=1000.0 + i,
                          content=types.Content(role="user", parts=[types.Part(text=f"e{i}")]))
            asyncio.run(self.service.append_event(session, event))

        def texts(config):
            return [e.content.parts[0].text for e in self.get("ann", "t", config).events]

        self.assertEqual(len(texts(None)), 250)
        self.assertEqual(texts(GetSessionConfig(num_recent_events=3)), ["e247", "e248", "e249"])
        self.assertEqual(texts(GetSessionConfig(num_recent_events=0)), [])
        self.assertEqual(texts(GetSessionConfig(after_timestamp=1245.0)),
                         ["e245", "e246", "e247", "e248", "e249"])
        self.assertEqual(texts(GetSessionConfig(after_timestamp=1010.0, num_recent_events=2)),
                         ["e248", "e249"])
        self.assertEqual(len(texts(GetSessionConfig(num_recent_events=120))), 120)

    def test_a_stale_session_object_writes_nothing(self):
        asyncio.run(self.service.create_session(app_name=self.app, user_id="ann",
                                                session_id="st"))
        mine, theirs = self.get("ann", "st"), self.get("ann", "st")

        def event(text: str, delta: dict | None = None) -> Event:
            return Event(author="user", invocation_id="i",
                         content=types.Content(role="user", parts=[types.Part(text=text)]),
                         actions=EventActions(state_delta=delta or {}))

        asyncio.run(self.service.append_event(theirs, event("first")))
        with self.assertRaises(StaleSessionError):
            asyncio.run(self.service.append_event(mine, event("lost", {"k": 1})))
        # Racing writers that read the same session: one lands.
        racers = [self.get("ann", "st") for _ in range(4)]

        async def race():
            return await asyncio.gather(
                *(self.service.append_event(r, event(f"racer {i}")) for i, r in enumerate(racers)),
                return_exceptions=True)
        outcomes = asyncio.run(race())
        self.assertEqual(sum(isinstance(o, Event) for o in outcomes), 1, outcomes)
        self.assertTrue(all(isinstance(o, (Event, StaleSessionError)) for o in outcomes), outcomes)
        landed = next(o for o in outcomes if isinstance(o, Event)).content.parts[0].text
        fresh = self.get("ann", "st")
        self.assertEqual([e.content.parts[0].text for e in fresh.events], ["first", landed])
        self.assertNotIn("k", fresh.state)
        # Read again, it writes; a partial event is never stored.
        asyncio.run(self.service.append_event(fresh, event("second", {"k": 1})))
        partial = event("partial")
        partial.partial = True
        asyncio.run(self.service.append_event(fresh, partial))
        again = self.get("ann", "st")
        self.assertEqual([e.content.parts[0].text for e in again.events],
                         ["first", landed, "second"])
        self.assertEqual(again.state["k"], 1)
        # A session that is gone is not found.
        asyncio.run(self.service.delete_session(app_name=self.app, user_id="ann",
                                                session_id="st"))
        with self.assertRaises(SessionNotFoundError):
            asyncio.run(self.service.append_event(again, event("third")))

    def test_a_service_holds_the_paths_of_the_sessions_used_last(self):
        client, statuses = self.recording_client("/history")
        service = SessiondbSessionService(client)

        async def read_all(ids):
            for session_id in ids:
                await service.get_session(app_name=self.app, user_id="ann", session_id=session_id)

        async def create_all(ids):
            for session_id in ids:
                await service.create_session(app_name=self.app, user_id="ann",
                                             session_id=session_id)

        others = [f"other-{i}" for i in range(256)]
        asyncio.run(create_all(["first", *others]))
        asyncio.run(read_all(["first", *others[:255], "first"]))
        self.assertEqual(statuses[-1], ("GET", 304), "held while among the 256 used last")
        asyncio.run(read_all([*others, "first"]))
        self.assertEqual(statuses[-1], ("GET", 200), "forgotten after 256 others were used")

    def test_a_read_after_its_own_writes_transfers_no_events(self):
        client, statuses = self.recording_client("/history")
        service = SessiondbSessionService(client)
        asyncio.run(service.create_session(app_name=self.app, user_id="ann", session_id="h"))
        runner_turn = self.run_turn(service, "ann", "h", "hello")
        second = self.run_turn(service, "ann", "h", "again")
        statuses.clear()
        held = asyncio.run(service.get_session(app_name=self.app, user_id="ann", session_id="h"))
        self.assertEqual(statuses, [("GET", 304)], "the session is as this service wrote it")
        fresh = self.get("ann", "h")
        self.assertEqual(dumped(held.events), dumped(fresh.events),
                         "what it holds is what a read of the session gives")
        self.assertEqual(dumped(held.events[-len(second):]), dumped(second))
        self.assertEqual(len(held.events), 2 * (len(runner_turn) + 1), "with the user's events")
        held.events[0].content.parts[0].text = "changed by the caller"
        # Values inside an event too (ADK's models keep nested JSON as given).
        nested = Event(author="user", invocation_id="i",
                       content=types.Content(role="user", parts=[types.Part(text="nested")]),
                       actions=EventActions(state_delta={"profile": {"name": "ann"}}))
        asyncio.run(service.append_event(held, nested))
        mine = asyncio.run(service.get_session(app_name=self.app, user_id="ann", session_id="h"))
        mine.events[-1].actions.state_delta["profile"]["name"] = "changed by the caller"
        again = asyncio.run(service.get_session(app_name=self.app, user_id="ann", session_id="h"))
        self.assertEqual(dumped(again.events), dumped(self.get("ann", "h").events),
                         "each read has its own")
        self.assertEqual(again.events[-1].actions.state_delta["profile"]["name"], "ann")

        # Another service's event: the next read transfers the path, and stays exact.
        self.run_turn(SessiondbSessionService(self.client), "ann", "h", "elsewhere")
        statuses.clear()
        moved = asyncio.run(service.get_session(app_name=self.app, user_id="ann", session_id="h"))
        self.assertEqual(statuses, [("GET", 200)])
        self.assertEqual(dumped(moved.events), dumped(self.get("ann", "h").events))

    def test_an_event_whose_state_is_refused_stores_nothing(self):
        asyncio.run(self.service.create_session(app_name=self.app, user_id="ann",
                                                session_id="r"))
        session = self.get("ann", "r")
        event = Event(author="user", invocation_id="i",
                      content=types.Content(role="user", parts=[types.Part(text="hi")]),
                      actions=EventActions(state_delta={"turn": 1, "app:ok": 1,
                                                        "user:" + "k" * 300: 1}))
        # The user's state key is refused: the event, its session and app state go with it.
        with self.assertRaises(SessiondbError) as refused:
            asyncio.run(self.service.append_event(session, event))
        self.assertEqual(refused.exception.code, "invalid_request")
        again = self.get("ann", "r")
        self.assertEqual((again.events, again.state), ([], {}))
        # So is a session created with such a state: it is not created at all.
        with self.assertRaises(SessiondbError):
            asyncio.run(self.service.create_session(
                app_name=self.app, user_id="ann", session_id="r2",
                state={"lang": "en", "user:" + "k" * 300: 1}))
        self.assertIsNone(self.get("ann", "r2"))

    def test_a_compacted_session_still_gives_every_event(self):
        asyncio.run(self.service.create_session(app_name=self.app, user_id="ann",
                                                session_id="c"))
        session = self.get("ann", "c")
        for text in ["one", "two", "three"]:
            asyncio.run(self.service.append_event(session, Event(
                author="user", invocation_id="i",
                content=types.Content(role="user", parts=[types.Part(text=text)]))))
        key = session_key(self.app, "ann", "c")
        ids = [e.id for e in session.events]
        self.client.add_compaction(key, "Counted to two.", ids[0], ids[1])
        self.assertTrue(self.client.full_history(key)[0]["id"].startswith("compaction_"))
        for config in [None, GetSessionConfig(after_timestamp=1.0)]:
            self.assertEqual(dumped(self.get("ann", "c", config).events), dumped(session.events))

    def test_messages_other_clients_wrote_read_as_events(self):
        asyncio.run(self.service.create_session(app_name=self.app, user_id="ann",
                                                session_id="o"))
        key = session_key(self.app, "ann", "o")
        self.client.append(key, {"id": "u", "role": "user", "content": "from elsewhere"})
        self.client.append(key, {"id": "a", "role": "assistant",
                                 "parts": [{"type": "text", "text": "an answer"}]})
        events = self.get("ann", "o").events
        self.assertEqual([(e.id, e.author, e.content.role, e.content.parts[0].text)
                          for e in events],
                         [("u", "user", "user", "from elsewhere"),
                          ("a", "model", "model", "an answer")])
        # The runner goes on from them.
        replies = self.run_turn(self.service, "ann", "o", "hi")
        self.assertEqual(replies[-1].content.parts[0].text, "visit 1, shown 5 contents")


if __name__ == "__main__":
    unittest.main()


class MovingInTest(AppTest):
    """Sessions of ADK's own SqliteSessionService file, copied into sessiondb."""

    def source(self) -> SqliteSessionService:
        source = SqliteSessionService(str(pathlib.Path(self.served.data) / f"{self.app}.db"))
        asyncio.run(source.create_session(app_name=self.app, user_id="ann", session_id="a1",
                                          state={"lang": "en"}))
        self.run_turn(source, "ann", "a1", "hello")
        self.run_turn(source, "ann", "a1", "again")
        asyncio.run(source.create_session(app_name=self.app, user_id="bo", session_id="b1"))
        self.run_turn(source, "bo", "b1", "hi")
        asyncio.run(source.create_session(app_name=self.app, user_id="bo", session_id="quiet",
                                          state={"topic": "none yet"}))
        return source

    def sessions(self, service) -> dict:
        async def read():
            listed = await service.list_sessions(app_name=self.app)
            return {(s.user_id, s.id): await service.get_session(
                app_name=self.app, user_id=s.user_id, session_id=s.id) for s in listed.sessions}
        return {k: (dumped(v.events), v.state) for k, v in asyncio.run(read()).items()}

    def test_an_apps_sessions_are_copied_with_events_and_every_scope_of_state(self):
        source = self.source()
        copied = asyncio.run(copy_sessions(source, self.service, app_name=self.app))
        self.assertEqual(sorted(copied.copied), [("ann", "a1"), ("bo", "b1"), ("bo", "quiet")])
        self.assertEqual(copied.skipped, [])
        expected = self.sessions(source)
        self.assertEqual(self.sessions(SessiondbSessionService(self.client)), expected)
        self.assertEqual(expected[("ann", "a1")][1]["user:visits"], 2)
        self.assertEqual(len(expected[("ann", "a1")][0]), 8)

        again = asyncio.run(copy_sessions(source, self.service, app_name=self.app, user_id="bo"))
        self.assertEqual((again.copied, sorted(again.skipped)), ([], [("bo", "b1"), ("bo", "quiet")]))
        # A runner goes on from the copy: the user's and the app's counts carry on.
        turn = self.run_turn(SessiondbSessionService(self.client), "ann", "a1", "third")
        self.assertEqual(turn[-1].content.parts[0].text, "visit 3, shown 11 contents")
        self.assertEqual(self.get("ann", "a1").state["app:total"], 4)

    def test_a_second_copy_after_the_source_went_on_writes_only_the_new_events(self):
        source = self.source()
        asyncio.run(copy_sessions(source, self.service, app_name=self.app))
        first = [e.id for e in self.get("ann", "a1").events]
        self.run_turn(source, "ann", "a1", "third")
        asyncio.run(self.service.create_session(app_name=self.app, user_id="cy",
                                                session_id="c1"))
        asyncio.run(source.create_session(app_name=self.app, user_id="cy", session_id="c1"))
        self.run_turn(source, "cy", "c1", "late")
        again = asyncio.run(copy_sessions(source, self.service, app_name=self.app))
        self.assertEqual(sorted(again.copied), [("ann", "a1"), ("cy", "c1")])
        self.assertEqual(sorted(again.skipped), [("bo", "b1"), ("bo", "quiet")])
        self.assertEqual(self.sessions(SessiondbSessionService(self.client)),
                         self.sessions(source))
        self.assertEqual([e.id for e in self.get("ann", "a1").events][:len(first)], first)
        # The agent goes on here; copied again, the session holds the source's events and more.
        self.run_turn(self.service, "ann", "a1", "here")
        again = asyncio.run(copy_sessions(source, self.service, app_name=self.app, user_id="ann"))
        self.assertEqual((again.copied, again.skipped), ([], [("ann", "a1")]))

    def test_a_session_held_with_other_events_is_refused_and_left_as_it_was(self):
        source = self.source()
        asyncio.run(self.service.create_session(app_name=self.app, user_id="bo", session_id="b1"))
        self.run_turn(self.service, "bo", "b1", "mine")
        before = self.sessions(self.service)
        with self.assertRaises(AlreadyExistsError) as refused:
            asyncio.run(copy_sessions(source, self.service, app_name=self.app, user_id="bo"))
        self.assertIn("nothing was copied", str(refused.exception))
        self.assertEqual(self.sessions(SessiondbSessionService(self.client)), before)

    def test_a_copy_in_parts_that_another_writer_races_says_what_stays(self):
        source = self.source()
        first_met = self.client._import_first_met
        raced: list[str] = []

        def racing(session_id, *args):
            met = first_met(session_id, *args)
            if not raced:
                raced.append(session_id)
                self.client.append(session_id, {"role": "user", "content": "meanwhile"})
            return met

        self.client._import_first_met = racing
        self.addCleanup(setattr, self.client, "_import_first_met", first_met)
        # A message to a write: the first is stored before the other writer's.
        with unittest.mock.patch.object(sessiondb.client, "COPY_REQUEST_BYTES", 1):
            with self.assertRaises(AlreadyExistsError) as refused:
                asyncio.run(copy_sessions(source, self.service, app_name=self.app, user_id="ann"))
        self.assertIn("the events it wrote before another writer changed the session stay",
                      str(refused.exception))
        held = self.client.full_history(raced[0])
        self.assertEqual([m["content"] for m in held[1:]], ["meanwhile"])


def said(author: str, text: str, at: float) -> Event:
    role = "user" if author == "user" else "model"
    return Event(author=author, invocation_id="i", timestamp=at,
                 content=types.Content(role=role, parts=[types.Part(text=text)]))


class MemoryServiceTest(ServedTest):
    def setUp(self):
        self.app = self.fresh_prefix() + "app"
        self.memory = SessiondbMemoryService(self.client)

    def search(self, user: str, query: str, app: str | None = None) -> list:
        return asyncio.run(self.memory.search_memory(app_name=app or self.app, user_id=user,
                                                     query=query)).memories

    def test_memory_keeps_what_it_is_given_and_finds_it_by_any_word(self):
        start = 1_750_000_000.0
        events = [said("user", "my cat is called Miso", start),
                  said("helper", "Miso is a lovely name for a cat", start + 1),
                  Event(author="helper", invocation_id="i", timestamp=start + 2)]
        session = Session(id="s1", app_name=self.app, user_id="ann", events=events)
        asyncio.run(self.memory.add_session_to_memory(session))
        found = self.search("ann", "what is the name of my cats")
        self.assertEqual(sorted(m.content.parts[0].text for m in found),
                         ["Miso is a lovely name for a cat", "my cat is called Miso"])
        first = next(m for m in found if m.author == "user")
        self.assertEqual(first.id, events[0].id)
        self.assertEqual(first.timestamp, "2025-06-15T15:06:40+00:00")
        self.assertEqual(self.search("ann", "dogs"), [])

        # Added again as it grew: what was kept is not kept twice.
        session.events.append(said("user", "and a dog named Rex", start + 3))
        asyncio.run(self.memory.add_session_to_memory(session))
        self.assertEqual(len(self.search("ann", "cat")), 2)
        self.assertEqual([m.content.parts[0].text for m in self.search("ann", "dog rex")],
                         ["and a dog named Rex"])

        # Events given alone, for another user: each user's memory is their own, per app.
        asyncio.run(self.memory.add_events_to_memory(
            app_name=self.app, user_id="bob", events=[said("user", "my cat is Tom", start)]))
        self.assertEqual([m.content.parts[0].text for m in self.search("bob", "cat")],
                         ["my cat is Tom"])
        self.assertEqual(len(self.search("ann", "cat")), 2)
        self.assertEqual(self.search("ann", "cat", app=self.app + "-other"), [])
        # Forgetting an event deletes it, and adding its session again does not bring it back.
        miso = next(m for m in self.search("ann", "miso") if m.author == "user")
        asyncio.run(self.memory.delete_memory(app_name=self.app, user_id="ann",
                                               memory_id=miso.id))
        self.assertEqual([m.author for m in self.search("ann", "miso")], ["helper"])
        asyncio.run(self.memory.add_session_to_memory(session))
        self.assertEqual([m.author for m in self.search("ann", "miso")], ["helper"])
        self.assertEqual(len(self.search("bob", "cat")), 1)
        # Memory is not among the app's sessions.
        listed = asyncio.run(SessiondbSessionService(self.client).list_sessions(app_name=self.app))
        self.assertEqual(listed.sessions, [])

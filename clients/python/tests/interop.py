"""The Python half of the check that both clients store alike (run by
``crates/sessiondb-cli/tests/clients.rs`` with the TypeScript half, ``test/interop.mjs``, against
one server): ``write URL OUT`` stores a Claude transcript, a session binding, LangGraph store
items (some with embeddings, and their ranking for a query), a LangChain chat history and an ADK
session, and writes what it stored to OUT; ``check URL IN`` reads what the TypeScript half added (described in
IN) and asserts it is all there as written."""

from __future__ import annotations

import asyncio
import json
import sys

from sessiondb import Client
from sessiondb.claude_agent_sdk import SessiondbSessionBinding, SessiondbSessionStore
from sessiondb.langchain import SessiondbChatMessageHistory
from sessiondb.langgraph import SessiondbStore

PREFIX = "interop:"
KEY = {"project_key": "-work-app", "session_id": "5f0c7d1e-2a3b-4c5d-8e9f-0a1b2c3d4e5f"}
TRANSCRIPT = [
    {"type": "user", "uuid": "e1", "parentUuid": None, "timestamp": "2026-12-04T10:00:00.000Z",
     "message": {"role": "user", "content": "Which index does the listing use?"}},
    {"type": "assistant", "uuid": "e2", "parentUuid": "e1", "timestamp": "2026-12-04T10:00:02.000Z",
     "message": {"id": "msg_1", "role": "assistant", "model": "claude-x",
                 "content": [{"type": "text", "text": "The one led by namespace."}]}},
    {"type": "custom-title", "customTitle": "Listing index", "sessionId": KEY["session_id"]},
]
MEMORIES = ["tea at four", "a cat named Io", "rain all week", "jazz on sundays"]
QUERY = "a quiet cat"


def embed(texts: list[str]) -> list[list[float]]:
    """The stand-in model both halves share: vowel counts and the length."""
    return [[float(t.count(v)) for v in "aeiou"] + [float(len(t))] for t in texts]


ITEMS = [(("users", "ada"), "pref", {"theme": "dark", "n": 3}),
         (("users", "ada", "notes"), "tab\there", {"text": "a key that is hashed"}),
         (("team", "x y/z", "ü"), "x" * 300, {"nested": {"level": 2}})]


CHAT = PREFIX + "langchain"
ADK = {"app_name": PREFIX + "adk", "user_id": "ann", "session_id": "s"}


def adk_events() -> list:
    """An ADK conversation with a function call and state, as the Python half writes it."""
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types
    call = types.FunctionCall(id="call_1", name="weather", args={"city": "Rome"})
    return [Event(id="ev1", invocation_id="inv1", author="user", timestamp=1796000000.5,
                  content=types.Content(role="user", parts=[types.Part(text="Weather in Rome?")])),
            Event(id="ev2", invocation_id="inv1", author="helper", timestamp=1796000001.25,
                  content=types.Content(role="model", parts=[types.Part(function_call=call)]),
                  actions=EventActions(state_delta={"asked": "Rome", "user:city": "Rome"}))]


def chat_messages() -> list:
    """A LangChain conversation with a tool call, as both halves build it."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    return [HumanMessage("Weather in Rome?", id="h1"),
            AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Rome"},
                                       "id": "call_1"}],
                      usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}),
            ToolMessage("sunny", tool_call_id="call_1", name="weather")]


def write(client: Client, out: str) -> None:
    store = SessiondbSessionStore(client, prefix=PREFIX)
    asyncio.run(store.append(KEY, TRANSCRIPT))
    binding = asyncio.run(SessiondbSessionBinding(client, prefix=PREFIX).session_id("chat-42"))
    items = SessiondbStore(client, prefix=PREFIX)
    for namespace, key, value in ITEMS:
        items.put(namespace, key, value)
    stored = [items.get(namespace, key) for namespace, key, _ in ITEMS]
    # Memories embedded here are ranked there from the vectors stored with them.
    memories = SessiondbStore(client, prefix=PREFIX,
                              index={"dims": 6, "embed": embed, "fields": ["text"]})
    for i, text in enumerate(MEMORIES):
        memories.put(("memories",), f"m{i}", {"text": text})
    ranked = [[i.key, i.score] for i in memories.search(("memories",), query=QUERY)]
    SessiondbChatMessageHistory(CHAT, client).add_messages(chat_messages())
    from sessiondb.adk import SessiondbSessionService
    service = SessiondbSessionService(client)
    session = asyncio.run(service.create_session(**ADK, state={"lang": "en"}))
    for event in adk_events():
        asyncio.run(service.append_event(session, event))
    with open(out, "w") as file:
        json.dump({"key": KEY, "transcript": TRANSCRIPT, "binding": binding, "query": QUERY,
                   "ranked": ranked,
                   "items": [{"namespace": list(i.namespace), "key": i.key, "value": i.value,
                              "createdAt": i.created_at.isoformat()} for i in stored]}, file)


def check(client: Client, given: str) -> None:
    with open(given) as file:
        added = json.load(file)
    store = SessiondbSessionStore(client, prefix=PREFIX)
    loaded = asyncio.run(store.load(KEY))
    assert loaded == TRANSCRIPT + added["entries"], loaded
    binding = SessiondbSessionBinding(client, prefix=PREFIX)
    assert asyncio.run(binding.session_id("chat-7")) == added["binding"]
    items = SessiondbStore(client, prefix=PREFIX)
    for item in added["items"]:
        got = items.get(tuple(item["namespace"]), item["key"])
        assert got is not None and got.value == item["value"], (item, got)
    found = {(i.namespace, i.key) for i in items.search(("users",), limit=100)}
    assert found == {(("users", "ada"), "pref"), (("users", "ada", "notes"), "tab\there"),
                     (("users", "bob"), "from-typescript")}, found
    from langchain_core.messages import AIMessage
    chat = SessiondbChatMessageHistory(CHAT, client).messages
    assert chat == chat_messages() + [AIMessage("Sunny in Rome.", id="a2")], chat
    from sessiondb.adk import SessiondbSessionService
    session = asyncio.run(SessiondbSessionService(client).get_session(**ADK))
    events = [e.model_dump(mode="json", exclude_none=True) for e in session.events]
    written = [e.model_dump(mode="json", exclude_none=True) for e in adk_events()]
    assert events[:2] == written, events
    answer = session.events[2]
    assert (answer.id, answer.author, answer.content.parts[0].text, answer.timestamp) == (
        added["adk"]["id"], "helper", "Sunny in Rome.", added["adk"]["timestamp"] / 1000), answer
    assert session.state == {"lang": "en", "asked": "Rome", "answered": True,
                             "user:city": "Rome"}, session.state


if __name__ == "__main__":
    action, url, path = sys.argv[1:]
    {"write": write, "check": check}[action](Client(url), path)

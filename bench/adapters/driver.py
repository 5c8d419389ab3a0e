"""One round of the adapter benchmark (run by bench/adapters/run.py inside its virtualenv, with
clients/python on PYTHONPATH): each framework on its own SQLite store and on sessiondb through
the Python client, the same work in an order given on the command line. Prints one JSON line per
store: {store, framework, ms: [...per step], size_bytes}.

    driver.py SERVER_BINARY SCRATCH ORDER TURNS INVOKES
"""
import asyncio
import json
import operator
import os
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Annotated, TypedDict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compare",
                                "drivers"))
from workload import texts  # noqa: E402  (the comparison's text generator)

from agent_framework import FileHistoryProvider, Message  # noqa: E402
from agents import SQLiteSession  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.adk.sessions.sqlite_session_service import SqliteSessionService  # noqa: E402
from google.genai import types  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage  # noqa: E402
from llama_index.core.memory import Memory  # noqa: E402
from llama_index.core.storage.chat_store.sql import SQLAlchemyChatStore  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from strands import Agent as StrandsAgent  # noqa: E402
from strands.models.model import Model as StrandsModel  # noqa: E402
from strands.session import FileSessionManager, RepositorySessionManager  # noqa: E402

from sessiondb import Client  # noqa: E402
from sessiondb.adk import SessiondbSessionService  # noqa: E402
from sessiondb.agent_framework import SessiondbHistoryProvider  # noqa: E402
from sessiondb.llama_index import SessiondbChatStore  # noqa: E402
from sessiondb.langgraph import SessiondbSaver  # noqa: E402
from sessiondb.openai_agents import SessiondbSession  # noqa: E402
from sessiondb.strands import SessiondbSessionRepository  # noqa: E402


def dir_size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


class Server:
    """A release `sessiondb serve` on its own data directory (durable: synchronous=full)."""

    def __init__(self, binary, data):
        self.data = data
        self.process = subprocess.Popen(
            [binary, "--data", data, "serve", "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "SESSIONDB_LOG": "warn"})
        for line in self.process.stderr:
            if line.startswith("sessiondb listening on "):
                self.url = line.strip().removeprefix("sessiondb listening on ")
                break
        else:
            raise RuntimeError("the server exited before listening")

    def stop(self):
        """Graceful stop (the store checkpoints and closes), then the files' size."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        return dir_size(self.data)


def turn_items(texts_iter):
    for user, answer in zip(texts_iter, texts_iter):
        yield [{"role": "user", "content": user},
               {"type": "message", "id": "msg_x", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": answer, "annotations": []}]}]


async def openai_turns(session, turns):
    """What the SDK's runner does with its session each turn: read the history, then store the
    turn's input and output."""
    ms = []
    for items in turn_items(iter(texts(2 * turns))):
        started = time.perf_counter()
        await session.get_items()
        await session.add_items(items)
        ms.append((time.perf_counter() - started) * 1000)
    return ms


async def adk_turns(service, turns):
    """What ADK's runner does with its session service each turn: read the session, then store
    the user's message and the agent's answer (with the state change its `output_key` makes)."""
    await service.create_session(app_name="bench", user_id="u", session_id="bench")
    lines = iter(texts(2 * turns))
    ms = []
    for i in range(turns):
        started = time.perf_counter()
        session = await service.get_session(app_name="bench", user_id="u", session_id="bench")
        question = types.Content(role="user", parts=[types.Part(text=next(lines))])
        await service.append_event(session, Event(author="user", invocation_id=f"i{i}",
                                                  content=question))
        answer = next(lines)
        await service.append_event(session, Event(
            author="assistant", invocation_id=f"i{i}",
            content=types.Content(role="model", parts=[types.Part(text=answer)]),
            actions=EventActions(state_delta={"last_answer": answer})))
        ms.append((time.perf_counter() - started) * 1000)
    return ms


async def llama_index_turns(store, turns):
    """What an agent does with LlamaIndex's `Memory` each turn: read it, then put the user's
    message and the answer (a limit no history here reaches, so nothing is archived)."""
    memory = Memory(session_id="bench", sql_store=store, token_limit=10_000_000,
                    tokenizer_fn=str.split)
    lines = iter(texts(2 * turns))
    ms = []
    for _ in range(turns):
        started = time.perf_counter()
        await memory.aget()
        await memory.aput_messages([ChatMessage(role="user", content=next(lines)),
                                    ChatMessage(role="assistant", content=next(lines))])
        ms.append((time.perf_counter() - started) * 1000)
    return ms


async def agent_framework_turns(provider, turns):
    """What an Agent Framework agent does with its history provider each run: load the
    conversation, then store the run's input and the agent's answer."""
    lines = iter(texts(2 * turns))
    ms = []
    for _ in range(turns):
        started = time.perf_counter()
        await provider.get_messages("bench")
        await provider.save_messages("bench", [Message("user", [next(lines)]),
                                               Message("assistant", [next(lines)],
                                                       author_name="bench")])
        ms.append((time.perf_counter() - started) * 1000)
    return ms


class ScriptedStrandsModel(StrandsModel):
    """A model answering with the given text, streamed as Strands' model providers stream."""

    def __init__(self, answer):
        self.answer = answer

    def update_config(self, **model_config):
        pass

    def get_config(self):
        return {}

    async def structured_output(self, output_model, prompt, system_prompt=None, **kwargs):
        raise NotImplementedError
        yield

    async def stream(self, messages, tool_specs=None, system_prompt=None, **kwargs):
        yield {"messageStart": {"role": "assistant"}}
        yield {"contentBlockStart": {"start": {}}}
        yield {"contentBlockDelta": {"delta": {"text": self.answer}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "end_turn"}}


def strands_turns(manager_of, turns):
    """What a server that keeps no agent between requests does with Strands each turn: a new
    `Agent` restored from its session manager (the default sliding window of 40 messages), then
    the user's message and the answer, each stored as the agent adds it, and the agent synced."""
    lines = iter(texts(2 * turns))
    ms = []
    for _ in range(turns):
        question, answer = next(lines), next(lines)
        started = time.perf_counter()
        agent = StrandsAgent(model=ScriptedStrandsModel(answer), session_manager=manager_of(),
                             callback_handler=None)
        agent(question)
        ms.append((time.perf_counter() - started) * 1000)
    return ms


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    topic: str


def langgraph_invokes(checkpointer, invokes):
    """A two-node graph invoked again and again on one thread, each node adding ~200 characters
    to an accumulating list (the shape of a message history)."""
    lines = iter(texts(2 * invokes))

    def research(state):
        return {"steps": [next(lines)]}

    def write(state):
        return {"steps": [next(lines)]}

    builder = StateGraph(State)
    builder.add_node("research", research)
    builder.add_node("write", write)
    builder.add_edge(START, "research")
    builder.add_edge("research", "write")
    builder.add_edge("write", END)
    app = builder.compile(checkpointer=checkpointer)
    config = {"configurable": {"thread_id": "bench"}}
    ms = []
    for i in range(invokes):
        started = time.perf_counter()
        app.invoke({"topic": "benchmarks", "steps": []} if i == 0 else {"steps": []}, config)
        ms.append((time.perf_counter() - started) * 1000)
    return ms


def emit(store, framework, ms, size_bytes):
    print(json.dumps({"store": store, "framework": framework, "ms": ms,
                      "size_bytes": size_bytes}), flush=True)


def run(store, binary, scratch, turns, invokes):
    folder = os.path.join(scratch, store)
    os.makedirs(folder)
    if store == "own":
        path = os.path.join(folder, "openai.db")
        session = SQLiteSession("bench", path)
        ms = asyncio.run(openai_turns(session, turns))
        session.close()
        emit("own", "openai", ms, sum(os.path.getsize(p) for p in [path, path + "-wal"]
                                         if os.path.exists(p)))
        path = os.path.join(folder, "langgraph.db")
        connection = sqlite3.connect(path, check_same_thread=False)
        ms = langgraph_invokes(SqliteSaver(connection), invokes)
        connection.close()
        emit("own", "langgraph", ms, sum(os.path.getsize(p) for p in [path, path + "-wal"]
                                            if os.path.exists(p)))
        path = os.path.join(folder, "adk.db")
        ms = asyncio.run(adk_turns(SqliteSessionService(path), turns))
        emit("own", "adk", ms, sum(os.path.getsize(p) for p in [path, path + "-wal"]
                                      if os.path.exists(p)))
        path = os.path.join(folder, "llama.db")
        store = SQLAlchemyChatStore(table_name="memory", async_database_uri=f"sqlite+aiosqlite:///{path}")
        ms = asyncio.run(llama_index_turns(store, turns))
        emit("own", "llama-index", ms, sum(os.path.getsize(p) for p in [path, path + "-wal"]
                                              if os.path.exists(p)))
        path = os.path.join(folder, "agent-framework")
        ms = asyncio.run(agent_framework_turns(FileHistoryProvider(path), turns))
        emit("own", "agent-framework", ms, dir_size(path))
        path = os.path.join(folder, "strands")
        ms = strands_turns(lambda: FileSessionManager("bench", storage_dir=path), turns)
        emit("own", "strands", ms, dir_size(path))
        return
    for framework in ["openai", "langgraph", "adk", "llama-index", "agent-framework", "strands"]:
        server = Server(binary, os.path.join(folder, framework))
        with Client(server.url) as client:
            if framework == "openai":
                ms = asyncio.run(openai_turns(SessiondbSession("bench", client), turns))
            elif framework == "adk":
                ms = asyncio.run(adk_turns(SessiondbSessionService(client), turns))
            elif framework == "llama-index":
                ms = asyncio.run(llama_index_turns(SessiondbChatStore(client=client), turns))
            elif framework == "agent-framework":
                ms = asyncio.run(agent_framework_turns(SessiondbHistoryProvider(client), turns))
            elif framework == "strands":
                repository = SessiondbSessionRepository(client)
                ms = strands_turns(lambda: RepositorySessionManager(
                    session_id="bench", session_repository=repository), turns)
            else:
                ms = langgraph_invokes(SessiondbSaver(client), invokes)
        emit("sessiondb", framework, ms, server.stop())


def main():
    binary, scratch, order, turns, invokes = sys.argv[1:6]
    for store in order.split(","):
        run(store, binary, scratch, int(turns), int(invokes))


if __name__ == "__main__":
    main()

"""LangGraph `SqliteSaver`: one message per graph step (a no-op node over `MessagesState`-style
state), the shared workload. Reads are `get_state` (the whole list; the last 50 are a slice);
a branch is an `invoke` from the checkpoint that held N/4 messages; no search, no compaction,
no concurrent writers (one graph thread)."""
import os
import sqlite3
import sys
from typing import Annotated

from typing_extensions import TypedDict
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from workload import (BRANCHES, LAST_READS, REOPENS, WHOLE_READS, dir_bytes, emit, finish,
                      median, scratch_dir, texts, timed)


class State(TypedDict):
    messages: Annotated[list, add_messages]


def graph(path):
    conn = sqlite3.connect(path, check_same_thread=False)
    builder = StateGraph(State)
    builder.add_node("noop", lambda state: {})
    builder.add_edge(START, "noop")
    builder.add_edge("noop", END)
    saver = SqliteSaver(conn)
    return conn, saver, builder.compile(checkpointer=saver)


def main():
    n = int(sys.argv[1])
    d = scratch_dir("compare-langgraph-")
    path = os.path.join(d, "checkpoints.db")
    conn, saver, g = graph(path)
    thread = {"configurable": {"thread_id": "bench"}}
    appends = []
    # The checkpoints holding n//4 + 1 … messages, where the branches start (noted untimed).
    at = {}
    for i, text in enumerate(texts(n)):
        cls = HumanMessage if i % 2 == 0 else AIMessage
        appends.append(timed(lambda: g.invoke({"messages": [cls(content=text, id=f"m{i}")]}, thread))[0])
        if n // 4 <= i < n // 4 + BRANCHES:
            at[i] = saver.get_tuple(thread).config
    emit("append", median(appends))

    def last50():
        assert len(g.get_state(thread).values["messages"][-50:]) == 50
    emit("last50", median([timed(last50)[0] for _ in range(LAST_READS // 10)]))

    def whole():
        assert len(g.get_state(thread).values["messages"]) >= n
    emit("whole", median([timed(whole)[0] for _ in range(WHOLE_READS)]))
    branches = []
    for k in range(BRANCHES):
        message = HumanMessage(content="forked question", id=f"fork{k}")
        branches.append(timed(lambda: g.invoke({"messages": [message]}, at[n // 4 + k]))[0])
    emit("branch", median(branches))

    def branch_read():
        # The thread's latest checkpoint is the last fork: m0 … m(n/4 + 19), fork19.
        assert len(g.get_state(thread).values["messages"]) == n // 4 + BRANCHES + 1
    emit("branch_read", median([timed(branch_read)[0] for _ in range(WHOLE_READS)]))
    conn.close()
    reopens = []
    for _ in range(REOPENS):
        def reopen():
            c, _, g2 = graph(path)
            assert len(g2.get_state(thread).values["messages"][-50:]) == 50
            return c
        ms, c = timed(reopen)
        reopens.append(ms)
        c.close()
    emit("reopen_last50", median(reopens))
    finish(dir_bytes(d), "SQLite WAL (set by SqliteSaver), synchronous=FULL (Python sqlite3 default), commits per checkpoint write")


main()

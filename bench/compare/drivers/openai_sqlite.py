"""OpenAI Agents SDK `SQLiteSession` on a file: the shared workload. It has no search, branches
or compaction; concurrency is asyncio tasks, each with its own session on the same file."""
import asyncio
import os
import sys

from agents import SQLiteSession

from workload import (CONCURRENT_APPENDS, LAST_READS, REOPENS, WHOLE_READS, dir_bytes, emit,
                      finish, median, scratch_dir, texts, timed_async)


async def concurrent(path, writers):
    per_writer = CONCURRENT_APPENDS // writers
    sessions = [SQLiteSession(f"c{writers}-{w}", path) for w in range(writers)]

    async def writer(w, session):
        for i in range(per_writer):
            await session.add_items([{"role": "user", "content": f"message {i} from writer {w}"}])

    ms, _ = await timed_async(asyncio.gather(*(writer(w, s) for w, s in enumerate(sessions))))
    for s in sessions:
        s.close()
    return ms / (per_writer * writers)


async def main():
    n = int(sys.argv[1])
    writers = [int(w) for w in sys.argv[2].split(",")] if len(sys.argv) > 2 else [8, 32]
    d = scratch_dir("compare-openai-")
    path = os.path.join(d, "sessions.db")
    session = SQLiteSession("bench", path)
    appends = []
    for i, text in enumerate(texts(n)):
        item = {"role": "user" if i % 2 == 0 else "assistant", "content": text}
        appends.append((await timed_async(session.add_items([item])))[0])
    emit("append", median(appends))
    last = [(await timed_async(session.get_items(limit=50)))[0] for _ in range(LAST_READS)]
    emit("last50", median(last))
    whole = []
    for _ in range(WHOLE_READS):
        ms, items = await timed_async(session.get_items())
        assert len(items) == n
        whole.append(ms)
    emit("whole", median(whole))
    session.close()
    reopens = []
    for _ in range(REOPENS):
        async def reopen():
            s = SQLiteSession("bench", path)
            items = await s.get_items(limit=50)
            assert len(items) == 50
            return s
        ms, s = await timed_async(reopen())
        reopens.append(ms)
        s.close()
    emit("reopen_last50", median(reopens))
    finish(dir_bytes(d), "SQLite WAL, synchronous=FULL (Python sqlite3 default), one commit per add_items")
    # Concurrent writers get a file of their own, so the size above is the conversation's.
    other = os.path.join(scratch_dir("compare-openai-"), "concurrent.db")
    for w in writers:
        emit(f"concurrent{w}", await concurrent(other, w))


asyncio.run(main())

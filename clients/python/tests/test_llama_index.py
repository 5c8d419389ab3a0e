"""LlamaIndex's chat store on a real server, driven by LlamaIndex's own Memory."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import sqlite3
import time
import unittest

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
from llama_index.core.memory import ChatMemoryBuffer, Memory
from llama_index.core.storage.chat_store import SimpleChatStore
from llama_index.core.storage.chat_store.base_db import MessageStatus
from llama_index.core.storage.chat_store.sql import SQLAlchemyChatStore
from served import ServedTest

from sessiondb import SessiondbError
from sessiondb.llama_index import (
    SessiondbBaseChatStore,
    SessiondbChatStore,
    copy_chat_store,
    session_of,
)

ACTIVE, ARCHIVED = MessageStatus.ACTIVE, MessageStatus.ARCHIVED
YEAR_NS = 365 * 86_400 * 10**9


def words(text: str) -> list:
    """A tokenizer that needs no download: one token per word."""
    return text.split()


def texts(messages: list[ChatMessage]) -> list[str]:
    return [m.content for m in messages]


class ChatStoreTest(ServedTest):
    def setUp(self):
        self.store = SessiondbChatStore(client=self.client)
        self.key = self.fresh_prefix() + "chat"

    def memory(self, token_limit: int = 1000) -> Memory:
        return Memory(session_id=self.key, sql_store=SessiondbChatStore(client=self.client),
                      token_limit=token_limit, tokenizer_fn=words, token_flush_size=4,
                      chat_history_token_ratio=0.5)

    def test_a_memory_is_read_back_by_another_process(self):
        memory = self.memory()
        asyncio.run(memory.aput_messages([
            ChatMessage(role="user", content="What is the capital of France?"),
            ChatMessage(role="assistant", content="Paris.",
                        additional_kwargs={"tool_calls": []}),
        ]))
        again = self.memory()
        read = asyncio.run(again.aget())
        self.assertEqual([(m.role, m.content) for m in read],
                         [(MessageRole.USER, "What is the capital of France?"),
                          (MessageRole.ASSISTANT, "Paris.")])
        self.assertEqual(read[1].additional_kwargs, {"tool_calls": []})
        # Other clients read ordinary messages, and search finds them.
        stored = self.client.full_history(session_of(self.key))
        self.assertEqual([(m["role"], m["content"]) for m in stored],
                         [("user", "What is the capital of France?"), ("assistant", "Paris.")])
        self.assertEqual(len(self.client.search(session_of(self.key), "capital")), 1)
        self.assertIn(self.key, asyncio.run(self.store.get_keys()))

    def test_memory_archives_what_passes_its_limit_and_sessiondb_keeps_it(self):
        memory = self.memory(token_limit=40)
        for turn in range(8):
            asyncio.run(memory.aput(ChatMessage(role="user", content=f"question {turn} " * 3)))
            asyncio.run(memory.aput(ChatMessage(role="assistant", content=f"answer {turn} " * 3)))
        active = asyncio.run(self.store.get_messages(self.key, ACTIVE))
        archived = asyncio.run(self.store.get_messages(self.key, ARCHIVED))
        self.assertGreater(len(archived), 0)
        self.assertLessEqual(sum(len(words(m.content)) for m in active), 20)
        self.assertEqual(texts(archived + active),
                         [f"{kind} {turn} " * 3 for turn in range(8)
                          for kind in ("question", "answer")])
        self.assertEqual(texts(asyncio.run(memory.aget())), texts(active))
        self.assertEqual(len(self.client.full_history(session_of(self.key))), 16)

    def test_the_store_interface(self):
        store, key = self.store, self.key
        run = asyncio.run
        self.assertEqual(run(store.get_messages(key)), [])
        self.assertEqual(run(store.count_messages(key)), 0)
        run(store.add_messages(key, [ChatMessage(role="user", content=f"m{i}") for i in range(6)]))
        run(store.add_message(key, ChatMessage(role="assistant", content="old"), ARCHIVED))
        self.assertEqual(run(store.count_messages(key)), 6)
        self.assertEqual(run(store.count_messages(key, None)), 7)
        self.assertEqual(texts(run(store.get_messages(key, limit=2, offset=1))), ["m1", "m2"])
        self.assertEqual(texts(run(store.get_messages(key, ARCHIVED))), ["old"])
        self.assertEqual(texts(run(store.archive_oldest_messages(key, 2))), ["m0", "m1"])
        self.assertEqual(texts(run(store.get_messages(key, ARCHIVED))), ["m0", "m1", "old"])
        self.assertEqual(texts(run(store.delete_oldest_messages(key, 1))), ["m2"])
        self.assertEqual(run(store.delete_message(key, 0)).content, "m0")
        self.assertIsNone(run(store.delete_message(key, 99)))
        self.assertEqual(texts(run(store.get_messages(key, None))), ["m1", "m3", "m4", "m5", "old"])
        run(store.delete_messages(key, ARCHIVED))
        self.assertEqual(texts(run(store.get_messages(key, None))), ["m3", "m4", "m5"])
        run(store.set_messages(key, [ChatMessage(role="user", content="fresh")]))
        self.assertEqual(texts(run(store.get_messages(key))), ["fresh"])
        run(store.delete_messages(key))
        self.assertEqual(run(store.get_messages(key, None)), [])
        self.assertNotIn(key, run(store.get_keys()))
        # A key used again after its deletion comes back.
        run(store.add_message(key, ChatMessage(role="user", content="again")))
        self.assertIn(key, run(store.get_keys()))

    def test_a_read_after_its_own_write_transfers_nothing(self):
        client, statuses = self.recording_client()
        store, key, run = SessiondbChatStore(client=client), self.key, asyncio.run
        run(store.add_messages(key, [ChatMessage(role="user", content="m0")]))
        self.assertEqual(texts(run(store.get_messages(key))), ["m0"])
        run(store.add_messages(key, [ChatMessage(role="assistant", content="m1")]))
        statuses.clear()
        self.assertEqual(texts(run(store.get_messages(key))), ["m0", "m1"])
        self.assertEqual(run(store.count_messages(key)), 2)
        self.assertEqual(statuses, [("GET", 304)] * 2, "the session is as this store wrote it")

        # Another writer's message: the next read transfers the path.
        other = SessiondbChatStore(client=self.client)
        run(other.add_messages(key, [ChatMessage(role="user", content="elsewhere")]))
        statuses.clear()
        self.assertEqual(texts(run(store.get_messages(key))), ["m0", "m1", "elsewhere"])
        self.assertEqual(statuses, [("GET", 200)])

        # A write elsewhere between a read and this store's add: the add, refused at the
        # version read, lands after it anyway, and the next read transfers the path.
        run(other.add_messages(key, [ChatMessage(role="assistant", content="also elsewhere")]))
        statuses.clear()
        run(store.add_messages(key, [ChatMessage(role="user", content="m2")]))
        self.assertEqual(statuses, [("POST", 409), ("POST", 201)])
        statuses.clear()
        self.assertEqual(texts(run(store.get_messages(key))),
                         ["m0", "m1", "elsewhere", "also elsewhere", "m2"])
        self.assertEqual(statuses, [("GET", 200)])

        # Its own archive, deletion and replacement are read back as they left the path.
        run(store.archive_oldest_messages(key, 1))
        self.assertEqual(texts(run(store.get_messages(key, ARCHIVED))), ["m0"])
        run(store.delete_oldest_messages(key, 1))
        self.assertEqual(texts(run(store.get_messages(key))),
                         ["elsewhere", "also elsewhere", "m2"])
        run(store.set_messages(key, [ChatMessage(role="user", content="fresh")]))
        self.assertEqual(texts(run(store.get_messages(key, None))), ["fresh"])

    def test_messages_of_several_blocks_or_none_come_back_as_they_were(self):
        messages = [ChatMessage(role="user", blocks=[TextBlock(text="a"), TextBlock(text="b")]),
                    ChatMessage(role="assistant", content=None),
                    ChatMessage(role="tool", content="42", additional_kwargs={"name": "calc"})]
        asyncio.run(self.store.add_messages(self.key, messages))
        read = asyncio.run(self.store.get_messages(self.key))
        self.assertEqual([m.model_dump(mode="json") for m in read],
                         [m.model_dump(mode="json") for m in messages])
        stored = self.client.full_history(session_of(self.key))
        self.assertNotIn("blocks", stored[2]["metadata"]["llamaIndexMessage"],
                         "a single text is stored once, as the message's content")

    def test_a_chat_memory_buffer_on_the_base_chat_store(self):
        def buffer(token_limit: int = 1000) -> ChatMemoryBuffer:
            return ChatMemoryBuffer.from_defaults(
                token_limit=token_limit, tokenizer_fn=words, chat_store_key=self.key,
                chat_store=SessiondbBaseChatStore(client=self.client))

        memory = buffer()
        for i in range(4):
            memory.put(ChatMessage(role="user", content=f"question {i}"))
            memory.put(ChatMessage(role="assistant", content=f"answer {i}"))
        # Another process reads it back; a small window keeps the newest turns.
        self.assertEqual(len(buffer().get_all()), 8)
        self.assertEqual(texts(buffer(token_limit=5).get()), ["question 3", "answer 3"])
        store = SessiondbBaseChatStore(client=self.client)
        self.assertIn(self.key, store.get_keys())
        self.assertEqual(store.delete_last_message(self.key).content, "answer 3")
        self.assertEqual(store.delete_message(self.key, 0).content, "question 0")
        self.assertIsNone(store.delete_message(self.key, 99))
        self.assertEqual(texts(asyncio.run(store.aget_messages(self.key)))[:2],
                         ["answer 0", "question 1"])
        memory.set([ChatMessage(role="user", content="anew")])
        self.assertEqual(texts(store.get_messages(self.key)), ["anew"])
        self.assertEqual(texts(store.delete_messages(self.key)), ["anew"])
        self.assertEqual(store.get_messages(self.key), [])
        self.assertIsNone(store.delete_messages(self.key))
        self.assertNotIn(self.key, store.get_keys())

    def test_messages_other_clients_wrote_read_as_active_messages(self):
        session = session_of(self.key)
        self.client.append(session, {"role": "user", "content": "from elsewhere"})
        self.client.append(session, {"role": "assistant",
                                     "parts": [{"type": "text", "text": "an answer"}]})
        read = asyncio.run(self.store.get_messages(self.key))
        self.assertEqual([(m.role, m.content) for m in read],
                         [(MessageRole.USER, "from elsewhere"),
                          (MessageRole.ASSISTANT, "an answer")])


if __name__ == "__main__":
    unittest.main()


class MovingInTest(ServedTest):
    """Keys of LlamaIndex's own stores (an SQLite file, a SimpleChatStore), copied into
    sessiondb."""

    def test_a_memorys_sqlite_store_is_copied_with_what_it_archived(self):
        prefix = self.fresh_prefix()
        path = pathlib.Path(self.served.data) / f"{self.id()}.db"
        source = SQLAlchemyChatStore(table_name="chats",
                                     async_database_uri=f"sqlite+aiosqlite:///{path}")

        async def fill():
            for key in ("long", "short"):
                memory = Memory(session_id=prefix + key, sql_store=source, token_limit=40,
                                tokenizer_fn=words, token_flush_size=4,
                                chat_history_token_ratio=0.5)
                for turn in range(8 if key == "long" else 1):
                    await memory.aput(ChatMessage(role="user", content=f"question {turn} " * 3))
                    await memory.aput(ChatMessage(role="assistant", content=f"answer {turn}"))
        asyncio.run(fill())

        def held(store, key):
            return {status: asyncio.run(store.get_messages(prefix + key, status=status))
                    for status in (ARCHIVED, ACTIVE)}
        self.assertTrue(held(source, "long")[ARCHIVED], "the memory archived some")
        # Rows a year older than the copy: each message is dated by its row, the session by the
        # first.
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE chats SET timestamp = timestamp - ?", (YEAR_NS,))
            rows = db.execute("SELECT key, status, timestamp FROM chats "
                              "ORDER BY timestamp, id").fetchall()

        target = SessiondbChatStore(client=self.client)
        copied = asyncio.run(copy_chat_store(source, target))
        self.assertEqual(sorted(copied.copied), [prefix + "long", prefix + "short"])
        for key in ("long", "short"):
            self.assertEqual(held(target, key), held(source, key))
            times = [ns // 1_000_000 for status in (ARCHIVED, ACTIVE)
                     for k, s, ns in rows if (k, s) == (prefix + key, status.value)]
            self.assertLess(times[-1], time.time() * 1000 - 300 * 86_400_000)
            session = session_of(prefix + key)
            self.assertEqual([m["createdAt"] for m in self.client.full_history(session)], times)
            self.assertEqual(self.client.get_session(session)["createdAt"], times[0])
        again = asyncio.run(copy_chat_store(source, SessiondbChatStore(client=self.client)))
        self.assertEqual((again.copied, sorted(again.skipped)),
                         ([], [prefix + "long", prefix + "short"]))
        # The source's memory went on: a turn that archives nothing comes over by itself; one
        # that archived copied messages changed what the target holds of them, and is refused.
        async def go_on(key, turn):
            memory = Memory(session_id=prefix + key, sql_store=source, token_limit=40,
                            tokenizer_fn=words, token_flush_size=4, chat_history_token_ratio=0.5)
            await memory.aput(ChatMessage(role="user", content=f"question {turn} " * 3))
            await memory.aput(ChatMessage(role="assistant", content=f"answer {turn}"))
        asyncio.run(go_on("short", 1))
        self.assertEqual(asyncio.run(copy_chat_store(source, target, [prefix + "short"])).copied,
                         [prefix + "short"])
        self.assertEqual(held(target, "short"), held(source, "short"))
        archived = len(held(source, "long")[ARCHIVED])
        asyncio.run(go_on("long", 8))
        self.assertGreater(len(held(source, "long")[ARCHIVED]), archived)
        with self.assertRaises(SessiondbError) as raised:
            asyncio.run(copy_chat_store(source, target, [prefix + "long"]))
        self.assertEqual(raised.exception.code, "conflict")
        # A memory goes on from the copy.
        memory = Memory(session_id=prefix + "short", sql_store=target, token_limit=1000,
                        tokenizer_fn=words)
        asyncio.run(memory.aput(ChatMessage(role="user", content="and now?")))
        self.assertEqual(texts(asyncio.run(memory.aget()))[-3:],
                         ["question 1 question 1 question 1 ", "answer 1", "and now?"])

    def test_a_memorys_store_in_memory_is_copied_through_its_interface(self):
        key = self.fresh_prefix() + "in-memory"
        source = SQLAlchemyChatStore(table_name="chats")  # its default: SQLite in memory

        async def fill():
            await source.add_messages(key, [ChatMessage(role="user", content="old")],
                                      status=ARCHIVED)
            await source.add_messages(key, [ChatMessage(role="user", content="hi"),
                                            ChatMessage(role="assistant", content="hello")])
        asyncio.run(fill())
        target = SessiondbChatStore(client=self.client)
        self.assertEqual(asyncio.run(copy_chat_store(source, target)).copied, [key])
        for status, expected in ((ARCHIVED, ["old"]), (ACTIVE, ["hi", "hello"])):
            self.assertEqual(texts(asyncio.run(target.get_messages(key, status=status))),
                             expected)

    def test_a_base_chat_store_is_copied_and_a_taken_key_is_refused(self):
        prefix = self.fresh_prefix()
        source = SimpleChatStore()
        source.set_messages(prefix + "a", [ChatMessage(role="user", content="hi"),
                                           ChatMessage(role="assistant", content="hello")])
        source.set_messages(prefix + "b", [ChatMessage(role="user", content="b's")])
        target = SessiondbBaseChatStore(client=self.client)
        target.set_messages(prefix + "b", [ChatMessage(role="user", content="other")])

        with self.assertRaises(SessiondbError) as raised:
            asyncio.run(copy_chat_store(source, target, [prefix + "b"]))
        self.assertEqual(raised.exception.code, "conflict")
        self.assertEqual(texts(target.get_messages(prefix + "b")), ["other"])
        copied = asyncio.run(copy_chat_store(source, target, [prefix + "a"]))
        self.assertEqual(copied.copied, [prefix + "a"])
        self.assertEqual(target.get_messages(prefix + "a"), source.get_messages(prefix + "a"))
        # The source went on: a second copy writes what came since.
        source.add_message(prefix + "a", ChatMessage(role="user", content="more?"))
        self.assertEqual(asyncio.run(copy_chat_store(source, target, [prefix + "a"])).copied,
                         [prefix + "a"])
        self.assertEqual(target.get_messages(prefix + "a"), source.get_messages(prefix + "a"))

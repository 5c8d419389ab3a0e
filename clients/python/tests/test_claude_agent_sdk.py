"""The Claude Agent SDK session store on a real server, checked by the SDK's own conformance
suite and by its store helpers (claude-agent-sdk from PyPI)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import tempfile
import unittest
import uuid
from unittest import mock

import claude_agent_sdk as claude
from claude_agent_sdk.testing import run_session_store_conformance
from served import ServedTest

from sessiondb.claude_agent_sdk import SessiondbSessionBinding, SessiondbSessionStore

SESSION = "4f1c2a9e-7b3d-4c5e-9a8b-1d2e3f4a5b6c"


def transcript(cwd: str) -> list[dict]:
    """A Claude Code transcript: a prompt, a thinking + tool call turn, the tool's result, an
    answer, then a title and a summary entry."""
    common = {"isSidechain": False, "userType": "external", "cwd": cwd, "sessionId": SESSION,
              "version": "2.0.14", "gitBranch": "main"}
    usage = {"input_tokens": 120, "output_tokens": 40, "cache_read_input_tokens": 0}
    return [
        {**common, "parentUuid": None, "type": "user", "uuid": "11111111-0000-4000-8000-000000000001",
         "timestamp": "2026-12-01T10:00:00.000Z",
         "message": {"role": "user", "content": "Why does the tokenizer test fail?"}},
        {**common, "parentUuid": "11111111-0000-4000-8000-000000000001", "type": "assistant",
         "uuid": "11111111-0000-4000-8000-000000000002", "timestamp": "2026-12-01T10:00:03.000Z",
         "requestId": "req_1",
         "message": {"id": "msg_01", "type": "message", "role": "assistant",
                     "model": "claude-sonnet-4-5", "stop_reason": "tool_use", "usage": usage,
                     "content": [{"type": "thinking", "thinking": "Read the test first.",
                                  "signature": "c2lnbmF0dXJl"},
                                 {"type": "tool_use", "id": "toolu_01", "name": "Read",
                                  "input": {"file_path": f"{cwd}/tests/tokenizer.rs"}}]}},
        {**common, "parentUuid": "11111111-0000-4000-8000-000000000002", "type": "user",
         "uuid": "11111111-0000-4000-8000-000000000003", "timestamp": "2026-12-01T10:00:04.000Z",
         "toolUseResult": {"type": "text", "file": {"numLines": 1}},
         "message": {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_01",
              "content": "assert_eq!(tokens(\"naïve café\"), 2);"}]}},
        {**common, "parentUuid": "11111111-0000-4000-8000-000000000003", "type": "assistant",
         "uuid": "11111111-0000-4000-8000-000000000004", "timestamp": "2026-12-01T10:00:09.000Z",
         "requestId": "req_2",
         "message": {"id": "msg_02", "type": "message", "role": "assistant",
                     "model": "claude-sonnet-4-5", "stop_reason": "end_turn", "usage": usage,
                     "content": [{"type": "text",
                                  "text": "The splitter counts the combining diaeresis as a word."}]}},
        {"type": "custom-title", "customTitle": "Tokenizer diaeresis", "sessionId": SESSION},
        {"type": "summary", "summary": "Tokenizer splits combining marks",
         "leafUuid": "11111111-0000-4000-8000-000000000004"},
    ]


def run(coroutine):
    return asyncio.run(coroutine)


class SessionStoreTest(ServedTest):
    def store(self) -> SessiondbSessionStore:
        return SessiondbSessionStore(self.client, prefix=self.fresh_prefix())

    def test_the_sdks_conformance_suite_passes(self):
        run(run_session_store_conformance(self.store))

    def test_entries_round_trip_and_read_as_a_conversation(self):
        store = self.store()
        key = {"project_key": "-repo", "session_id": SESSION}
        entries = transcript("/repo")
        run(store.append(key, entries[:2]))
        run(store.append(key, entries[2:]))
        run(store.append(key, entries[1:3]))  # a retried batch: its uuids are stored once
        self.assertEqual(run(store.load(key)), entries)

        session_id = f"{store.prefix}-repo/{SESSION}"
        stored = list(self.client.history(session_id))
        self.assertEqual([m["role"] for m in stored],
                         ["user", "assistant", "user", "assistant", "custom-title", "summary"])
        self.assertEqual(stored[0]["id"], entries[0]["uuid"])
        self.assertEqual(stored[0]["content"], "Why does the tokenizer test fail?")
        hits = self.client.search(session_id, "diaeresis")
        self.assertEqual([h["id"] for h in hits], [entries[3]["uuid"]])
        self.assertEqual(self.client.get_session(session_id)["userId"], f"{store.prefix}-repo")

    def test_summaries_stay_true_when_appends_interleave(self):
        first = self.store()
        second = SessiondbSessionStore(self.client, prefix=first.prefix)  # another process
        key = {"project_key": "-repo", "session_id": SESSION}
        entries = transcript("/repo")

        def expected(upto: int) -> list[dict]:
            folded = claude.fold_session_summary(None, key, entries[:upto])
            return [{**folded, "mtime": self.client.get_session(
                f"{first.prefix}-repo/{SESSION}")["updatedAt"]}]

        run(first.append(key, entries[:2]))
        self.assertEqual(run(first.list_session_summaries("-repo")), expected(2))
        run(second.append(key, entries[2:3]))  # folds onto what the first stored
        self.assertEqual(run(second.list_session_summaries("-repo")), expected(3))
        run(first.append(key, entries[3:5]))  # its own last summary is stale: folds it all
        self.assertEqual(run(second.list_session_summaries("-repo")), expected(5))
        run(second.append(key, entries[2:6]))  # a retried batch, partly stored before
        self.assertEqual(run(first.list_session_summaries("-repo")), expected(6))
        # A summary left behind by an append (here: one written without the fold) is not
        # listed, and the SDK reads that session with `load` instead.
        self.client.append_batch(f"{first.prefix}-repo/{SESSION}",
                                 [{"role": "user", "content": "typed elsewhere"}])
        self.assertEqual(run(first.list_session_summaries("-repo")), [])
        self.assertEqual(run(first.list_sessions("-repo"))[0]["session_id"], SESSION)
        run(first.append({**key, "subpath": "subagents/agent-1"}, [{"type": "x", "uuid": "s1"}]))
        self.assertEqual(run(first.list_session_summaries("-repo")), [])
        self.assertEqual(run(first.list_session_summaries("-elsewhere")), [])

    def test_bindings_give_every_process_one_session_id_per_conversation(self):
        prefix = self.fresh_prefix()
        bindings = [SessiondbSessionBinding(self.client, prefix=prefix) for _ in range(8)]

        async def bind_all(conversation_id):
            return await asyncio.gather(*(b.session_id(conversation_id) for b in bindings))

        # Eight processes binding one conversation at once agree on its session.
        ids = {conversation: set(run(bind_all(conversation)))
               for conversation in ["chat-1", "chat-2", "tab\there", "x" * 300]}
        self.assertTrue(all(len(bound) == 1 for bound in ids.values()), ids)
        sessions = [bound.pop() for bound in ids.values()]
        self.assertEqual(len(set(sessions)), 4)
        self.assertTrue(all(str(uuid.UUID(s)) == s for s in sessions))
        self.assertEqual(run(bindings[0].session_id("chat-1")), sessions[0])
        self.assertEqual(run(bindings[0].session_id(SESSION)), SESSION, "a UUID is its own id")
        # Stored where the TypeScript client looks: chat-1's SHA-256 begins with ea.
        stored = self.client.get_message(f"{prefix}claude-bindings/ea", "chat-1")
        self.assertEqual(stored["content"], sessions[0])
        # Rebinding (to a fork, say) moves every process to the new session.
        fork = str(uuid.uuid4())
        run(bindings[1].rebind("chat-1", fork))
        self.assertEqual(run(bindings[2].session_id("chat-1")), fork)
        for bad in [("chat-1", "not-a-uuid"), (SESSION, fork), ("", fork)]:
            with self.assertRaises(ValueError):
                run(bindings[0].rebind(*bad))
        with self.assertRaises(ValueError):
            run(bindings[0].session_id(""))

    def test_long_keys_and_odd_characters(self):
        store = self.store()
        keys = [{"project_key": "-" + "very-long-path-" * 20, "session_id": SESSION},
                {"project_key": "a/b", "session_id": "c"},
                {"project_key": "a", "session_id": "b/c"},
                {"project_key": "a", "session_id": "b", "subpath": "c"}]
        for n, key in enumerate(keys):
            run(store.append(key, [{"type": "x", "uuid": f"u{n}", "n": n}]))
        for n, key in enumerate(keys):
            self.assertEqual(run(store.load(key)), [{"type": "x", "uuid": f"u{n}", "n": n}])
        self.assertEqual([s["session_id"] for s in run(store.list_sessions(keys[0]["project_key"]))],
                         [SESSION])
        # "b" has only a subagent's transcript, which listings leave out.
        self.assertEqual([s["session_id"] for s in run(store.list_sessions("a"))], ["b/c"])
        self.assertEqual(run(store.list_subkeys({"project_key": "a", "session_id": "b"})), ["c"])

    def test_the_sdks_store_helpers_read_what_the_cli_wrote(self):
        """A transcript as Claude Code leaves it on disk is imported with the SDK's
        `import_session_to_store`; the SDK's store readers then give what its local readers give
        for the file, and its store mutations (rename, fork, delete) work through sessiondb."""
        with tempfile.TemporaryDirectory() as config, tempfile.TemporaryDirectory() as cwd:
            cwd = os.path.realpath(cwd)
            project = pathlib.Path(config, "projects", claude.project_key_for_directory(cwd))
            project.mkdir(parents=True)
            entries = transcript(cwd)
            (project / f"{SESSION}.jsonl").write_text(
                "".join(json.dumps(e) + "\n" for e in entries))
            with mock.patch.dict(os.environ, {"CLAUDE_CONFIG_DIR": config}):
                local_messages = claude.get_session_messages(SESSION, directory=cwd)
                local_info = claude.get_session_info(SESSION, directory=cwd)
                store = self.store()
                run(claude.import_session_to_store(SESSION, store, directory=cwd))

                from_store = run(claude.get_session_messages_from_store(
                    store, SESSION, directory=cwd))
                self.assertEqual(len(from_store), 4)
                self.assertEqual(from_store, local_messages)
                # Listed from the stored summaries alone: no transcript is loaded.
                with mock.patch.object(store, "load", side_effect=AssertionError("loaded")):
                    listed = run(claude.list_sessions_from_store(store, directory=cwd))
                self.assertEqual([(s.session_id, s.summary) for s in listed],
                                 [(SESSION, local_info.summary)])
                self.assertEqual(listed[0].custom_title, "Tokenizer diaeresis")

                run(claude.rename_session_via_store(store, SESSION, "Renamed", directory=cwd))
                info = run(claude.get_session_info_from_store(store, SESSION, directory=cwd))
                self.assertEqual(info.custom_title, "Renamed")
                with mock.patch.object(store, "load", side_effect=AssertionError("loaded")):
                    listed = run(claude.list_sessions_from_store(store, directory=cwd))
                self.assertEqual([s.custom_title for s in listed], ["Renamed"])

                fork = run(claude.fork_session_via_store(
                    store, SESSION, directory=cwd,
                    up_to_message_id="11111111-0000-4000-8000-000000000002"))
                forked = run(claude.get_session_messages_from_store(
                    store, fork.session_id, directory=cwd))
                self.assertEqual(len(forked), 2)
                self.assertEqual(forked[0].message, local_messages[0].message)

                run(claude.delete_session_via_store(store, SESSION, directory=cwd))
                remaining = run(claude.list_sessions_from_store(store, directory=cwd))
                self.assertEqual([s.session_id for s in remaining], [fork.session_id])


if __name__ == "__main__":
    unittest.main()

"""The HTTP client against a real server."""

from __future__ import annotations

import contextlib
import io
import pathlib
import socket
import ssl
import threading
import time
import unittest
import unittest.mock

from served import Served, ServedTest

import sessiondb.client
from sessiondb import Client, CopyConflict, SessiondbError, SessiondbUnavailable
from sessiondb.client import HeldPath, HeldPaths, RememberedIds, RememberedValues


class ClientTest(ServedTest):
    def test_messages_round_trip_and_page(self):
        c = self.client
        first = c.append("pages", {"role": "user", "content": "hello there"})
        self.assertTrue(first["inserted"])
        again = c.append("pages", {"id": first["message"]["id"], "role": "user", "content": "x"})
        self.assertFalse(again["inserted"], "an existing id is not appended twice")
        c.append_batch("pages", [{"role": "assistant", "content": f"reply {i}"} for i in range(5)])
        page = c.messages("pages", limit=4)
        self.assertEqual([m["content"] for m in page["items"]],
                         ["hello there", "reply 0", "reply 1", "reply 2"])
        rest = c.messages("pages", limit=4, after=page["nextCursor"])
        self.assertEqual([m["content"] for m in rest["items"]], ["reply 3", "reply 4"])
        self.assertEqual(c.full_history("pages"), list(c.history("pages")))
        self.assertEqual(c.full_history("nobody"), [])
        newest = [m["content"] for m in c.history("pages", order="newest")]
        self.assertEqual(newest[0], "reply 4")
        self.assertEqual(len(newest), 6)
        self.assertEqual(c.get_message("pages", first["message"]["id"])["content"], "hello there")
        self.assertEqual(c.get_session("pages")["messageCount"], 6)

    def test_branches_edits_deletes_and_search(self):
        c = self.client
        root = c.append("tree", {"role": "user", "content": "which zebra is fastest"})["message"]
        a = c.append("tree", {"role": "assistant", "content": "first answer"})["message"]
        b = c.append("tree", {"role": "assistant", "content": "second answer"}, parent=root["id"])
        self.assertEqual([m["content"] for m in c.history("tree")],
                         ["which zebra is fastest", "second answer"])
        self.assertEqual([m["content"] for m in c.history("tree", leaf=a["id"])],
                         ["which zebra is fastest", "first answer"])
        c.update_message("tree", b["message"]["id"], content="edited answer")
        self.assertEqual(c.get_message("tree", b["message"]["id"])["content"], "edited answer")
        hits = c.search("tree", "zebra")
        self.assertEqual([h["id"] for h in hits], [root["id"]])
        [hit] = c.search("tree", "Zebras", snippet_words=2)
        self.assertEqual(hit["snippet"], ["…", "zebra", " is…"])
        self.assertEqual(c.search("tree", "which horse"), [])
        [hit] = c.search("tree", "which horse", match="any")
        self.assertEqual(hit["id"], root["id"])
        c.delete_message("tree", b["message"]["id"])
        with self.assertRaises(SessiondbError) as caught:
            c.get_message("tree", b["message"]["id"])
        self.assertEqual((caught.exception.status, caught.exception.code), (404, "not_found"))
        root2 = c.append("tree", {"role": "user", "content": "another root"}, parent=None)
        self.assertEqual([m["content"] for m in c.history("tree")], ["another root"])
        self.assertIsNone(root2["message"].get("parentId"))
        c.clear("tree")
        self.assertEqual(list(c.history("tree")), [])
        self.assertEqual(c.get_session("tree")["messageCount"], 0)

    def test_branches_export_and_whole_message_replacement(self):
        c = self.client
        c.append("tree2", {"id": "q", "role": "user", "content": "question"})
        c.append("tree2", {"id": "r1", "role": "assistant", "content": "one"})
        c.append("tree2", {"id": "r2", "role": "assistant", "content": "two"}, parent="q")
        self.assertEqual([m["id"] for m in c.branches("tree2", "q")], ["r1", "r2"])
        self.assertEqual([(r["id"], r["role"]) for r in c.rows("tree2")],
                         [("q", "user"), ("r2", "assistant")])
        self.assertEqual([r["id"] for r in c.rows("tree2", leaf="r1")], ["q", "r1"])
        self.assertEqual(c.rows("tree2", leaf="r1")[1]["bytes"], len('{"id":"r1","role":"assistant","content":"one"}'))
        c.put_state("tree2", "k", 1)
        lines = list(c.export("tree2"))
        self.assertEqual([(l["message"]["id"], l["parentId"]) for l in lines if "message" in l],
                         [("q", None), ("r1", "q"), ("r2", "q")])
        self.assertEqual([l["state"] for l in lines if "state" in l], [{"key": "k", "value": 1}])
        c.replace_message("tree2", "r1", {"role": "assistant", "content": "one, again"})
        self.assertEqual(c.get_message("tree2", "r1")["content"], "one, again")
        with self.assertRaises(SessiondbError) as caught:
            c.replace_message("tree2", "nope", {"role": "user", "content": "x"})
        self.assertEqual(caught.exception.code, "not_found")
        c.replace_message("tree2", "nope", {"role": "user", "content": "x"}, upsert=True)
        self.assertEqual(c.get_message("tree2", "nope")["content"], "x")

    def test_import_of_an_export_and_deletes_of_many(self):
        c = self.client
        c.append("orig", {"id": "a", "role": "user", "content": "first"})
        c.append("orig", {"id": "b", "role": "assistant", "content": "second"})
        c.append("orig", {"id": "c", "role": "assistant", "content": "other"}, parent="a")
        c.put_state("orig", "k", [1])
        self.assertEqual(c.import_lines("copy", c.export("orig")), {"imported": 4, "skipped": 0})
        copied, original = list(c.export("copy")), list(c.export("orig"))
        self.assertEqual([copied[0]["session"]["id"], original[0]["session"]["id"]], ["copy", "orig"])
        copied[0]["session"]["id"] = "orig"
        self.assertEqual(copied, original, "the copy has the original's lines, its record included")
        self.assertEqual(c.import_lines("copy", c.export("orig")), {"imported": 1, "skipped": 3})
        with self.assertRaises(SessiondbError) as caught:
            c.import_lines("copy2", [{"message": {"id": "x", "role": "user", "content": "x"}},
                                     {"message": {"role": ""}}])
        self.assertEqual(caught.exception.code, "invalid_request")
        self.assertEqual(c.messages("copy2")["items"], [])
        self.assertEqual(c.delete_messages("copy", ["b", "c", "missing"]), 2)
        self.assertEqual([m["id"] for m in c.full_history("copy")], ["a"])

    def test_copy_conversation_writes_what_the_session_lacks_of_a_conversation(self):
        c = self.client
        chat = [{"role": "user", "content": "hi"},
                {"id": "given", "role": "assistant", "content": "hello"},
                {"role": "user", "content": "and then?"}]

        def copy(session_id, messages, record=None):
            # As the adapters compare: by what a message says, whatever its id.
            return c.copy_conversation(
                session_id, messages,
                lambda stored, i: (stored["role"], stored["content"])
                == (messages[i]["role"], messages[i]["content"]), record)

        self.assertFalse(copy("fresh", []))
        self.assertTrue(copy("fresh", chat[:2], {"name": "moved", "userId": "mover"}))
        stored = c.full_history("fresh")
        self.assertEqual([(m["role"], m["content"]) for m in stored],
                         [("user", "hi"), ("assistant", "hello")])
        self.assertTrue(stored[0]["id"].startswith("msg_"))
        self.assertEqual(stored[1]["id"], "given")
        self.assertEqual((c.get_session("fresh")["name"], c.get_session("fresh")["userId"]),
                         ("moved", "mover"))
        # The same conversation again writes nothing.
        version = c.get_session("fresh")["version"]
        self.assertFalse(copy("fresh", chat[:2]))
        self.assertFalse(copy("fresh", chat[:1]), "a conversation the session holds more of")
        self.assertEqual(c.get_session("fresh")["version"], version)
        # The conversation went on: only what came since is written, under the copied leaf.
        self.assertTrue(copy("fresh", chat))
        after = c.full_history("fresh")
        self.assertEqual([m["id"] for m in after[:2]], [m["id"] for m in stored])
        self.assertEqual(after[2]["content"], "and then?")
        self.assertEqual(c.get_session("fresh")["messageCount"], 3)
        # Anything else is refused, nothing written.
        version = c.get_session("fresh")["version"]
        for other in ([{"role": "user", "content": "hello?"}] + chat[1:],
                      chat[:2] + [{"role": "user", "content": "or else?"}]):
            with self.assertRaises(CopyConflict) as caught:
                copy("fresh", other)
            self.assertEqual(caught.exception.code, "conflict")
            self.assertFalse(caught.exception.wrote_before)
        self.assertEqual(c.get_session("fresh")["version"], version)
        # A session that exists without messages takes them all.
        c.create_session("made")
        self.assertTrue(copy("made", chat[:1]))
        self.assertEqual([m["content"] for m in c.full_history("made")], ["hi"])
        # All or nothing.
        for session_id, messages in (("refused", [{"role": "user", "content": "x"}, {"role": ""}]),
                                     ("made", [chat[0], {"role": ""}])):
            with self.assertRaises(SessiondbError) as caught:
                copy(session_id, messages)
            self.assertEqual(caught.exception.code, "invalid_request")
        self.assertEqual(c.get_session("made")["messageCount"], 1)
        with self.assertRaises(SessiondbError) as caught:
            c.get_session("refused")
        self.assertEqual(caught.exception.code, "not_found")

    def test_a_conversation_longer_than_a_request_is_copied_in_several_writes(self):
        served = Served("--max-body-bytes", "65536")
        self.addCleanup(served.stop)
        client = Client(served.url)
        self.addCleanup(client.close)
        imports: list[int] = []
        start = client._start

        def recorded(method, target, headers, data):
            connection, answer = start(method, target, headers, data)
            if target == "/v1/import":
                imports.append(answer.status)
            return connection, answer

        client._start = recorded
        chat = [{"role": ("user", "assistant")[i % 2], "content": f"{i}: " + "x" * 2000}
                for i in range(100)]

        def copy(session_id, messages, **more):
            return client.copy_conversation(
                session_id, messages, lambda stored, i: stored["content"]
                == messages[i]["content"], {"name": "long"}, **more)

        state = [{"state": {"key": "k", "value": 1}}]
        # About 120 KB: refused whole as too large, then taken in halves.
        self.assertTrue(copy("long", chat[:60], also_lines=state))
        self.assertEqual(imports[0], 413)
        self.assertGreaterEqual(imports.count(200), 2)
        stored = client.full_history("long")
        self.assertEqual([m["content"] for m in stored], [m["content"] for m in chat[:60]])
        self.assertEqual(client.get_session("long")["name"], "long")
        self.assertEqual(client.get_state("long", "k"), 1)
        self.assertFalse(copy("long", chat[:60]))
        # The rest of a conversation that went on, again in parts, under the copied leaf.
        self.assertTrue(copy("long", chat))
        after = client.full_history("long")
        self.assertEqual([m["id"] for m in after[:60]], [m["id"] for m in stored])
        self.assertEqual([m["content"] for m in after], [m["content"] for m in chat])
        # A copy longer than COPY_REQUEST_BYTES goes in parts before any is refused.
        imports.clear()
        with unittest.mock.patch.object(sessiondb.client, "COPY_REQUEST_BYTES", 10_000):
            self.assertTrue(copy("parts", chat))
        self.assertEqual(imports, [200] * 25)  # 100 messages of ~2.1 KB, four to a request
        self.assertEqual([m["content"] for m in client.full_history("parts")],
                         [m["content"] for m in chat])
        # Another writer between two parts: the copy stops there, and says the parts stay.
        first_met = client._import_first_met

        def raced(session_id, *args):
            met = first_met(session_id, *args)
            if session_id == "raced" and len(client.full_history("raced")) == 4:
                client.append("raced", {"role": "user", "content": "meanwhile"})
            return met

        client._import_first_met = raced
        with unittest.mock.patch.object(sessiondb.client, "COPY_REQUEST_BYTES", 10_000):
            with self.assertRaises(CopyConflict) as raced_copy:
                copy("raced", chat)
        self.assertTrue(raced_copy.exception.wrote_before)
        self.assertIn("the messages it wrote before stay", str(raced_copy.exception))
        self.assertEqual([m["content"] for m in client.full_history("raced")],
                         [m["content"] for m in chat[:4]] + ["meanwhile"])
        client._import_first_met = first_met
        # A message over the limit is refused as too large, after the writes before it.
        with self.assertRaises(SessiondbError) as caught:
            copy("alone", chat[:1] + [{"role": "user", "content": "y" * 70_000}])
        self.assertEqual(caught.exception.code, "payload_too_large")
        self.assertEqual([m["content"] for m in client.full_history("alone")],
                         [chat[0]["content"]])

    def test_versions_tag_reads_and_condition_appends(self):
        c = self.client
        self.assertEqual(c.versioned_history("vers"), (0, []))
        with self.assertRaises(SessiondbError) as caught:
            c.append("vers", {"id": "a", "role": "user", "content": "x"}, if_version=1)
        self.assertEqual(caught.exception.code, "not_found")
        first = c.append("vers", {"id": "a", "role": "user", "content": "x"})
        v1 = first["version"]
        self.assertEqual(c.get_session("vers")["version"], v1)
        self.assertEqual(c.versioned_history("vers"), (v1, [first["message"]]))
        self.assertIsNone(c.versioned_history("vers", unless_version=v1))
        second = c.append("vers", {"id": "b", "role": "user", "content": "y"}, if_version=v1)
        self.assertGreater(second["version"], v1)
        with self.assertRaises(SessiondbError) as caught:
            c.append_batch("vers", [{"id": "c", "role": "user", "content": "z"}], if_version=v1)
        self.assertEqual(caught.exception.code, "conflict")
        version, messages = c.versioned_history("vers", unless_version=v1)
        self.assertEqual((version, [m["id"] for m in messages]), (second["version"], ["a", "b"]))

    def test_a_held_stored_path_is_read_from_a_position(self):
        c = self.client
        c.append_batch("from", [{"id": i, "role": "user", "content": i} for i in "abcd"])
        path, held = c.held_stored_history("from", None, 1)
        self.assertEqual([m["id"] for m in path], ["b", "c", "d"])
        # Unchanged: parsed again from the position, without a transfer.
        path, again = c.held_stored_history("from", held, 3)
        self.assertEqual(([m["id"] for m in path], again), (["d"], held))
        self.assertEqual(c.held_stored_history("absent", None, 2), ([], None))
        # A compaction before the position: the stored path, not the summary, is what counts.
        c.add_compaction("from", "a and b", "a", "b")
        path, kept = c.held_stored_history("from", held, 2)
        self.assertEqual(([m["id"] for m in path], kept), (["c", "d"], None))
        path, kept = c.held_history("from", None, 1)
        self.assertEqual([m["content"] for m in path], ["c", "d"])

    def test_held_paths_forget_the_least_recently_used_first(self):
        held = HeldPaths(capacity=2)
        paths = {name: HeldPath(1, (b"{}",), name) for name in "abc"}
        held.put("a", paths["a"])
        held.put("b", paths["b"])
        self.assertIs(held.get("a"), paths["a"])
        held.put("c", paths["c"])
        self.assertEqual([held.get(n) for n in "abc"], [paths["a"], None, paths["c"]])
        self.assertIs(held.pop("a"), paths["a"])
        self.assertIsNone(held.get("a"))
        held.put("c", None)
        self.assertIsNone(held.get("c"))

    def test_what_adapters_remember_to_skip_requests_stays_bounded(self):
        with unittest.mock.patch("sessiondb.client.REMEMBERED", 3):
            ids, values = RememberedIds(), RememberedValues()
            for i in range(3):
                ids.add(i)
                values[i] = str(i)
            ids.add(2)
            values[2] = "again"
            self.assertEqual((ids, values), ({0, 1, 2}, {0: "0", 1: "1", 2: "again"}))
            ids.add(3)
            values[3] = "3"
            self.assertEqual((ids, values), ({3}, {3: "3"}))

    def test_writes_conditioned_on_the_leaf(self):
        c = self.client
        with self.assertRaises(SessiondbError) as caught:
            c.append("cond", {"id": "a", "role": "user", "content": "x"}, if_leaf=None)
        self.assertEqual(caught.exception.code, "not_found")
        c.create_session("cond")
        c.append("cond", {"id": "a", "role": "user", "content": "x"}, if_leaf=None)
        c.append_batch("cond", [{"id": "b", "role": "assistant", "content": "y"}], if_leaf="a")
        for write in [
                lambda: c.append("cond", {"id": "c", "role": "user", "content": "z"}, if_leaf="a"),
                lambda: c.append_batch("cond", [{"id": "c", "role": "user", "content": "z"}],
                                       if_leaf=None),
                lambda: c.import_lines("cond", [{"state": {"key": "k", "value": 1}}],
                                       if_leaf="a")]:
            with self.assertRaises(SessiondbError) as caught:
                write()
            self.assertEqual(caught.exception.code, "conflict")
        self.assertEqual([m["id"] for m in c.full_history("cond")], ["a", "b"])
        self.assertEqual(c.all_state("cond"), {})
        c.import_lines("cond", [{"state": {"key": "k", "value": 1}}], if_leaf="b")
        self.assertEqual(c.all_state("cond"), {"k": 1})
        # Several sessions in one write: all parts, or none when one is refused.
        other = {"session_id": "cond-other", "lines": [{"state": {"key": "n", "value": 2}}]}
        with self.assertRaises(SessiondbError) as caught:
            c.import_together([other, {"session_id": "cond", "if_leaf": "a",
                                       "lines": [{"state": {"key": "k", "value": 3}}]}])
        self.assertEqual(caught.exception.code, "conflict")
        self.assertEqual(c.all_state("cond-other"), {})
        answer = c.import_together([other, {"session_id": "cond", "if_leaf": "b", "lines": [
            {"message": {"id": "c", "role": "user", "content": "z"}, "parentId": "b"}]}])
        self.assertEqual(answer, {"imported": 2, "skipped": 0, "parts": [
            {"sessionId": "cond-other", "imported": 1, "skipped": 0,
             "version": c.get_session("cond-other")["version"]},
            {"sessionId": "cond", "imported": 1, "skipped": 0,
             "version": c.get_session("cond")["version"]}]})
        self.assertEqual(c.all_state("cond-other"), {"n": 2})
        self.assertEqual(c.get_session("cond")["leafId"], "c")
        # Or its session still at a version: each part answers the version it left.
        at = answer["parts"][1]["version"]
        part = {"session_id": "cond", "if_version": at,
                "lines": [{"state": {"key": "k", "value": 4}}]}
        moved = c.import_together([part])["parts"][0]["version"]
        self.assertGreater(moved, at)
        with self.assertRaises(SessiondbError) as caught:
            c.import_together([part])
        self.assertEqual(caught.exception.code, "conflict")
        self.assertEqual(c.get_state("cond", "k"), 4)
        # A part may instead require its session not to exist yet.
        fresh = {"session_id": "cond-new", "if_absent": True,
                 "lines": [{"session": {"name": "fresh"}}]}
        c.import_together([fresh])
        self.assertEqual(c.get_session("cond-new")["name"], "fresh")
        with self.assertRaises(SessiondbError) as caught:
            c.import_together([fresh])
        self.assertEqual(caught.exception.code, "conflict")

    def test_identifiers_are_single_path_segments(self):
        c = self.client
        for sid in ["a/b", "what?x=1", "100% sure", "日本語 ✓", "..", "#frag"]:
            c.append(sid, {"role": "user", "content": sid})
            self.assertEqual(c.get_session(sid)["id"], sid)
            self.assertEqual([m["content"] for m in c.history(sid)], [sid])
            c.put_state(sid, "k/ey", {"v": sid})
            self.assertEqual(c.get_state(sid, "k/ey"), {"v": sid})

    def test_sessions_state_and_compaction(self):
        c = self.client
        made = c.create_session("listed-1", name="one", userId="ada")
        self.assertEqual(made["name"], "one")
        with self.assertRaises(SessiondbError) as caught:
            c.create_session("listed-1")
        self.assertEqual(caught.exception.code, "conflict")
        for i in range(2, 6):
            c.create_session(f"listed-{i}", userId="ada")
        listed = list(c.list_sessions(user_id="ada", page_size=2))
        self.assertEqual(sorted(s["id"] for s in listed), [f"listed-{i}" for i in range(1, 6)])
        self.assertEqual(c.update_session("listed-1", metadata={"topic": "x"})["metadata"],
                         {"topic": "x"})

        self.assertEqual(c.get_state("listed-1", "missing", default=None), None)
        with self.assertRaises(SessiondbError) as caught:
            c.get_state("listed-1", "missing")
        self.assertEqual(caught.exception.code, "not_found")
        c.put_state("listed-1", "plan", [1, {"step": "two"}])
        self.assertEqual(c.all_state("listed-1"), {"plan": [1, {"step": "two"}]})
        c.delete_state("listed-1", "plan")
        self.assertEqual(c.all_state("listed-1"), {})

        ids = [c.append("listed-1", {"role": "user", "content": f"turn {i}"})["message"]["id"]
               for i in range(4)]
        added = c.add_compaction("listed-1", "turns zero and one", ids[0], ids[1])
        self.assertEqual(c.compactions("listed-1"), [added])
        self.assertEqual([m.get("content") or m["parts"][0]["text"]
                          for m in c.history("listed-1")],
                         ["turns zero and one", "turn 2", "turn 3"])
        c.delete_session("listed-1")
        with self.assertRaises(SessiondbError) as caught:
            c.get_session("listed-1")
        self.assertEqual(caught.exception.status, 404)

    def test_a_users_sessions_are_deleted(self):
        c = self.client
        for i in range(3):
            c.create_session(f"erased-{i}", userId="erased user")
        c.create_session("kept-0", userId="kept user")
        self.assertEqual(c.delete_user_sessions("erased user"), 3)
        self.assertEqual(list(c.list_sessions(user_id="erased user")), [])
        self.assertEqual([s["id"] for s in c.list_sessions(user_id="kept user")], ["kept-0"])
        self.assertEqual(c.delete_user_sessions("erased user"), 0)
        with self.assertRaises(SessiondbError) as caught:
            c.delete_user_sessions("")
        self.assertEqual(caught.exception.code, "invalid_request")

    def test_errors_are_typed(self):
        c = self.client
        with self.assertRaises(SessiondbError) as caught:
            c.messages("any", limit=1000)
        self.assertEqual((caught.exception.status, caught.exception.code),
                         (400, "invalid_request"))
        with self.assertRaises(SessiondbError) as caught:
            c.append("any", {"content": "no role"})
        self.assertEqual(caught.exception.code, "invalid_request")
        self.assertIn("role", caught.exception.message)
        with self.assertRaises(SessiondbError) as caught:
            c.append("x" * 300, {"role": "user", "content": "id too long"})
        self.assertEqual(caught.exception.code, "invalid_request")

    def test_an_unreachable_server_is_its_own_error(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with self.assertRaises(SessiondbUnavailable) as caught:
            with Client(f"http://127.0.0.1:{port}", timeout=5) as unreachable:
                unreachable.get_session("x")
        self.assertEqual(caught.exception.code, "unavailable")
        self.assertIsNone(caught.exception.status)

    def test_a_kept_connection_to_a_restarted_server_is_replaced(self):
        served = Served()
        address = served.url.removeprefix("http://")
        client = Client(served.url)
        self.addCleanup(client.close)
        client.append("restarted", {"role": "user", "content": "before"})
        served.stop(keep_data=True)
        again = Served(like=served, listen=address)
        self.addCleanup(served.stop)
        self.addCleanup(again.stop)
        # The kept connection went with the old process; the read is sent again on a new one.
        self.assertEqual(client.get_session("restarted")["messageCount"], 1)
        self.assertTrue(client.append("restarted", {"role": "user", "content": "after"})["inserted"])

    def test_a_kept_connection_the_server_closed_is_not_used_again(self):
        served = Served("--request-head-timeout", "1s")
        self.addCleanup(served.stop)
        client = Client(served.url)
        self.addCleanup(client.close)
        client.append("idle", {"role": "user", "content": "before"})
        time.sleep(1.5)  # the server closes a connection that sends no request for 1 s
        # An append is never sent twice, so it must not go out on the closed connection.
        self.assertTrue(client.append("idle", {"role": "user", "content": "after"})["inserted"])
        self.assertEqual(client.get_session("idle")["messageCount"], 2)

    def test_https_with_a_trusted_certificate(self):
        certs = pathlib.Path(__file__).resolve().parents[3] / "crates/sessiondb-server/tests/tls"
        served = Served("--tls-cert", str(certs / "first-cert.pem"),
                        "--tls-key", str(certs / "first-key.pem"))
        self.addCleanup(served.stop)
        self.assertTrue(served.url.startswith("https://"), served.url)
        untrusted = Client(served.url, timeout=5)
        self.addCleanup(untrusted.close)
        with self.assertRaises(SessiondbUnavailable):
            untrusted.get_session("tls")
        trusting = ssl.create_default_context(cafile=str(certs / "first-cert.pem"))
        client = Client(served.url, ssl_context=trusting)
        self.addCleanup(client.close)
        client.append("tls", {"role": "user", "content": "over TLS"})
        self.assertEqual([m["content"] for m in client.history("tls")], ["over TLS"])

    def test_api_keys(self):
        served = Served("--api-key", "k1=team-a", "--api-key", "k2=team-b")
        self.addCleanup(served.stop)
        clients = {key: Client(served.url, api_key=key) for key in ["k1", "k2", None, "wrong"]}
        for client in clients.values():
            self.addCleanup(client.close)
        clients["k1"].append("shared-name", {"role": "user", "content": "for team a"})
        self.assertEqual(list(clients["k2"].history("shared-name")), [],
                         "a key never sees another namespace")
        for key in [None, "wrong"]:
            with self.assertRaises(SessiondbError) as caught:
                clients[key].get_session("shared-name")
            self.assertEqual((caught.exception.status, caught.exception.code),
                             (401, "unauthorized"))


    def test_fork_split_usage_and_namespace_search(self):
        c = self.client
        p = self.fresh_prefix()
        c.append_batch(p + "main", [
            {"id": "q", "role": "user", "content": "where is the platypus"},
            {"id": "a", "role": "assistant", "content": "in the river"},
            {"id": "q2", "role": "user", "content": "and the otter"}])
        fork = c.fork(p + "main", "a", id=p + "fork", name="Branch")
        self.assertEqual((fork["id"], fork["name"], fork["parentSessionId"]),
                         (p + "fork", "Branch", p + "main"))
        self.assertEqual([m["content"] for m in c.history(p + "fork")],
                         ["where is the platypus", "in the river"])
        self.assertEqual(c.get_session(p + "main")["messageCount"], 3, "the source stays")
        continued = c.split(p + "main", "Asked about a platypus and an otter.", name="Part 2")
        self.assertEqual(continued["name"], "Part 2")
        self.assertEqual(c.get_session(p + "main")["endReason"], "compaction")
        opening = c.full_history(continued["id"])[0]
        self.assertEqual(opening["parts"], [{
            "type": "text",
            "text": "[Context from previous session]\n\nAsked about a platypus and an otter."}])
        c.add_usage(p + "fork", input_tokens=10, output_tokens=4, cost=0.25)
        used = c.add_usage(p + "fork", input_tokens=5)
        self.assertEqual((used["inputTokens"], used["outputTokens"], used["cost"]), (15, 4, 0.25))
        hits = c.search_all("platypus")
        self.assertEqual({h["sessionId"] for h in hits},
                         {p + "main", p + "fork", continued["id"]})
        def ours(hits):
            return [h for h in hits if h["sessionId"].startswith(p)]
        river = ours(c.search_all("river"))
        self.assertEqual(sorted(h["sessionId"] for h in river), [p + "fork", p + "main"])
        self.assertEqual(ours(c.search_all("river", role="user")), [])
        at = next(h["createdAt"] for h in river if h["sessionId"] == p + "main")
        kept = c.search(p + "main", "river", role="assistant", since=at, until=at + 1)
        self.assertEqual([h["id"] for h in kept], ["a"])
        self.assertEqual(c.search(p + "main", "river", until=at - 10_000), [])

    def test_history_in_model_formats_and_recent_windows(self):
        c = self.client
        p = self.fresh_prefix()
        c.append_batch(p + "s", [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello " * 40},
            {"role": "assistant", "content": "hi"}])
        self.assertEqual(c.model_history(p + "s"), [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello " * 40},
            {"role": "assistant", "content": "hi"}])
        anthropic = c.model_history(p + "s", format="anthropic")
        self.assertEqual(anthropic["system"], "Be brief.")
        self.assertEqual([m["role"] for m in anthropic["messages"]], ["user", "assistant"])
        with self.assertRaises(SessiondbError) as caught:
            c.model_history(p + "s", format="smoke-signals")
        self.assertEqual(caught.exception.code, "invalid_request")
        whole = c.recent_history(p + "s", 1 << 20)
        self.assertFalse(whole["truncated"])
        self.assertEqual(len(whole["messages"]), 3)
        recent = c.recent_history(p + "s", 100)
        self.assertTrue(recent["truncated"])
        self.assertEqual([m["content"] for m in recent["messages"]], ["hi"])
        self.assertEqual(recent["totalBytes"], whole["totalBytes"])
        self.assertGreater(recent["totalBytes"], 240)

    def test_the_change_feed_follows_and_resumes(self):
        p = self.fresh_prefix()
        session = p + "followed"
        stop = threading.Event()

        def keep_appending():
            with Client(self.served.url) as writer:
                n = 0
                while not stop.wait(0.05):
                    writer.append(session, {"role": "user", "content": f"tick {n}"})
                    n += 1

        appender = threading.Thread(target=keep_appending)
        appender.start()
        try:
            feed = self.client.events(session)
            first = next(feed)
            feed.close()
        finally:
            stop.set()
            appender.join()
        self.assertEqual(first["event"], "append")
        self.assertTrue(first["data"]["message"]["content"].startswith("tick "), first)
        self.client.append(session, {"role": "user", "content": "last"})
        # Resumed after the first event: every later append comes, in order, up to the last.
        seen = []
        for event in self.client.events(session, last_event_id=first["id"]):
            seen.append(event["data"]["message"]["content"])
            if seen[-1] == "last":
                break
        written = [m["content"] for m in self.client.history(session)]
        self.assertEqual(seen, written[written.index(first["data"]["message"]["content"]) + 1:])
        reset = next(iter(self.client.events(None, last_event_id="not-an-id")))
        self.assertEqual(reset["event"], "reset")


class ContextTest(ServedTest):
    """Context blocks on a server of their own: templates reach every session of it."""

    def test_blocks_entries_prompt_and_tools(self):
        c = self.client
        soul = c.define_block(None, "soul", "readonly", description="Identity",
                              content="You are a support agent.")
        self.assertEqual(soul["kind"], "readonly")
        c.define_block(None, "playbooks", "skill", description="Playbooks")
        c.put_entry(None, "playbooks", "late-order", "Apologise once, then give the date.",
                    description="Late orders")
        c.define_block("chat", "memory", "writable", max_tokens=50)
        c.append_to_block("chat", "memory", "likes tea")
        self.assertEqual(c.append_to_block("chat", "memory", "has a dog")["content"],
                         "likes tea\nhas a dog")
        self.assertEqual([b["label"] for b in c.blocks("chat")], ["soul", "playbooks", "memory"])
        self.assertEqual([b["label"] for b in c.blocks(None)], ["soul", "playbooks"])
        with self.assertRaises(SessiondbError) as caught:
            c.append_to_block("chat", "memory", "word " * 100)
        self.assertEqual(caught.exception.code, "invalid_request")
        with self.assertRaises(SessiondbError) as caught:
            c.append_to_block("chat", "soul", "x")
        self.assertEqual(caught.exception.code, "conflict")

        c.put_entry("chat", "playbooks", "late-order", "Offer a voucher.")
        self.assertEqual(c.get_entry("chat", "playbooks", "late-order")["content"],
                         "Offer a voucher.")
        self.assertEqual(c.get_entry(None, "playbooks", "late-order")["description"],
                         "Late orders")
        c.put_entry(None, "playbooks", "refund", "Refund within a day.")
        self.assertEqual([(e["key"], e["content"]) for e in c.entries("chat", "playbooks")],
                         [("late-order", "Offer a voucher."), ("refund", "Refund within a day.")])
        with self.assertRaises(SessiondbError) as caught:
            c.entries(None, "soul")
        self.assertEqual(caught.exception.code, "conflict")
        # More entries than a page holds come back whole, in key order.
        c.define_block("pages", "notes", "search")
        for i in reversed(range(130)):
            c.put_entry("pages", "notes", f"n{i:03}", f"note {i}")
        self.assertEqual([e["key"] for e in c.entries("pages", "notes")],
                         [f"n{i:03}" for i in range(130)])
        c.put_entry("chat", "playbooks", "refund", "Refund at once.")
        c.delete_entry("chat", "playbooks", "refund")
        self.assertEqual(c.get_entry("chat", "playbooks", "refund")["content"],
                         "Refund within a day.", "the template's shows again")
        with self.assertRaises(SessiondbError) as caught:
            c.delete_entry("chat", "playbooks", "refund")
        self.assertEqual(caught.exception.code, "not_found")

        frozen = c.prompt("chat")
        self.assertIn("You are a support agent.", frozen["prompt"])
        self.assertIn("likes tea", frozen["prompt"])
        c.append_to_block("chat", "memory", "moved house")
        self.assertEqual(c.prompt("chat"), frozen, "frozen until refreshed")
        self.assertIn("moved house", c.refresh_prompt("chat")["prompt"])

        names = [t["name"] for t in c.tools("chat")]
        self.assertEqual(names, ["set_context", "load_context", "unload_context",
                                 "session_search"])
        self.assertEqual([t["function"]["name"] for t in c.tools("chat", format="openai")], names)
        self.assertEqual([t["name"] for t in c.tools("chat", format="anthropic")], names)
        self.assertEqual(c.run_tool("chat", "load_context",
                                    {"label": "playbooks", "key": "refund"}),
                         "Refund within a day.")
        refused = c.run_tool("chat", "set_context", {"label": "soul", "content": "x"})
        self.assertTrue(refused.startswith("Error: "), refused)
        c.delete_block("chat", "memory")
        with self.assertRaises(SessiondbError) as caught:
            c.delete_block("chat", "memory")
        self.assertEqual(caught.exception.code, "not_found")
        self.assertEqual([b["label"] for b in c.blocks("other")], ["soul", "playbooks"])

        # A templates' part of a dump imports whole, or not at all.
        part = [{"templates": {}}, {"block": {"label": "faq", "kind": "search"}},
                {"entry": {"label": "faq", "key": "hours", "content": "Open at nine."}}]
        with self.assertRaises(SessiondbError) as caught:
            c.import_templates(part + [{"message": {"role": "user", "content": "x"}}])
        self.assertEqual(caught.exception.code, "invalid_request")
        self.assertEqual([b["label"] for b in c.blocks(None)], ["soul", "playbooks"])
        self.assertEqual(c.import_templates(part), {"imported": 2, "skipped": 0})
        self.assertEqual([e["content"] for e in c.entries("other", "faq")], ["Open at nine."])



class ReadmeContextExampleTest(unittest.TestCase):
    """The README's context example, as written, against a server of its own."""

    def test_readme_context_example_runs(self):
        readme = (pathlib.Path(__file__).parents[3] / "README.md").read_text()
        block = readme.split("<!-- python-context-example -->\n```python\n", 1)[1]
        served = Served()
        self.addCleanup(served.stop)
        printed = io.StringIO()
        scope: dict = {}
        with contextlib.redirect_stdout(printed):
            exec(block.split("```", 1)[0].replace("http://127.0.0.1:8787", served.url), scope)
        scope["client"].close()
        self.assertTrue(printed.getvalue().startswith("Written to memory. Usage: "),
                        printed.getvalue())
        self.assertIn("You are a support agent. Be brief.", scope["system"])
        self.assertEqual([t["function"]["name"] for t in scope["tools"]],
                         ["set_context", "session_search"])
        self.assertEqual(scope["messages"][1],
                         {"role": "user", "content": "Email me when it ships, please."})
        with Client(served.url) as client:
            memory = [b for b in client.blocks("chat-7") if b["label"] == "memory"]
        self.assertEqual(memory[0]["content"], "Prefers email.")


if __name__ == "__main__":
    unittest.main()

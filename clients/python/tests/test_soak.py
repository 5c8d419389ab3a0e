"""Many writers at once through the HTTP API, as a fleet of agents uses one store.

Threads race every kind of write and read on a few shared sessions; each thread also owns a
session whose active path and counts must equal a model of it whenever it looks; writes that
read and change one thing (metadata merges, usage counters, block appends) must each keep what
they changed; a change-feed listener must see every acknowledged append of the owned sessions
exactly once, naming the parent it was stored under; no answer is ever a 5xx; and the store's
own check finds nothing wrong afterwards. On PostgreSQL through two servers of one database,
each request going to either. ``SOAK_SECONDS`` (6 by default) sets how long the threads race.
"""

from __future__ import annotations

import collections
import os
import random
import subprocess
import threading
import time
import unittest

from served import ON_POSTGRESQL, Served

from sessiondb import Client, SessiondbError

SECONDS = float(os.environ.get("SOAK_SECONDS", "6"))
THREADS = 6
SHARED = ["shared-0", "shared-1", "shared-2"]
WORDS = "alpha beta gamma delta pizza friday river stone cloud ember".split()


def words(count: int = 8) -> str:
    return " ".join(random.choice(WORDS) for _ in range(count))


class Fleet:
    """The clients (one per server) and what went wrong, shared by the threads."""

    def __init__(self, clients: list[Client]):
        self.clients = clients
        self.problems: list[tuple] = []
        self.lock = threading.Lock()

    def client(self) -> Client:
        return random.choice(self.clients)

    def problem(self, *what) -> None:
        with self.lock:
            self.problems.append(what)

    def attempt(self, call, *args, **kwargs):
        """A racing request: refusals (4xx) are part of the race, anything else is a problem."""
        try:
            return call(*args, **kwargs)
        except SessiondbError as error:
            if error.status is None or error.status >= 500:
                self.problem("answer", getattr(call, "__name__", call), args[:2], repr(error))
            return None


def shared_step(fleet: Fleet, known: list[str]) -> None:
    """One random operation on a shared session."""
    c = fleet.client()
    sid = random.choice(SHARED)
    op = random.random()
    some = random.choice(known) if known else None
    if op < 0.25:
        mid = f"m{random.randrange(50)}"
        parent = some if some and random.random() < 0.3 else None
        kwargs = {} if parent is None else {"parent": parent}
        if fleet.attempt(c.append, sid, {"id": mid, "role": "user", "content": words()},
                         **kwargs):
            known.append(mid)
    elif op < 0.32:
        fleet.attempt(c.append_batch, sid, [{"role": "assistant", "content": words()}
                                            for _ in range(random.randrange(1, 4))])
    elif op < 0.37 and some:
        fleet.attempt(c.replace_message, sid, some, {"id": some, "role": "user",
                                                     "content": words()})
    elif op < 0.42 and some:
        fleet.attempt(c.request, "PATCH", f"/v1/sessions/{sid}/messages/{some}",
                      body={"metadata": {"k": random.randrange(9)}})
    elif op < 0.47 and some:
        fleet.attempt(c.request, "DELETE", f"/v1/sessions/{sid}/messages/{some}")
    elif op < 0.49:
        fleet.attempt(c.request, "DELETE", f"/v1/sessions/{sid}/messages")
    elif op < 0.50:
        fleet.attempt(c.delete_session, sid)
    elif op < 0.56:
        path = fleet.attempt(lambda: [m["id"] for m in c.history(sid)])
        if path is not None and len(path) != len(set(path)):
            fleet.problem("an id twice on a path", sid, path)
    elif op < 0.60:
        fleet.attempt(c.messages, sid, limit=10, order="desc")
    elif op < 0.64:
        fleet.attempt(c.search, sid, random.choice(WORDS))
    elif op < 0.67:
        rows = fleet.attempt(c.rows, sid)
        if rows and len(rows) >= 3:
            fleet.attempt(c.add_compaction, sid, "summary " + words(3), rows[0]["id"],
                          rows[len(rows) // 2]["id"])
    elif op < 0.71:
        fleet.attempt(c.put_state, sid, f"k{random.randrange(3)}", {"v": random.randrange(99)})
    elif op < 0.74:
        fleet.attempt(c.update_session, sid, name=words(2),
                      metadata={"a": random.randrange(3), "b": None})
    elif op < 0.77 and some:
        fleet.attempt(c.fork, sid, some, id=f"fork-{random.randrange(4)}")
    elif op < 0.80:
        fleet.attempt(c.request, "PUT", f"/v1/sessions/{sid}/context/notes",
                      body={"kind": "writable", "content": words(4)})
    elif op < 0.83:
        fleet.attempt(c.request, "POST", f"/v1/sessions/{sid}/context/notes/append",
                      body={"content": words(3)})
    elif op < 0.86:
        fleet.attempt(c.add_usage, sid, input_tokens=3, output_tokens=4, cost=0.01)
    elif op < 0.90:
        read = fleet.attempt(c.versioned_history, sid)
        if read and read[0]:
            fleet.attempt(c.append_batch, sid, [{"role": "user", "content": words()}],
                          if_version=read[0])
    elif op < 0.93:
        fleet.attempt(lambda: list(c.export(sid)))
    elif op < 0.96 and some:
        fleet.attempt(c.branches, sid, some)
    else:
        fleet.attempt(lambda: list(c.list_sessions()))
    if len(known) > 100:
        del known[:50]


class Owned:
    """A session only one thread writes, and the model of its active path."""

    def __init__(self, sid: str):
        self.sid = sid
        self.path: list[str] = []
        self.acknowledged: dict[str, str | None] = {}  # id → the parent it went under
        self.count = 0

    def step(self, fleet: Fleet) -> bool:
        """One write or check; false once the session differs from the model."""
        c = fleet.client()
        op = random.random()
        if op < 0.55 or len(self.path) < 3:
            mid = f"{self.sid}-{self.count}"
            self.count += 1
            c.append(self.sid, {"id": mid, "role": "user", "content": words()})
            self.acknowledged[mid] = self.path[-1] if self.path else None
            self.path.append(mid)
        elif op < 0.70:
            at = random.randrange(len(self.path) - 1)
            mid = f"{self.sid}-{self.count}"
            self.count += 1
            c.append(self.sid, {"id": mid, "role": "user", "content": words()},
                     parent=self.path[at])
            self.acknowledged[mid] = self.path[at]
            self.path = self.path[:at + 1] + [mid]
        elif op < 0.80:
            victim = random.choice(self.path[:-1])
            c.request("DELETE", f"/v1/sessions/{self.sid}/messages/{victim}")
            self.path.remove(victim)
        elif op < 0.85:
            c.replace_message(self.sid, self.path[-1], {"id": self.path[-1], "role": "assistant",
                                                        "content": "edited " + words(3)})
        else:
            return self.matches(fleet, c)
        return True

    def matches(self, fleet: Fleet, c: Client) -> bool:
        path = [m["id"] for m in c.history(self.sid)]
        session = c.get_session(self.sid)
        if path != self.path:
            fleet.problem("path", self.sid, path[-4:], self.path[-4:], len(path), len(self.path))
            return False
        leaf = self.path[-1] if self.path else None
        if session["messageCount"] != len(self.path) or session["leafId"] != leaf:
            fleet.problem("counts", self.sid, session["messageCount"], len(self.path),
                          session["leafId"], leaf)
            return False
        return True


class FeedListener(threading.Thread):
    """Collects the append events of the owned sessions from the namespace's feed."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.client = Client(url, timeout=120)
        self.appends: list[tuple[str, str, bool, str | None]] = []
        self.resets = 0
        self.failure: Exception | None = None
        self.live = threading.Event()

    def run(self) -> None:
        try:
            self.follow()
        except Exception as error:  # noqa: BLE001 (reported by the test)
            self.failure = error

    def follow(self) -> None:
        # A listener that falls behind the writers (this thread shares the interpreter with
        # them) is told it lagged; it then resumes after the last event it read, which the
        # server still retains (`--feed-retain`), as a client of the feed should.
        last_id = None
        while True:
            for event in self.client.events(None, last_event_id=last_id):
                if event["event"] == "lagged":
                    break
                if event["event"] == "reset":
                    self.resets += 1
                    continue
                last_id = event["id"] or last_id
                data = event["data"]
                if event["event"] != "append":
                    continue
                if data["sessionId"] == "feed-sentinel":
                    self.live.set()
                elif data["sessionId"].startswith("owned-"):
                    self.appends.append((data["sessionId"], data["message"]["id"],
                                         data["inserted"], data["storedParentId"]))

    def wait_until_live(self, client: Client) -> bool:
        """Appends to a session of its own until the feed shows one: from then on it follows."""
        give_up = time.monotonic() + 10
        while not self.live.is_set() and time.monotonic() < give_up:
            client.append("feed-sentinel", {"role": "user", "content": "are you there"})
            self.live.wait(0.05)
        return self.live.is_set()


class SoakTest(unittest.TestCase):
    def setUp(self):
        # Every event stays retained for the listener to resume from (it may lag behind).
        retain = ("--feed-retain", "1000000")
        self.servers = [Served(*retain)]
        if ON_POSTGRESQL:
            self.servers.append(Served(*retain, database=self.servers[0].database))
        self.clients = [Client(server.url) for server in self.servers]

    def tearDown(self):
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.stop()

    def test_a_fleet_of_racing_writers_loses_nothing(self):
        fleet = Fleet(self.clients)
        listener = FeedListener(self.servers[0].url)
        listener.start()
        self.assertTrue(listener.wait_until_live(self.clients[-1]))
        owned = [Owned(f"owned-{i}") for i in range(THREADS)]
        deadline = time.monotonic() + SECONDS

        def race(mine: Owned) -> None:
            known: list[str] = []
            try:
                while time.monotonic() < deadline:
                    shared_step(fleet, known)
                    if not mine.step(fleet):
                        return
                mine.matches(fleet, fleet.client())
            except Exception as error:  # an owned session's write must never fail
                fleet.problem("owned", mine.sid, repr(error))

        threads = [threading.Thread(target=race, args=(mine,)) for mine in owned]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(fleet.problems, [])
        self.assertGreater(sum(len(o.acknowledged) for o in owned), 10 * THREADS)

        # Every acknowledged append is published once, where it was stored.
        wanted = {(o.sid, mid): parent for o in owned for mid, parent in o.acknowledged.items()}
        give_up = time.monotonic() + 20
        while len(listener.appends) < len(wanted) and time.monotonic() < give_up:
            time.sleep(0.1)
        self.assertIsNone(listener.failure)
        self.assertEqual(listener.resets, 0)
        published = collections.Counter((sid, mid) for sid, mid, _, _ in listener.appends)
        self.assertEqual({key: count for key, count in published.items() if count != 1}, {})
        self.assertEqual({(sid, mid): parent for sid, mid, inserted, parent in listener.appends
                          if inserted}, wanted)

        self.read_modify_writes_keep_every_change()
        self.store_checks_clean()

    def read_modify_writes_keep_every_change(self):
        per_thread = 15
        self.clients[0].create_session("merged")
        self.clients[0].request("PUT", "/v1/sessions/merged/context/notes",
                                body={"kind": "writable", "content": ""})

        def change(t: int) -> None:
            for i in range(per_thread):
                c = self.clients[(t + i) % len(self.clients)]
                c.update_session("merged", metadata={f"k{t}_{i}": i})
                c.add_usage("merged", input_tokens=1, output_tokens=2, cost=0.25)
                c.request("POST", "/v1/sessions/merged/context/notes/append",
                          body={"content": f"line {t}.{i}"})

        threads = [threading.Thread(target=change, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        changes = THREADS * per_thread
        session = self.clients[-1].get_session("merged")
        self.assertEqual(len(session["metadata"]), changes)
        self.assertEqual((session["inputTokens"], session["outputTokens"], session["cost"]),
                         (changes, 2 * changes, 0.25 * changes))
        notes = [b for b in self.clients[-1].blocks("merged") if b["label"] == "notes"][0]
        self.assertEqual(sorted(notes["content"].splitlines()),
                         sorted(f"line {t}.{i}" for t in range(THREADS) for i in range(per_thread)))

    def store_checks_clean(self):
        binary = os.environ["SESSIONDB_BIN"]
        first = self.servers[0]
        if first.database:
            command = [binary, "check", "--database", first.database]
        else:
            # The embedded store is checked closed: its server stops first.
            first.stop(keep_data=True)
            command = [binary, "--data", first.data, "check"]
        checked = subprocess.run(command, capture_output=True, text=True)
        self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
        self.assertEqual(checked.stdout.strip(), '{"problems":[]}')


if __name__ == "__main__":
    unittest.main()

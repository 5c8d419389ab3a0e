"""A real `sessiondb serve` on a free loopback port with a data directory of its own.

The binary is named by SESSIONDB_BIN (the Rust test that runs this suite passes the one cargo
built); the tests fail, rather than skip, without it. With SESSIONDB_TEST_DATABASES (PostgreSQL
connection strings, comma-separated) each server takes a database of its own from that list and
serves from it instead of the embedded store: the whole suite then runs on PostgreSQL.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import tempfile
import threading
import unittest

from sessiondb import Client


ON_POSTGRESQL = "SESSIONDB_TEST_DATABASES" in os.environ
_DATABASES = [url for url in os.environ.get("SESSIONDB_TEST_DATABASES", "").split(",") if url]


class Served:
    """A server; ``like`` another (stopped with ``keep_data``) serves that one's storage again;
    ``database`` serves that PostgreSQL database (beside other servers of it)."""

    def __init__(self, *args: str, like: Served | None = None, database: str | None = None,
                 listen: str = "127.0.0.1:0"):
        binary = os.environ.get("SESSIONDB_BIN")
        if not binary:
            raise RuntimeError("SESSIONDB_BIN must name the sessiondb binary to test against")
        self._tmp = None
        if like is not None:
            self.data, self.database = like.data, like.database
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="sessiondb-py-")
            self.data = self._tmp.name
            self.database = database
            if ON_POSTGRESQL and database is None:
                if not _DATABASES:
                    raise RuntimeError("SESSIONDB_TEST_DATABASES has no database left")
                self.database = _DATABASES.pop(0)
        storage = ["--database", self.database] if self.database else []
        self.process = subprocess.Popen(
            [binary, "--data", self.data, "serve", "--listen", listen, *storage, *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "SESSIONDB_LOG": "warn"})
        for line in self.process.stderr:
            if line.startswith("sessiondb listening on "):
                self.url = line.strip().removeprefix("sessiondb listening on ")
                break
        else:
            raise RuntimeError("the server exited before listening")
        # Keep draining stderr so the server never blocks on a full pipe.
        threading.Thread(target=self.process.stderr.read, daemon=True).start()

    def stop(self, keep_data: bool = False) -> None:
        self.process.kill()
        self.process.wait()
        self.process.stderr.close()
        if self._tmp is not None and not keep_data:
            self._tmp.cleanup()


class ServedTest(unittest.TestCase):
    """Tests sharing one server, and a client of it, for the whole class; ``fresh_prefix``
    names a set of sessions no other test of the class uses."""

    @classmethod
    def setUpClass(cls):
        cls.served = Served()
        cls.client = Client(cls.served.url)
        cls._prefixes = itertools.count()

    def fresh_prefix(self) -> str:
        return f"{type(self).__name__}-{next(self._prefixes)}:"

    def recording_client(self, only: str = "") -> tuple[Client, list[tuple[str, int]]]:
        """A client of the server of its own, and the list in which it records the method and
        status of each answer to a request whose target holds ``only``."""
        client = Client(self.served.url)
        self.addCleanup(client.close)
        answers: list[tuple[str, int]] = []
        start = client._start

        def recorded(method, target, headers, data):
            connection, answer = start(method, target, headers, data)
            if only in target:
                answers.append((method, answer.status))
            return connection, answer

        client._start = recorded
        return client, answers

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.served.stop()

"""A real `sessiondb serve` on a free loopback port with a data directory of its own.

The binary is named by SESSIONDB_BIN (the Rust test that runs this suite passes the one cargo
built); the tests fail, rather than skip, without it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import unittest

from sessiondb import Client


class Served:
    def __init__(self, *args: str, data: str | None = None, listen: str = "127.0.0.1:0"):
        binary = os.environ.get("SESSIONDB_BIN")
        if not binary:
            raise RuntimeError("SESSIONDB_BIN must name the sessiondb binary to test against")
        self._tmp = None
        if data is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sessiondb-py-")
            data = self._tmp.name
        self.data = data
        self.process = subprocess.Popen(
            [binary, "--data", data, "serve", "--listen", listen, *args],
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
    """Tests sharing one server, and a client of it, for the whole class."""

    @classmethod
    def setUpClass(cls):
        cls.served = Served()
        cls.client = Client(cls.served.url)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.served.stop()

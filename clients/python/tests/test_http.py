"""The client's HTTP/1.1 against a local socket that answers with given bytes: the framings an
HTTP server may use, and answers that are cut short or are not HTTP."""

from __future__ import annotations

import socket
import threading
import unittest

from sessiondb import Client, SessiondbError, SessiondbUnavailable


class CannedServer:
    """Accepts connections and answers each request (read up to its blank line, and a body of
    its content-length) with the next of ``answers``; ``None`` closes the connection instead,
    as does an answer that says ``connection: close``, after it is sent."""

    def __init__(self, answers: list[bytes | None]):
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while self.answers:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            reader = connection.makefile("rb")
            while self.answers:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        break
                    head += line
                if not head:
                    break
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")]
                self.requests.append(head + reader.read(length[0] if length else 0))
                answer = self.answers.pop(0)
                if answer is None:
                    break
                connection.sendall(answer)
                if b"connection: close" in answer.lower():
                    break
            reader.close()
            connection.close()


def json_answer(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " \
        + str(len(body)).encode() + b"\r\n" + b"".join(e + b"\r\n" for e in extra) + b"\r\n" + body


class HttpTest(unittest.TestCase):
    def serve(self, answers: list[bytes | None]) -> CannedServer:
        server = CannedServer(answers)
        self.addCleanup(server.close)
        return server

    def client(self, server: CannedServer) -> Client:
        client = Client(server.url, timeout=5)
        self.addCleanup(client.close)
        return client

    def test_lengths_chunks_and_answers_that_end_with_the_connection(self):
        chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5;name=value\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nx-trailer: t\r\n\r\n")
        server = self.serve([
            json_answer(b'{"n": 1}'),
            b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + chunked,
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{\"until\": \"closed\"}",
            json_answer(b'{"n": 2}'),
        ])
        client = self.client(server)
        self.assertEqual(client.request("GET", "/a"), {"n": 1})
        self.assertEqual(client.request("GET", "/b"), {"a": 1})
        self.assertIsNone(client.request("DELETE", "/c"))
        self.assertEqual(client.request("GET", "/d"), {"until": "closed"})
        # That answer ended its connection; the next request opens another.
        self.assertEqual(client.request("POST", "/e", body={"x": 1}), {"n": 2})
        self.assertTrue(server.requests[0].startswith(b"GET /a HTTP/1.1\r\n"))
        self.assertIn(b"host: 127.0.0.1:", server.requests[0])
        self.assertTrue(server.requests[4].endswith(b'\r\n\r\n{"x": 1}'))
        self.assertIn(b"content-length: 8\r\n", server.requests[4])

    def test_a_stream_read_to_its_end_keeps_its_connection_and_one_left_half_read_does_not(self):
        lines = b'{"id": "a"}\n{"id": "b"}\n{"id": "c"}\n'
        stream = (b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
                  b"transfer-encoding: chunked\r\n\r\n"
                  + b"".join(b"%x\r\n%s\r\n" % (len(line), line)
                             for line in lines.splitlines(keepends=True))
                  + b"0\r\n\r\n")
        server = self.serve([stream, json_answer(b"{}"), stream, json_answer(b"{}")])
        client = self.client(server)
        self.assertEqual([m["id"] for m in client.history("s")], ["a", "b", "c"])
        client.request("GET", "/after")
        self.assertEqual(server.connections, 1)
        half = client.history("s")
        self.assertEqual(next(half)["id"], "a")
        half.close()
        client.request("GET", "/after")
        self.assertEqual(server.connections, 2)

    def test_error_answers_are_typed(self):
        server = self.serve([
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 52\r\n\r\n"
            b'{"error": {"code": "not_found", "message": "nope."}}',
            b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        ])
        client = self.client(server)
        with self.assertRaises(SessiondbError) as caught:
            client.request("GET", "/x")
        self.assertEqual((caught.exception.status, caught.exception.code), (404, "not_found"))
        with self.assertRaises(SessiondbError) as caught:
            client.request("GET", "/y")
        self.assertEqual((caught.exception.status, caught.exception.code), (414, "http_error"))

    def test_answers_cut_short_or_not_http_are_unavailable(self):
        closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\n"
        for answer in [closing + b"content-length: 10\r\n\r\n{\"a\"",
                       closing + b"transfer-encoding: chunked\r\n\r\n9\r\n{\"a\"",
                       closing + b"transfer-encoding: chunked\r\n\r\nzz\r\n",
                       b"SMTP ready\r\n\r\n",
                       b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"]:
            server = self.serve([answer, None])
            with Client(server.url, timeout=5) as client, \
                    self.assertRaises(SessiondbUnavailable, msg=answer):
                client.request("GET", "/x")

    def test_a_dropped_kept_connection_resends_a_read_but_never_a_post(self):
        # Each first request is answered, so its connection is kept; the server then drops it
        # without answering the next request.
        server = self.serve([json_answer(b"{}"), None, json_answer(b'{"resent": true}')])
        client = self.client(server)
        client.request("GET", "/warm")
        self.assertEqual(client.request("GET", "/read"), {"resent": True})
        self.assertEqual([r.split(b" ")[1] for r in server.requests], [b"/warm", b"/read", b"/read"])

        server = self.serve([json_answer(b"{}"), None, json_answer(b"{}")])
        client = self.client(server)
        client.request("GET", "/warm")
        # The POST may have been applied before the connection went: it is not sent again.
        with self.assertRaises(SessiondbUnavailable):
            client.request("POST", "/append", body={})
        self.assertEqual(len(server.requests), 2)
    def test_an_answer_before_the_body_was_taken_is_the_answer(self):
        # As a server answers a body over its limit: on the head, then it closes the connection
        # with the body unread, so sending the rest fails.
        listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(listener.close)

        def refuse():
            connection, _ = listener.accept()
            with connection, connection.makefile("rb") as reader:
                while reader.readline() not in (b"\r\n", b""):
                    pass
                body = b'{"error": {"code": "payload_too_large", "message": "too long"}}'
                connection.sendall(b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\n"
                                   b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
                                   + body)

        threading.Thread(target=refuse, daemon=True).start()
        client = Client(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=5)
        self.addCleanup(client.close)
        with self.assertRaises(SessiondbError) as caught:
            client.request("POST", "/v1/import", body=b"x" * (64 << 20))
        self.assertEqual((caught.exception.status, caught.exception.code),
                         (413, "payload_too_large"))


if __name__ == "__main__":
    unittest.main()

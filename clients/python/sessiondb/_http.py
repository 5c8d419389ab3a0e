"""The client's HTTP/1.1: one keep-alive connection, requests written whole, answers read through
a buffered reader.

The standard library's ``http.client`` parses every answer's headers with the ``email`` package,
about a quarter of a small request on a loopback connection (~0.05 ms of ~0.2); sessiondb's
answers need none of it: a status line, a few headers, then a body framed by ``Content-Length``
or chunked.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Iterator

# Longest status or header line read; a longer one is not an answer of this API.
_MAX_LINE = 64 * 1024


class DroppedConnection(ConnectionResetError):
    """The server closed the connection before answering (a kept connection it had let go)."""


class MalformedAnswer(OSError):
    """Bytes that are not an HTTP/1.1 answer."""


class Connection:
    """One connection to ``host:port``, opened by the first request."""

    def __init__(self, host: str, port: int | None, timeout: float,
                 ssl_context: ssl.SSLContext | None = None):
        """``ssl_context``: speak TLS, trusting what it trusts; without one, plain HTTP."""
        self.host, self.timeout, self.ssl_context = host, timeout, ssl_context
        default = 443 if ssl_context is not None else 80
        self.port = port or default
        name = f"[{host}]" if ":" in host else host  # an IPv6 address
        self.host_header = name if self.port == default else f"{name}:{self.port}"
        self.sock: socket.socket | None = None
        self.reader = None

    def _open(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
        self.sock, self.reader = sock, sock.makefile("rb")

    def closed_by_server(self) -> bool:
        """Whether the server has closed this kept connection (as a server does with one idle
        for its timeout): between requests nothing is due from it, so a socket that reads as
        ready holds its end (or bytes nobody asked for, as unusable)."""
        if self.sock is None:
            return False
        try:
            ready, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(ready)

    def close(self) -> None:
        if self.sock is not None:
            self.reader.close()
            self.sock.close()
            self.sock = self.reader = None

    def send(self, method: str, target: str, headers: dict[str, str], body: bytes | None) -> None:
        if self.sock is None:
            self._open()
        head = [f"{method} {target} HTTP/1.1", f"host: {self.host_header}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"content-length: {len(body or b'')}")
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))

    def answer(self) -> Answer:
        """The status and headers of the answer to the request sent; its body is read next.
        Interim answers (``100 Continue``, ``103 Early Hints``) before it are skipped."""
        while True:
            line = self.reader.readline(_MAX_LINE)
            if not line:
                raise DroppedConnection("the server closed the connection without answering")
            parts = line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise MalformedAnswer(f"not an HTTP/1.1 status line: {line[:80]!r}")
            status = int(parts[1])
            reason = parts[2].strip().decode("latin-1") if len(parts) > 2 else ""
            headers: dict[str, str] = {}
            while True:
                line = self.reader.readline(_MAX_LINE)
                if line in (b"\r\n", b"\n"):
                    break
                if not line or b":" not in line:
                    raise MalformedAnswer(f"not an HTTP header: {line[:80]!r}")
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if not 100 <= status < 200:
                return Answer(self, status, reason, headers)

    def early_answer(self) -> Answer | None:
        """The answer the server sent before sending failed, if there is one whole; the
        connection is not kept after it (the request was not all sent)."""
        if self.reader is None:
            return None  # it never opened
        try:
            answer = self.answer()
        except OSError:
            return None
        answer.reusable = False
        return answer


class Answer:
    """An answer whose body has not been read yet."""

    def __init__(self, connection: Connection, status: int, reason: str, headers: dict[str, str]):
        self.connection, self.status, self.reason, self.headers = connection, status, reason, headers
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self.length = int(length) if length is not None and length.isdigit() else None
        if status in (204, 304):
            self.length, self.chunked = 0, False
        # Without a length or chunks the body runs to the end of the connection.
        self.reusable = (self.chunked or self.length is not None) \
            and headers.get("connection", "").lower() != "close"

    def read(self) -> bytes:
        """The whole body."""
        return b"".join(self.blocks())

    def blocks(self) -> Iterator[bytes]:
        """The body as it arrives, in blocks of at most 64 KiB (chunks as the server sent them)."""
        reader = self.connection.reader
        if self.chunked:
            while True:
                size_line = reader.readline(_MAX_LINE)
                try:
                    size = int(size_line.split(b";", 1)[0], 16)
                except ValueError:
                    raise _cut_short(size_line, "a chunk size") from None
                if size == 0:
                    while reader.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                data = reader.read(size)
                if len(data) < size or reader.readline(_MAX_LINE) not in (b"\r\n", b"\n"):
                    raise _cut_short(data, "a chunk")
                yield data
        elif self.length is not None:
            left = self.length
            while left:
                data = reader.read1(min(left, 1 << 16))
                if not data:
                    raise DroppedConnection(f"the answer ended {left} bytes early")
                left -= len(data)
                yield data
        else:
            while data := reader.read1(1 << 16):
                yield data


def _cut_short(seen: bytes, expected: str) -> OSError:
    if not seen:
        return DroppedConnection(f"the connection closed where {expected} was due")
    return MalformedAnswer(f"{expected} was due, not {seen[:80]!r}")

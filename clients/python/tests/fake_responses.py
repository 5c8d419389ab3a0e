"""A local stand-in for the OpenAI Responses API (`POST /v1/responses`, non-streaming): it
answers with scripted outputs, in order, and records every request body, so a test sees what the
Agents SDK sent the model. Only the model is faked; the SDK and sessiondb are real."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeResponses:
    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[list[dict]] = []
        self._ids = itertools.count(1)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.path != "/v1/responses" or not fake.script:
                    self._answer(404, {"error": {"message": f"unexpected {self.path}"}})
                    return
                fake.requests.append(body)
                self._answer(200, fake._response(body, fake.script.pop(0)))

            def _answer(self, status, payload):
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _response(self, request: dict, output: list[dict]) -> dict:
        return {
            "id": f"resp_{next(self._ids)}", "object": "response", "created_at": 1_700_000_000,
            "status": "completed", "model": request.get("model", "gpt-4o"), "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "temperature": 1.0, "top_p": 1.0, "error": None, "incomplete_details": None,
            "instructions": request.get("instructions"), "metadata": {},
            "text": {"format": {"type": "text"}},
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}},
        }

    def reply(self, text: str) -> None:
        """Scripts an assistant message as the next answer."""
        n = next(self._ids)
        self.script.append([{
            "type": "message", "id": f"msg_fake_{n}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}])

    def call_tool(self, name: str, arguments: dict, call_id: str) -> None:
        """Scripts a function call as the next answer."""
        n = next(self._ids)
        self.script.append([{
            "type": "function_call", "id": f"fc_fake_{n}", "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

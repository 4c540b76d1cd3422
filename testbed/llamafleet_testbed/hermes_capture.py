"""Capturing what Hermes Agent sends: a stand-in inference server, and the command that refreshes the
committed layout (`python -m llamafleet_testbed.hermes_capture
testbed/llamafleet_testbed/hermes_layout.json`).

`CaptureServer` listens on 127.0.0.1 (an ephemeral port) in a thread of its own and answers what Hermes
asks at the start of a session: `POST /api/show` (Ollama's model info: 404, as an OpenAI-compatible
server answers), `GET /v1/models`, and `POST /v1/chat/completions`, streamed or not, with a fixed short
answer and no tool call, so the session ends after one request. Every request is recorded (method,
path, JSON body), also the ones it does not know (404), and a proxy's `CONNECT` (refused): pointed at as
HTTPS_PROXY, it shows what else a client tries to reach.

`capture()` runs one Hermes session against it and turns the chat request into the layout file's
content (`hermes_layout.layout_from_request`).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from llamafleet_local.cache import log
from llamafleet_testbed.hermes import HermesClient, HermesError, HermesInstall, git_workspace, install
from llamafleet_testbed.hermes_layout import layout_from_request


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    body: Any  # the parsed JSON body, the raw text when not JSON, None when empty


class CaptureServer:
    """`with CaptureServer() as cap: ... cap.base_url ... cap.requests`; stops on exit."""

    def __init__(self, answer: str = "4", model: str = "tiny") -> None:
        self.answer = answer
        self.model = model
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name="capture", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL clients are configured with."""
        return self.url + "/v1"

    def chat_requests(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.requests if r.path.rstrip("/").endswith("/chat/completions")]

    def record(self, entry: Recorded) -> None:
        with self._lock:
            self.requests.append(entry)

    def __enter__(self) -> CaptureServer:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # --- answers -------------------------------------------------------------------------------

    def completion(self) -> dict[str, Any]:
        return {
            "id": "chatcmpl-capture", "object": "chat.completion", "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": self.answer}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        """The streamed form of `completion()`: a role and content delta, a stop, then usage if asked."""
        base = {"id": "chatcmpl-capture", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model}
        out = [
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": self.answer},
                                  "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        if include_usage:
            out.append({**base, "choices": [],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        return out


def _handler(capture: CaptureServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: every answer closes its connection, so a stream needs no chunked encoding.
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:  # keep the test output clean
            pass

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            if not raw:
                return None
            try:
                return json.loads(raw)
            except ValueError:
                return raw

        def _json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            capture.record(Recorded("GET", self.path, None))
            if self.path.rstrip("/").endswith("/models"):
                self._json(200, {"object": "list", "data": [
                    {"id": capture.model, "object": "model", "created": 0, "owned_by": "llamafleet"}]})
            else:
                self._json(404, {"error": {"message": "not found", "type": "not_found"}})

        def do_POST(self) -> None:
            body = self._body()
            capture.record(Recorded("POST", self.path, body))
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": "not found", "type": "not_found"}})
            elif isinstance(body, dict) and body.get("stream"):
                options = body.get("stream_options") or {}
                self._stream(capture.chunks(bool(options.get("include_usage"))))
            else:
                self._json(200, capture.completion())

        def do_CONNECT(self) -> None:
            capture.record(Recorded("CONNECT", self.path, None))
            self.send_error(403, "the capture server reaches nothing")

        def _stream(self, chunks: list[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


# --- one session, captured -------------------------------------------------------------------------


def capture(install: HermesInstall, *, question: str = "What is 2+2?", model: str = "tiny",
            timeout: float = 300.0) -> dict[str, Any]:
    """Run one session against a `CaptureServer` and return its first chat request as a layout
    (`hermes_layout.layout_from_request`). The session runs in a fresh home with a `git init`
    workspace under it; its other traffic goes to the capture server as a proxy, which refuses it and
    counts it (only the count is kept: host names do not belong in a data file)."""
    with tempfile.TemporaryDirectory() as tmp, CaptureServer(model=model) as server:
        home = Path(tmp).resolve() / "home" / "dev"
        workspace = git_workspace(home / "projects" / "service")
        client = HermesClient(install, home, base_url=server.base_url, model=model)
        result = client.chat(question, workspace, timeout=timeout, proxy=server.url)
        bodies = server.chat_requests()
        if not result.ok or not bodies:
            raise HermesError(f"the capture session failed (exit {result.returncode}, "
                              f"{len(bodies)} chat requests):\n{result.stdout}\n{result.stderr}")
        machine = {"kernel": platform.release(), "home": str(home), "cwd": str(workspace),
                   "hermes_home": str(client.hermes_home), "model": model, "provider": client.provider}
        layout = layout_from_request(bodies[0], machine, version=install.version)
        layout["session"] = {
            "requests": [f"{r.method} {r.path}" for r in server.requests if r.path.startswith("/")],
            "refused_elsewhere": sum(1 for r in server.requests if not r.path.startswith("/")),
            "chat_requests": len(bodies),
        }
        return layout


def main(argv: list[str] | None = None) -> int:
    """`python -m llamafleet_testbed.hermes_capture OUT.json`: install Hermes (or reuse the cached one),
    capture one session's request and write it as a layout file."""
    parser = argparse.ArgumentParser(prog="python -m llamafleet_testbed.hermes_capture",
                                     description="capture one Hermes Agent request as a layout JSON file")
    parser.add_argument("out", type=Path)
    parser.add_argument("--question", default="What is 2+2?")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args(argv)
    try:
        layout = capture(install(), question=args.question, model=args.model)
    except HermesError as exc:
        log(f"error: {exc}")
        return 1
    args.out.write_text(json.dumps(layout, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    log(f"wrote {args.out}: {len(layout['tools'])} tools, a system prompt of "
        f"{len(layout['system_prompt'])} characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())

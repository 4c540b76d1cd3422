"""The smallest Kubernetes API that `helm template --dry-run=server` needs for the chart's `lookup` calls:
core/v1 discovery and GET of Secrets held in memory. Everything else is 404, which `lookup` reads as
"not there". It listens on a free loopback port; `kubeconfig()` writes a kubeconfig that points at it.

This lets a test play an upgrade offline: put the Secrets an earlier release left in the cluster, render,
and see whether the chart kept their values.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CORE_V1 = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "v1",
    "resources": [{"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret",
                   "verbs": ["get", "list"]}],
}


class FakeApiServer:
    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.requests: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    def put_secret(self, namespace: str, name: str, **data: str) -> None:
        self.secrets[(namespace, name)] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}

    def _answer(self, path: str) -> tuple[int, dict[str, Any]]:
        self.requests.append(path)
        path = path.split("?", 1)[0]
        if path == "/api/v1":
            return 200, CORE_V1
        parts = path.strip("/").split("/")
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
            data = self.secrets.get((parts[3], parts[5]))
            if data is not None:
                return 200, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
                             "metadata": {"name": parts[5], "namespace": parts[3]}}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                     "code": 404}

    @contextmanager
    def running(self) -> Iterator[FakeApiServer]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, body = fake._answer(self.path)
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=5)

    def kubeconfig(self, folder: Path, namespace: str) -> Path:
        assert self._server is not None, "start the server first (running())"
        host, port = self._server.server_address[:2]
        path = folder / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://{host!s}:{port}"}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                       "namespace": namespace}}],
        }))
        path.chmod(0o600)
        return path

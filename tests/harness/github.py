"""A local stand-in for GitHub's REST API: replays recorded answers and records requests.

Each fixture in ``tests/tuner/fixtures/github/`` holds the request it answers
(``METHOD PATH``), the status, headers and body in GitHub's documented shape (``{api}`` in a
header is the server's URL). A request without a fixture gets GitHub's 404 document.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "tuner" / "fixtures" / "github"


@dataclass(frozen=True)
class Received:
    """One request the server received (header names in lower case: HTTP ignores case)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: object


@dataclass
class ReplayGitHub:
    """Answers each ``METHOD PATH`` with the recorded fixture loaded for it."""

    url: str = ""
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)

    def load(self, *names: str) -> ReplayGitHub:
        self.routes.clear()
        self.received.clear()
        for name in names:
            recorded = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
            self.routes[str(recorded["request"])] = recorded
        return self

    def calls(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.received]


@contextmanager
def serve() -> Iterator[ReplayGitHub]:
    """The replaying server on 127.0.0.1 at a free port, for the duration of the block."""
    replay = ReplayGitHub()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            replay.received.append(
                Received(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=json.loads(raw) if raw else None,
                )
            )
            recorded = replay.routes.get(f"{self.command} {self.path}")
            if recorded is None:
                status, headers = 404, {"Content-Type": "application/json; charset=utf-8"}
                body: object = {
                    "message": "Not Found",
                    "documentation_url": "https://docs.github.com/rest",
                    "status": "404",
                }
            else:
                status, headers = int(recorded["status"]), dict(recorded["headers"])
                body = recorded["body"]
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, str(value).replace("{api}", replay.url))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    replay.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield replay
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

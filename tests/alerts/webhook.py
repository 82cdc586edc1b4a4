"""A local Alertmanager webhook receiver (http.server on 127.0.0.1) that records payloads."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Delivery:
    path: str
    payload: dict[str, Any]
    authorization: str | None
    """The request's ``Authorization`` header (the tuner receiver sends a bearer token)."""


@dataclass
class Webhook:
    server: ThreadingHTTPServer
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def snapshot(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)

    def wait_for(self, path: str, alertname: str, timeout_s: float) -> Delivery | None:
        """The first firing delivery of ``alertname`` to ``path``, polling until the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for d in self.snapshot():
                if (
                    d.path == path
                    and d.payload.get("status") == "firing"
                    and d.payload["groupLabels"].get("alertname") == alertname
                ):
                    return d
            time.sleep(0.25)
        return None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_webhook() -> Webhook:
    holder: list[Webhook] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hook = holder[0]
            with hook.lock:
                hook.deliveries.append(
                    Delivery(self.path, json.loads(body), self.headers.get("Authorization"))
                )
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook = Webhook(server)
    holder.append(hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return hook

"""Edge: the tuner's HTTP face on ``--listen``: Alertmanager's webhook and /metrics.

``POST /alerts`` takes Alertmanager's webhook payload (version 4) with
``Authorization: Bearer <token>``. A firing notification wakes the tuning loop for an
immediate cycle; a repeat of one already seen (same ``groupKey``, alert fingerprints and
start times, as Alertmanager re-sends every ``repeat_interval``) and resolved
notifications do not. ``GET /metrics`` serves the tuner's own metrics.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runtime.tuner.selfmetrics import TunerMetrics

log = logging.getLogger(__name__)

TOKEN_ENV = "GPUPOOL_TUNER_TOKEN"
"""Environment variable with the webhook's bearer token (``gpupool tune --listen`` reads it
unless ``--token-file`` is given; the tuner Deployment fills it from the token Secret)."""

MAX_BODY_BYTES = 1 << 20
SEEN_LIMIT = 4096
"""Notification keys remembered for de-duplication (oldest forgotten first)."""


def notification_key(payload: dict[str, Any]) -> str:
    """Identity of a notification: the group and the exact alerts (by fingerprint and start)."""
    alerts = sorted(
        f"{a.get('fingerprint', '')}@{a.get('startsAt', '')}" for a in payload.get("alerts", [])
    )
    return json.dumps([payload.get("groupKey", ""), payload.get("status", ""), alerts])


class Triggers:
    """Thread-safe wake-ups for the tuning loop, de-duplicated by notification key."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._closed = False
        self.pending_reasons: list[str] = []

    def offer(self, key: str, reason: str) -> bool:
        """Wake the loop unless ``key`` was seen; returns whether it triggered."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            while len(self._seen) > SEEN_LIMIT:
                self._seen.popitem(last=False)
            self.pending_reasons.append(reason)
            self._event.set()
            return True

    def wait(self, timeout_s: float) -> list[str] | None:
        """Block until triggered or ``timeout_s`` passes; returns (and clears) the reasons,
        or None once closed."""
        self._event.wait(timeout_s)
        with self._lock:
            self._event.clear()
            if self._closed:
                return None
            reasons, self.pending_reasons = self.pending_reasons, []
            return reasons

    def close(self) -> None:
        """Stop the loop waiting on these triggers."""
        with self._lock:
            self._closed = True
            self._event.set()


def run_loop(*, cycle: Callable[[str], object], triggers: Triggers, interval_s: float) -> None:
    """Cycle now, then after every ``interval_s`` or alert trigger, until ``triggers.close``.

    A failed cycle is logged and retried at the next tick: the loop must outlive a flaky
    Prometheus or git remote (and a failed cycle proposes nothing).
    """
    trigger = "start"
    while True:
        try:
            cycle(trigger)
        except Exception:
            log.exception("tuning cycle (%s) failed; proposing nothing", trigger)
        reasons = triggers.wait(interval_s)
        if reasons is None:
            return
        trigger = "alert" if reasons else "timer"


def serve(
    address: tuple[str, int], *, token: str, triggers: Triggers, metrics: TunerMetrics
) -> ThreadingHTTPServer:
    """Start the server in a daemon thread; the caller shuts it down."""
    if not token:
        raise ValueError("the webhook needs a bearer token; refusing to listen without one")
    expected = f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._reply(200, b"ok\n")
            else:
                self._reply(404, b"not found\n")

        def do_POST(self) -> None:
            if self.path != "/alerts":
                self._reply(404, b"not found\n")
                return
            given = self.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                metrics.notifications.labels("unauthorized").inc()
                self._reply(401, b"missing or wrong bearer token\n")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                metrics.notifications.labels("invalid").inc()
                self._reply(413, b"payload too large\n")
                return
            try:
                payload = json.loads(self.rfile.read(length))
                if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
                    raise ValueError("expected an Alertmanager webhook payload with alerts[]")
            except ValueError as exc:
                metrics.notifications.labels("invalid").inc()
                self._reply(400, f"invalid payload: {exc}\n".encode())
                return
            if payload.get("status") != "firing":
                metrics.notifications.labels("resolved").inc()
                self._reply(200, b"resolved: nothing to do\n")
                return
            names = sorted({str(a.get("labels", {}).get("alertname")) for a in payload["alerts"]})
            if triggers.offer(notification_key(payload), f"alert {','.join(names)}"):
                metrics.notifications.labels("triggered").inc()
                log.info("notification for %s: evaluating now", names)
                self._reply(202, b"evaluation triggered\n")
            else:
                metrics.notifications.labels("duplicate").inc()
                self._reply(200, b"duplicate notification: already evaluated\n")

        def _reply(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    server = ThreadingHTTPServer(address, Handler)
    threading.Thread(target=server.serve_forever, name="tuner-webhook", daemon=True).start()
    return server

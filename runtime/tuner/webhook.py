"""Edge: the tuner's HTTP faces: Alertmanager's webhook on ``--listen``, health and
metrics on ``--ops-listen``.

``POST /alerts`` (``serve``) takes Alertmanager's webhook payload (version 4) with
``Authorization: Bearer <token>``. A firing notification wakes the tuning loop for an
immediate cycle; a repeat of one already seen (same ``groupKey``, alert fingerprints and
start times, as Alertmanager re-sends every ``repeat_interval``) and resolved
notifications do not. ``GET /healthz`` and ``GET /metrics`` (``serve_ops``) answer on a
listener of their own, so clients of the webhook port cannot starve the probes.

Both listeners survive bad clients (``WebhookLimits``): at most ``max_handlers`` connections
are served at once and ``max_per_client`` from one address, each must deliver its whole
request within ``read_timeout_s`` (one deadline, not a per-read timeout), the
body's length is checked before a byte of it is read, its JSON nesting before it is parsed,
and its types before anything acts on it. Every refusal is counted by reason in
``gpupool_tuner_webhook_rejected_total``.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import re
import socket
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError

from policy.loader import _describe
from runtime.tuner.selfmetrics import TunerMetrics

log = logging.getLogger(__name__)

TOKEN_ENV = "GPUPOOL_TUNER_TOKEN"
"""Environment variable with the webhook's bearer token (``gpupool tune --listen`` reads it
unless ``--token-file`` is given; the tuner Deployment passes the token Secret's mounted
file as ``--token-file``)."""

SEEN_LIMIT = 4096
"""Notification keys remembered for de-duplication (oldest forgotten first)."""


@dataclass(frozen=True)
class WebhookLimits:
    """Bounds that keep the webhook up under malformed, huge, deep or slow requests.

    Module defaults, not settings: Alertmanager's notifications are a few KiB, nested four
    deep, and sent in milliseconds, so these leave wide margins; tests pass small ones.
    """

    max_body_bytes: int = 1 << 20
    """Largest accepted ``Content-Length`` (1 MiB); a larger one gets 413 unread."""
    max_json_depth: int = 16
    """Deepest accepted nesting of JSON arrays and objects (Alertmanager's payload: 4)."""
    read_timeout_s: float = 10.0
    """Time a connection has, from when a handler takes it, to deliver its whole request
    (headers and body) and for each write of the reply; a slower client is dropped."""
    max_handlers: int = 8
    """Connections served at once (one thread each); further ones wait for a handler."""
    max_per_client: int = 4
    """Connections one client address may have open at once; one more gets 503 at once, so
    a single client holds at most half of the handlers however many sockets it opens."""
    queue_wait_s: float = 15.0
    """How long an accepted connection waits for a free handler before it gets 503. Above
    ``read_timeout_s``, so a connection queued behind slow clients is served when the
    first of them is dropped; the accept loop (and ``shutdown``) waits meanwhile."""


DEFAULT_LIMITS = WebhookLimits()


class Refusal(Exception):
    """A request the webhook refuses: HTTP ``status``, the counter's ``reason``, and why."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


_DIGITS = re.compile(r"[0-9]+")
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
_BRACKET = re.compile(rb"[\[\]{}]")
_MESSAGE_LIMIT = 300
"""Longest echo of a refused value in a reply, so a huge wrong value is not sent back."""


def content_length(headers: Message, *, limit: int) -> int:
    """The body length a POST declares, checked before any of it is read."""
    if headers.get("Transfer-Encoding") is not None:
        raise Refusal(
            411, "length_required", "Transfer-Encoding is not accepted; send Content-Length"
        )
    values = headers.get_all("Content-Length") or []
    if not values:
        raise Refusal(411, "length_required", "Content-Length is required")
    if len(values) > 1:
        raise Refusal(400, "bad_length", "more than one Content-Length header")
    value = values[0].strip()
    if not _DIGITS.fullmatch(value):
        shown = value[:_MESSAGE_LIMIT]
        raise Refusal(400, "bad_length", f"Content-Length {shown!r} is not a non-negative integer")
    length = int(value)
    if length > limit:
        raise Refusal(
            413, "too_large", f"Content-Length {length} is above the limit of {limit} bytes"
        )
    return length


def json_depth_within(body: bytes, limit: int) -> bool:
    """Whether no array or object in ``body`` nests deeper than ``limit``.

    A linear scan of the brackets outside strings, so a deep document is refused before
    ``json.loads`` recurses into it. Exact for valid JSON; on invalid JSON it may count
    brackets of an unterminated string, which only refuses a document the parser would.
    """
    depth = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub(b'""', body)):
        depth += 1 if match.group() in b"[{" else -1
        if depth > limit:
            return False
    return True


class _Strict(BaseModel):
    """Types as Alertmanager sends them, never coerced (``"3"`` is no integer)."""

    model_config = ConfigDict(strict=True, extra="allow")


class AlertmanagerAlert(_Strict):
    """One element of ``alerts[]`` (fields Alertmanager may add later are kept unchecked)."""

    status: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    startsAt: str = ""
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class AlertmanagerPayload(_Strict):
    """Alertmanager's webhook payload, version 4 (its ``notify/webhook`` message); only
    ``status`` and ``alerts`` are required, absent fields read as these defaults."""

    status: Literal["firing", "resolved"]
    alerts: list[AlertmanagerAlert]
    version: str = ""
    groupKey: str = ""
    truncatedAlerts: int = 0
    receiver: str = ""
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: str = ""


def _location(loc: tuple[int | str, ...]) -> str:
    """``("alerts", 0, "labels")`` as ``alerts[0].labels``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def parse_notification(body: bytes, *, max_depth: int) -> dict[str, Any]:
    """The payload of ``body``, checked to be Alertmanager's (types included), or a Refusal
    naming the first fields that are not."""
    too_deep = Refusal(400, "too_deep", f"JSON nests deeper than {max_depth} arrays/objects")
    if not json_depth_within(body, max_depth):
        raise too_deep
    try:
        payload = json.loads(body)
    except RecursionError:  # only if the scan above missed a nesting: never a traceback
        raise too_deep from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise Refusal(400, "malformed", f"not JSON: {exc}") from None
    try:
        AlertmanagerPayload.model_validate(payload)
    except ValidationError as exc:
        where = [f"{_location(e['loc']) or 'payload'}: {_describe(e)}" for e in exc.errors()[:3]]
        message = "; ".join(where)[:_MESSAGE_LIMIT]
        raise Refusal(400, "invalid", f"not an Alertmanager webhook payload: {message}") from None
    result: dict[str, Any] = payload
    return result


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


class _DeadlineReader(io.RawIOBase):
    """Reads from a connection until a fixed deadline: a per-read timeout alone lets a
    client that sends a byte just before each timeout hold a handler forever."""

    def __init__(self, sock: socket.socket, timeout_s: float, on_expiry: Callable[[], None]):
        super().__init__()
        self._sock, self._timeout_s, self._on_expiry = sock, timeout_s, on_expiry
        self._deadline = time.monotonic() + timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            return self._sock.recv_into(buffer)
        except TimeoutError:
            self._on_expiry()
            raise TimeoutError(f"request not received within {self._timeout_s} s") from None


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``limits.max_handlers`` at once and
    ``limits.max_per_client`` per client address."""

    request_queue_size = 64  # connections waiting for a handler queue in the kernel

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        limits: WebhookLimits,
        metrics: TunerMetrics,
    ) -> None:
        self.limits, self.metrics = limits, metrics
        self._slots = threading.BoundedSemaphore(limits.max_handlers)
        self._open: Counter[str] = Counter()  # connections per client address
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """In the accept loop: refuse a client over its share at once (before it can wait
        for a handler), then wait up to ``queue_wait_s`` for a free handler."""
        client = str(client_address[0])
        with self._open_lock:
            over = self._open[client] >= self.limits.max_per_client
            if not over:
                self._open[client] += 1
        if over:
            self._refuse(request, "per_client", b"busy: too many connections from this client\n")
            return
        if not self._slots.acquire(timeout=self.limits.queue_wait_s):
            self._closed(client)
            self._refuse(request, "busy", b"busy: every handler is taken, retry\n")
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._closed(client)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
            self._closed(str(client_address[0]))

    def _closed(self, client: str) -> None:
        with self._open_lock:
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]

    def _refuse(self, request: Any, reason: str, body: bytes) -> None:
        """503 ``body`` without reading the request; a reply this small fits the socket's
        buffer, so the accept loop does not wait on the client."""
        self.metrics.webhook_rejected.labels(reason).inc()
        head = (
            "HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        try:
            request.settimeout(self.limits.read_timeout_s)
            request.sendall(head.encode() + body)
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanishes mid-request is routine; anything else is a bug worth a trace
        (logged, never printed to stderr as socketserver would)."""
        if isinstance(sys.exc_info()[1], OSError):
            log.debug("connection from %s failed", client_address, exc_info=True)
        else:
            log.exception("request from %s failed", client_address)


class _Handler(BaseHTTPRequestHandler):
    """What both listeners share: the connection's deadline, one-line refusals, counting."""

    server: _BoundedServer
    error_message_format = "%(code)d %(message)s: %(explain)s\n"  # one line, like ours
    error_content_type = "text/plain"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # replaced by a reader that keeps the connection's deadline
        self._expired = False
        self.rfile = io.BufferedReader(
            _DeadlineReader(self.connection, self.server.limits.read_timeout_s, self._expiry)
        )

    def _expiry(self) -> None:
        if not self._expired:
            self._expired = True
            self.server.metrics.webhook_rejected.labels("timeout").inc()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals: bad request line, headers too long or too many,
        unsupported method."""
        self.server.metrics.webhook_rejected.labels("protocol").inc()
        super().send_error(code, message, explain)

    def end_headers(self) -> None:
        # bound each write of the reply
        self.connection.settimeout(self.server.limits.read_timeout_s)
        super().end_headers()

    def _reply(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def _start(
    name: str,
    address: tuple[str, int],
    handler: type[_Handler],
    limits: WebhookLimits,
    metrics: TunerMetrics,
) -> ThreadingHTTPServer:
    server = _BoundedServer(address, handler, limits=limits, metrics=metrics)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def serve(
    address: tuple[str, int],
    *,
    token: str,
    triggers: Triggers,
    metrics: TunerMetrics,
    limits: WebhookLimits = DEFAULT_LIMITS,
) -> ThreadingHTTPServer:
    """Start the webhook (``POST /alerts``) in a daemon thread; the caller shuts it down."""
    if not token:
        raise ValueError("the webhook needs a bearer token; refusing to listen without one")
    expected = f"Bearer {token}".encode()
    rejected = metrics.webhook_rejected

    class Webhook(_Handler):
        def do_GET(self) -> None:
            self._reply(404, b"not found: GET /healthz and /metrics are on the ops listener\n")

        def do_POST(self) -> None:
            if self.path != "/alerts":
                self._reply(404, b"not found\n")
                return
            try:
                given = self.headers.get("Authorization", "").encode()
                if not hmac.compare_digest(given, expected):
                    raise Refusal(401, "unauthorized", "missing or wrong bearer token")
                length = content_length(self.headers, limit=limits.max_body_bytes)
                body = self.rfile.read(length)
                if len(body) < length:
                    raise Refusal(
                        400, "truncated", f"body ended after {len(body)} of {length} bytes"
                    )
                payload = parse_notification(body, max_depth=limits.max_json_depth)
            except Refusal as refusal:
                rejected.labels(refusal.reason).inc()
                self._reply(refusal.status, f"{refusal}\n".encode())
                return
            if payload["status"] != "firing":
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

    return _start("tuner-webhook", address, Webhook, limits, metrics)


def serve_ops(
    address: tuple[str, int], *, metrics: TunerMetrics, limits: WebhookLimits = DEFAULT_LIMITS
) -> ThreadingHTTPServer:
    """Start ``GET /healthz`` and ``GET /metrics`` in a daemon thread of their own, with
    handlers of their own: however many slow clients hold the webhook's, the probes are
    answered. No token: the NetworkPolicy admits only Prometheus here (the kubelet's probes
    come from the node), and the metrics are counts, never a secret."""

    class Ops(_Handler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._reply(200, b"ok\n")
            else:
                self._reply(404, b"not found\n")

    return _start("tuner-ops", address, Ops, limits, metrics)

"""The webhook under a storm of bad clients, on a real socket: more slow clients than
handlers, then malformed, truncated, huge, deep, wrong-typed and garbage requests, all at
once with well-formed notifications. Every well-formed request is answered, and the server
is still up afterwards."""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.tuner.webhook import WebhookLimits
from tests.tuner.test_webhook import AUTH, Webhook, exchange, firing, request_bytes

LIMITS = WebhookLimits(
    max_body_bytes=64 * 1024,
    max_json_depth=16,
    read_timeout_s=0.5,
    max_handlers=4,
    max_per_client=1000,
    queue_wait_s=10.0,
)
"""A 0.5 s deadline keeps the storm to seconds; 10 s of queueing means no well-formed
request can be turned away with 503 while slow clients hold every handler. Every client
here shares one address, so no per-client share (tests/tuner/test_webhook.py tests it)."""
SLOW_CLIENTS = 8  # twice max_handlers
PER_KIND = 5  # bad requests of each kind
GOOD_REQUESTS = 20


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    w = Webhook(LIMITS)
    yield w
    w.close()


def _send_quietly(port: int, data: bytes, *, half_close: bool = False) -> None:
    """A bad client: send, maybe half-close, read what comes; a reset is its own business."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
    except OSError:
        pass


def _slow(port: int, connected: threading.Barrier) -> None:
    """A slow-loris client: a header byte every 0.1 s until the server hangs up."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"POST /alerts HTTP/1.1\r\n")
        connected.wait()
        sock.settimeout(0.1)
        for byte in b"X-Slow: yes\r\n" * 15:  # about 20 s
            try:
                if sock.recv(1024) == b"":
                    return
            except TimeoutError:
                pass
            except OSError:
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return
    raise AssertionError("a slow client was never dropped")


def _wrong_typed(rng: random.Random) -> bytes:
    """A well-formed notification with one value replaced by one of another type."""
    payload = json.loads(firing())
    alert = payload["alerts"][0]
    where, key = rng.choice(
        [
            (payload, "status"),
            (payload, "alerts"),
            (payload, "groupKey"),
            (payload, "truncatedAlerts"),
            (alert, "labels"),
            (alert, "fingerprint"),
            (alert, "startsAt"),
            (alert["labels"], "alertname"),
        ]
    )
    others = [
        v for v in (None, 7, 1.5, True, "x", [1, "a"], {"k": 1}) if type(v) is not type(where[key])
    ]
    where[key] = rng.choice(others)
    return json.dumps(payload).encode()


def _bad_requests(rng: random.Random) -> list[tuple[bytes, bool]]:
    """Seeded bad requests (bytes, whether to half-close after them), ``PER_KIND`` of every
    kind, shuffled; built up front so the seed alone decides them."""
    deep = b'{"status": "firing", "alerts": [], "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"

    def truncated() -> bytes:
        full = request_bytes(firing())
        return full[: rng.randint(full.index(b"\r\n\r\n") + 4, len(full) - 1)]

    kinds: list[Callable[[], tuple[bytes, bool]]] = [
        lambda: (rng.randbytes(rng.randint(1, 4096)), False),
        lambda: (request_bytes(firing())[: rng.randint(1, 200)], True),
        lambda: (truncated(), True),
        lambda: (request_bytes(rng.randbytes(rng.randint(0, 300))), False),
        lambda: (request_bytes(_wrong_typed(rng)), False),
        lambda: (request_bytes(deep), False),
        lambda: (
            request_bytes(headers=[AUTH, ("Content-Length", "1" * 12)]) + b"x" * 200_000,
            False,
        ),
        lambda: (
            request_bytes(headers=[AUTH, ("Content-Length", rng.choice(["-5", "x", ""]))]),
            False,
        ),
        lambda: (request_bytes(firing(), headers=[("Content-Length", "0")]), False),
        lambda: (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", False),
        lambda: (b"POST /alerts HTTP/1.1\r\n" + b"X: y\r\n" * 150 + b"\r\n", False),
        lambda: (b"", False),
    ]
    requests = [kind() for kind in kinds for _ in range(PER_KIND)]
    rng.shuffle(requests)
    return requests


def test_server_answers_every_well_formed_request_through_a_storm(webhook: Webhook) -> None:
    rng = random.Random(20260101)
    bad_requests = _bad_requests(rng)
    connected = threading.Barrier(SLOW_CLIENTS + 1, timeout=20)
    with ThreadPoolExecutor(max_workers=SLOW_CLIENTS + 16) as pool:
        slow = [pool.submit(_slow, webhook.port, connected) for _ in range(SLOW_CLIENTS)]
        connected.wait()  # every slow client is connected: the handlers are all taken
        bad = [
            pool.submit(_send_quietly, webhook.port, data, half_close=half_close)
            for data, half_close in bad_requests
        ]
        good = [
            pool.submit(exchange, webhook.port, request_bytes(firing(f"good-{i}")))
            for i in range(GOOD_REQUESTS)
        ]
        health = pool.submit(exchange, webhook.ops_port, b"GET /healthz HTTP/1.1\r\n\r\n")
        answers = [future.result()[0] for future in good]
        assert health.result()[0] == 200
        for future in slow + bad:
            future.result()  # a slow client not dropped raises here
    assert answers == [202] * GOOD_REQUESTS
    assert (
        sorted(webhook.triggers.pending_reasons) == ["alert FlexEvictionRateHigh"] * GOOD_REQUESTS
    )
    assert webhook.rejected("timeout") >= SLOW_CLIENTS
    for reason in (
        "malformed",
        "invalid",
        "too_deep",
        "too_large",
        "bad_length",
        "truncated",
        "unauthorized",
        "protocol",
    ):
        assert webhook.rejected(reason) > 0, reason
    assert webhook.rejected("busy") == 0
    assert any(t.name == "tuner-webhook" and t.is_alive() for t in threading.enumerate())
    after = exchange(webhook.port, request_bytes(firing("after")))
    assert after[0] == 202

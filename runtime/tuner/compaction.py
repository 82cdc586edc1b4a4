"""Edge: hand a compaction request to the KV compaction worker.

Interface (the worker implements the receiving side): ``POST <compaction-url>`` with
``Content-Type: application/json`` and the body of ``compaction_payload``::

    {"kind": "gpupool.compaction-request", "version": 1, "id": "<hex>",
     "requested_at": <unix s>, "namespace": "<flex namespace>",
     "workloads": ["<workload name>", ...], "usage_below": <fraction>,
     "min_interval": "<duration>", "reason": "...",
     "evidence": [{"series": ..., "condition": ..., "summary": ...}]}

The worker answers 2xx when it accepted (or already holds) the request id; compaction
itself runs asynchronously. Without a URL the request is only logged and counted.

In the cluster the target is each flex workload's headless Service (``--compaction-service
HOST:PORT``): ``fan_out`` resolves the name to every pod address and posts
``/compaction-requests`` to each with the shared compaction token, so the tuner needs no
Kubernetes API access. A name that resolves to nothing is a reported failure, not an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from policy import PoolPolicy
from runtime.kvcache.sidecar.compaction_request import KIND, VERSION
from runtime.tuner.proposals import CompactionRequest

TOKEN_ENV = "GPUPOOL_COMPACTION_TOKEN"
"""Environment variable holding the shared compaction token (``tuner.compaction_token_secret``)."""
log = logging.getLogger(__name__)
REQUEST_PATH = "/compaction-requests"
"""Path of the sidecar endpoint (``runtime.kvcache.sidecar.service.serve_http``)."""

Resolver = Callable[[str, int], list[str]]
"""``(host, port) -> addresses``; ``resolve`` in production, a fixed list in tests."""


def compaction_payload(
    request: CompactionRequest, *, policy: PoolPolicy, at: float
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": KIND,
        "version": VERSION,
        "requested_at": at,
        "namespace": policy.cluster.flex_namespace,
        "workloads": [w.name for w in policy.workloads],
        "usage_below": policy.kv_cache.compaction_usage_below,
        "min_interval": policy.kv_cache.compaction_min_interval,
        "reason": request.reason,
        "evidence": [asdict(e) for e in request.evidence],
    }
    body["id"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return body


def deliver(
    url: str, payload: dict[str, Any], *, token: str | None = None, timeout_s: float = 10
) -> None:
    """POST the request; raises ``OSError`` (``urllib.error.URLError``) when not accepted."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s):
        pass


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (a headless Service: one per ready pod); [] if none."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({str(info[4][0]) for info in infos})


@dataclass(frozen=True)
class FanOutReport:
    """What one service's pods answered."""

    service: str
    accepted: tuple[str, ...]
    """Addresses that accepted the request."""
    failed: tuple[tuple[str, str], ...]
    """``(address or service, why)`` for each refusal, unreachable pod or empty name."""


def fan_out(
    service: str,
    payload: dict[str, Any],
    *,
    token: str | None,
    resolver: Resolver = resolve,
    timeout_s: float = 10,
) -> FanOutReport:
    """Post ``payload`` to every address of ``service`` (``HOST:PORT``), one by one."""
    host, _, port = service.rpartition(":")
    addresses = resolver(host, int(port))
    if not addresses:
        return FanOutReport(service, (), ((service, "resolves to no address"),))
    accepted: list[str] = []
    failed: list[tuple[str, str]] = []
    for address in addresses:
        literal = f"[{address}]" if ":" in address else address
        try:
            deliver(
                f"http://{literal}:{port}{REQUEST_PATH}", payload, token=token, timeout_s=timeout_s
            )
            accepted.append(address)
        except OSError as exc:
            failed.append((address, str(exc)))
    return FanOutReport(service, tuple(accepted), tuple(failed))


def send(
    payload: dict[str, Any], url: str | None, services: Sequence[str], token: str | None
) -> str:
    """Deliver to ``url`` and fan out to ``services``; the outcome: ``delivered`` (every target
    accepted), ``partial`` (some did) or ``failed`` (none did). Failures are logged."""
    accepted = failed = 0
    if url:
        try:
            deliver(url, payload, token=token)
            accepted += 1
        except OSError as exc:
            log.warning("compaction request %s not delivered to %s: %s", payload["id"], url, exc)
            failed += 1
    for service in services:
        fanned = fan_out(service, payload, token=token)
        accepted += len(fanned.accepted)
        failed += len(fanned.failed)
        log.info(
            "compaction request %s: %s: %d pod(s) accepted",
            payload["id"],
            service,
            len(fanned.accepted),
        )
        for where, why in fanned.failed:
            log.warning("compaction request %s not delivered to %s: %s", payload["id"], where, why)
    if failed == 0:
        return "delivered"
    return "partial" if accepted else "failed"

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
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from dataclasses import asdict
from typing import Any

from policy import PoolPolicy
from runtime.tuner.decisions import CompactionRequest


def compaction_payload(
    request: CompactionRequest, *, policy: PoolPolicy, at: float
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "gpupool.compaction-request",
        "version": 1,
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


def deliver(url: str, payload: dict[str, Any], *, timeout_s: float = 10) -> None:
    """POST the request; raises ``OSError`` (``urllib.error.URLError``) when not accepted."""
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout_s):
        pass

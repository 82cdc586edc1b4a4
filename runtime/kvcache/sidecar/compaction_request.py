"""The tuner's compaction request as the sidecar accepts it: strict, pure validation.

The tuner (``runtime.tuner.compaction``) builds the body; this module owns its schema
(``KIND``, ``VERSION``) so both sides name it once. A request is for this pod only when its
``workloads`` list names the pod's workload; anything else is refused before it is queued.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KIND = "gpupool.compaction-request"
VERSION = 1
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "kind": str,
    "version": int,
    "id": str,
    "requested_at": (int, float),
    "namespace": str,
    "workloads": list,
    "usage_below": (int, float),
    "min_interval": str,
    "reason": str,
    "evidence": list,
}


class RequestRejected(ValueError):
    """Why a body is not a compaction request for this pod; ``status`` is the HTTP code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CompactionOrder:
    """An accepted request: what the next poll executes, and its id for logs."""

    id: str
    reason: str


def parse_request(body: bytes, workload: str) -> CompactionOrder:
    """The order in ``body`` for ``workload``; raises ``RequestRejected`` (400: not a valid
    request, 422: a valid request that does not name this workload)."""
    try:
        data: Any = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestRejected(400, f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestRejected(400, f"expected a JSON object, found {type(data).__name__}")
    for name, kind in _FIELDS.items():
        if name not in data:
            raise RequestRejected(400, f"field {name!r} is missing")
        if not isinstance(data[name], kind) or isinstance(data[name], bool):
            expected, found = _type_name(kind), type(data[name]).__name__
            raise RequestRejected(400, f"field {name!r}: expected {expected}, found {found}")
    if data["kind"] != KIND:
        raise RequestRejected(400, f"field 'kind': expected {KIND!r}, found {data['kind']!r}")
    if data["version"] != VERSION:
        raise RequestRejected(400, f"field 'version': expected {VERSION}, found {data['version']}")
    if workload not in data["workloads"]:
        raise RequestRejected(
            422, f"request {data['id']} names workloads {data['workloads']}, not {workload!r}"
        )
    return CompactionOrder(id=data["id"], reason=data["reason"])


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)

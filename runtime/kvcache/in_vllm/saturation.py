"""When a compaction must wait: the engine is saturated, or moves would not fit one pause.

Rule: a compaction (and so a shrink) is DEFERRED while requests wait for admission or KV
block usage is at or above ``page_table_max_usage`` (policy), because moving blocks then only
adds latency to a queue and a shrink would starve it; and every pass is BOUNDED to
``compaction_max_moves`` block moves, highest blocks first, so one pause never grows with the
pool. A deferred request changes nothing; the sidecar retries at its next poll.
"""

from __future__ import annotations


def deferral_reason(*, num_waiting: int, usage: float, saturation_usage: float) -> str | None:
    """Why a compaction must wait now, or None when it may run."""
    if num_waiting > 0:
        return f"saturated: {num_waiting} requests waiting for admission"
    if usage >= saturation_usage:
        return f"saturated: KV usage {usage:.2f} >= {saturation_usage:.2f}"
    return None

"""Which snapshot files to delete: a pure decision over one scan of the volume.

vLLM's filesystem tier writes one file per block (a ``<file>.bin_<n>.tmp`` renamed over
``<file>.bin`` when complete) and never deletes. The order of deletion:

1. a partial write older than ``reclaim_after_s`` is a writer that died;
2. a tier directory no replica has touched for ``reclaim_after_s`` is reclaimed, but only
   while another tier directory is live: an old vLLM version's or model's tree once a new
   one serves. If none is live (every replica evicted, the next one still loading) nothing
   is reclaimed, so the cache the next replica restores from stays;
3. over ``capacity_bytes``, whole block files go, least recently used first (mtime: when
   written, or when the tier last found the block: it touches every hit), down to
   ``LOW_WATERMARK`` of the capacity so the next writes do not trigger it again at once.

A partial write younger than ``reclaim_after_s`` is never deleted (vLLM is writing it); a
block file deleted under a reader is a miss for vLLM (the load fails, the block is
recomputed), never an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

FileKind = Literal["block", "partial", "other"]
Reason = Literal["abandoned_write", "reclaimed", "capacity"]
REASONS: tuple[Reason, ...] = ("abandoned_write", "reclaimed", "capacity")

LOW_WATERMARK = 0.9
"""Share of the capacity a capacity pass deletes down to."""


@dataclass(frozen=True)
class TierFile:
    """One regular file under a tier directory."""

    path: str
    tier: str
    kind: FileKind
    size: int
    mtime: float


@dataclass(frozen=True)
class Deletion:
    path: str
    tier: str
    size: int
    reason: Reason
    age_s: float
    """Seconds since the file was last written or used."""


@dataclass(frozen=True)
class Plan:
    """What to delete, and the volume's use before and after."""

    deletions: tuple[Deletion, ...]
    used_bytes: int
    kept_bytes: int
    live_tiers: frozenset[str]
    reclaimed_tiers: frozenset[str]


def plan(
    files: Sequence[TierFile],
    heartbeats: dict[str, float],
    *,
    now: float,
    capacity_bytes: int,
    reclaim_after_s: float,
    complete: bool = True,
) -> Plan:
    """The deletions that bring the tier within ``capacity_bytes``.

    ``heartbeats``: for every tier directory, the last time a replica showed it is alive
    (its identity file's mtime; for a directory without one, its newest file).
    ``complete``: whether ``files`` is the whole volume. A partial scan (a walk stopped at
    its budget) may not have reached a tier's identity file, so it reclaims nothing; its
    capacity deletions stand, as what it saw is a lower bound of what is there."""
    live = frozenset(t for t, beat in heartbeats.items() if now - beat <= reclaim_after_s)
    stale = frozenset(heartbeats) - live if live and complete else frozenset()
    deletions: list[Deletion] = []
    kept: list[TierFile] = []
    for f in files:
        age = now - f.mtime
        if f.tier in stale:
            deletions.append(Deletion(f.path, f.tier, f.size, "reclaimed", age))
        elif f.kind == "partial" and age > reclaim_after_s:
            deletions.append(Deletion(f.path, f.tier, f.size, "abandoned_write", age))
        else:
            kept.append(f)
    used = sum(f.size for f in files)
    kept_bytes = sum(f.size for f in kept)
    if kept_bytes > capacity_bytes:
        target = int(capacity_bytes * LOW_WATERMARK)
        victims = sorted((f for f in kept if f.kind == "block"), key=lambda f: (f.mtime, f.path))
        for f in victims:
            if kept_bytes <= target:
                break
            deletions.append(Deletion(f.path, f.tier, f.size, "capacity", now - f.mtime))
            kept_bytes -= f.size
    return Plan(tuple(deletions), used, kept_bytes, live, stale)

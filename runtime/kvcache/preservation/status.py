"""A replica's snapshot-tier record: written by the tier inside vLLM, read by the snapshot GC.

The tier runs in vLLM's scheduler process, which serves no gpupool metrics; the GC sidecar
in the same pod does. The record crosses between them as a small JSON file on the snapshot
volume (both mount it), replaced atomically, so a reader sees the old or the new record,
never half of one. The last record of a replica outlives it: it holds the grace-period
flush, which the replica cannot report itself once it has exited.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

from runtime.atomic_file import write_atomic
from runtime.kvcache.preservation.identity import STATE_DIR
from runtime.kvcache.preservation.volume import Budget, read_record

POD_ENV = "POD_NAME"
"""The pod's name (downward API); the host name, which Kubernetes sets to it, otherwise."""
FIRST_MINUTE_S = 60.0
"""Window after the tier starts in which restored hits count as the restore's payoff."""


class Flush(BaseModel):
    """What the tier had in flight when vLLM shut it down, and what became of it."""

    in_flight_blocks: int
    """Blocks queued or being written when the flush began (written + failed + dropped)."""
    written_blocks: int
    failed_blocks: int
    dropped_blocks: int
    """Still queued when the budget ran out: not on the volume."""
    seconds: float
    budget_s: float


class TierStatus(BaseModel):
    """Counters of one replica's tier since it started (block counts, not tokens)."""

    pod: str
    tier: str
    started_at: float
    """Unix time the tier was created (the engine was loading until then)."""
    lookups: int = 0
    hits: int = 0
    restored_hits: int = 0
    """Hits on blocks this process did not write: restored from an earlier replica's files."""
    restored_hits_first_minute: int = 0
    first_hit_s: float | None = None
    """Seconds from ``started_at`` to the first hit; None until there is one."""
    stored_blocks: int = 0
    store_failures: int = 0
    load_failures: int = 0
    """Blocks found on lookup but unreadable at load (deleted by the GC meanwhile: a miss)."""
    flush: Flush | None = None


def replicas_dir(root: str | Path) -> Path:
    """Where the replicas on the volume under ``root`` keep their records."""
    return Path(root) / STATE_DIR / "replicas"


def status_path(root: str | Path, status: TierStatus) -> Path:
    """The record of one run of a tier: a restarted container (same pod) gets a new one, so
    the previous run's flush is not overwritten before the GC has counted it."""
    return replicas_dir(root) / f"{status.pod}.{status.started_at:.6f}.json"


def write_status(path: Path, status: TierStatus) -> None:
    """Replace the record at ``path`` whole."""
    write_atomic(path, status.model_dump_json())


def read_status(path: Path, budget: Budget | None = None) -> TierStatus | None:
    """The record at ``path``; None when there is none or it is not a record (anything but
    a small regular file is not even opened: ``volume.read_record``)."""
    data = read_record(path, budget or Budget())
    if data is None:
        return None
    try:
        return TierStatus.model_validate(json.loads(data))
    except (ValueError, ValidationError):
        return None

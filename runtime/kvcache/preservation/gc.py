"""The snapshot GC of one flex pod: bound the tier, reclaim what no replica can use, export
what the tier did (its status record) as Prometheus metrics.

Each replica's GC scans the whole shared volume. Several GCs on one volume agree on the
order (the same scan gives the same plan), a file another GC deleted first is skipped,
and a capacity pass stops at ``retention.LOW_WATERMARK`` of the capacity, so two GCs racing
delete at most a few more files than one would. An exited replica's record (its grace-period
flush) is counted by the one GC that renames it first.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from policy import PoolPolicy
from policy.base import duration_seconds
from runtime.kvcache.preservation.retention import REASONS, Plan, plan
from runtime.kvcache.preservation.status import TierStatus, read_status, replicas_dir
from runtime.kvcache.preservation.volume import (
    PASS_BUDGET_S,
    Applied,
    Budget,
    apply,
    mtime,
    records,
    scan,
)

log = logging.getLogger(__name__)

COUNTED = ".counted"
"""Suffix of an exited replica's record once a GC has counted it."""
AGE_BUCKETS = (60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)


@dataclass(frozen=True)
class GcSettings:
    capacity_bytes: int
    reclaim_after_s: float
    interval_s: float
    pass_budget_s: float = PASS_BUDGET_S
    """Longest a pass may walk the volume; what it did not reach waits for the next."""


def settings_for(policy: PoolPolicy, capacity_bytes: int) -> GcSettings:
    """The GC's bounds: the workload's capacity (the pod's argument: the sidecar's policy
    file carries no workloads, ``infra.builders.policy_config``), the policy's timings."""
    if capacity_bytes <= 0:
        raise ValueError(f"expected a capacity of more than 0 bytes, found {capacity_bytes}")
    kv = policy.kv_cache
    return GcSettings(
        capacity_bytes=capacity_bytes,
        reclaim_after_s=duration_seconds(kv.snapshot_reclaim_after),
        interval_s=duration_seconds(kv.snapshot_gc_interval),
    )


class SnapshotGc:
    """GC passes over the volume at ``root`` for the replica ``pod``, with their metrics."""

    def __init__(self, root: Path, pod: str, registry: CollectorRegistry) -> None:
        self.root = root
        self.pod = pod
        self._add_volume_metrics(registry)
        self._add_deletion_metrics(registry)
        self._add_pass_metrics(registry)
        self._add_exit_metrics(registry)
        registry.register(_TierStatusCollector(self))
        self.last_walk: Budget | None = None
        """What the last pass's walk left out (None before the first)."""

    def _add_volume_metrics(self, registry: CollectorRegistry) -> None:
        """What the volume holds: bytes used, the tier's capacity, live and stale tiers."""
        self.used = Gauge(
            "gpupool_kv_tier_used_bytes",
            "Bytes of files on the snapshot volume.",
            registry=registry,
        )
        self.capacity = Gauge(
            "gpupool_kv_tier_capacity_bytes",
            "Bytes the snapshot tier may hold (snapshot_volume.tier_capacity).",
            registry=registry,
        )
        self.tiers = Gauge(
            "gpupool_kv_tier_directories",
            "Tier directories on the volume, live (touched within snapshot_reclaim_after) or not.",
            ["state"],
            registry=registry,
        )

    def _add_deletion_metrics(self, registry: CollectorRegistry) -> None:
        """What the GC deleted, by reason, and how recently the capacity pass's victims were
        used (every reason exported from the start, at 0)."""
        self.deleted_files = Counter(
            "gpupool_kv_tier_deleted_files",
            "Files the snapshot GC deleted, by reason.",
            ["reason"],
            registry=registry,
        )
        self.deleted_bytes = Counter(
            "gpupool_kv_tier_deleted_bytes",
            "Bytes the snapshot GC deleted, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.deleted_files.labels(reason)
            self.deleted_bytes.labels(reason)
        self.evicted_age = Histogram(
            "gpupool_kv_tier_evicted_age_seconds",
            "Time since last use of the blocks a capacity pass deleted (short: tier too small).",
            buckets=AGE_BUCKETS,
            registry=registry,
        )

    def _add_pass_metrics(self, registry: CollectorRegistry) -> None:
        """How the last pass went: its duration, errors, what it passed over, whether it
        finished, and when it ran."""
        self.pass_seconds = Gauge(
            "gpupool_kv_tier_gc_seconds", "Duration of the last GC pass.", registry=registry
        )
        self.errors = Counter(
            "gpupool_kv_tier_gc_errors", "Files the GC could not delete.", registry=registry
        )
        self.passed_over = Gauge(
            "gpupool_kv_tier_gc_passed_over_entries",
            "Entries the last pass walked past: symlinks, FIFOs, devices, sockets, records over "
            "64 KiB, folders it could not list (the GC's log names them).",
            registry=registry,
        )
        self.complete = Gauge(
            "gpupool_kv_tier_gc_complete",
            "1 if the last pass walked the whole volume, 0 if it stopped at its time budget.",
            registry=registry,
        )
        self.last_pass = Gauge(
            "gpupool_kv_tier_gc_last_pass_timestamp_seconds",
            "Unix time of the last GC pass.",
            registry=registry,
        )

    def _add_exit_metrics(self, registry: CollectorRegistry) -> None:
        """How the replicas that stopped on this volume flushed (every label from the start)."""
        self.exits = Counter(
            "gpupool_kv_tier_replica_exits",
            "Replicas on this volume that stopped, by how their grace-period flush ended "
            "(complete, partial: writes dropped at the budget, none: killed without one).",
            ["flush"],
            registry=registry,
        )
        self.flushed = Counter(
            "gpupool_kv_tier_flush_blocks",
            "Blocks in flight at the stop of exited replicas, by outcome.",
            ["outcome"],
            registry=registry,
        )
        for state in ("complete", "partial", "none"):
            self.exits.labels(state)
        for outcome in ("written", "failed", "dropped"):
            self.flushed.labels(outcome)

    def run_once(self, settings: GcSettings, now: float | None = None) -> tuple[Plan, Applied]:
        """One pass: scan, plan, delete, count exited replicas; metrics updated. An entry
        it cannot use (a FIFO, a symlink, an oversized record) is passed over and logged,
        and the rest of the pass goes on: what is over capacity is still deleted."""
        start = time.monotonic()
        at = time.time() if now is None else now
        budget = self.last_walk = Budget(settings.pass_budget_s)
        found = scan(self.root, budget)
        decided = plan(
            found.files,
            found.heartbeats,
            now=at,
            capacity_bytes=settings.capacity_bytes,
            reclaim_after_s=settings.reclaim_after_s,
            complete=found.complete,
        )
        done = apply(self.root, decided, budget)
        for reason, n in done.deleted_files.items():
            self.deleted_files.labels(reason).inc(n)
            self.deleted_bytes.labels(reason).inc(done.deleted_bytes[reason])
        for age in done.capacity_ages_s:
            self.evicted_age.observe(age)
        self.errors.inc(len(done.errors))
        for error in done.errors:
            log.warning("snapshot GC: cannot delete %s", error)
        self._count_exits(at, settings.reclaim_after_s, budget)
        if (left_out := budget.report()) is not None:
            log.warning("snapshot GC: %s", left_out)
        self.passed_over.set(budget.skipped)
        self.complete.set(0 if budget.expired else 1)
        self.used.set(decided.used_bytes - sum(done.deleted_bytes.values()))
        self.capacity.set(settings.capacity_bytes)
        live = len(decided.live_tiers)
        self.tiers.labels("live").set(live)
        self.tiers.labels("stale").set(len(found.heartbeats) - live)
        self.pass_seconds.set(time.monotonic() - start)
        self.last_pass.set(at)
        if decided.deletions:
            log.info(
                "snapshot GC: %s; %d bytes in use of %d",
                ", ".join(f"{n} files {r}" for r, n in done.deleted_files.items()) or "nothing",
                decided.kept_bytes,
                settings.capacity_bytes,
            )
        return decided, done

    def own_status(self) -> TierStatus | None:
        """The record of this pod's running tier (its newest), if it has started."""
        return self._own_newest(self._records(Budget()))

    def _records(self, budget: Budget) -> dict[Path, TierStatus | None]:
        """Every file in the replicas' folder, each read once: its record, or None (counted
        already, or not a record)."""
        return {
            path: None if path.name.endswith(COUNTED) else read_status(path, budget)
            for path in records(replicas_dir(self.root), budget)
        }

    def _own_newest(self, found: dict[Path, TierStatus | None]) -> TierStatus | None:
        mine = [
            record
            for path, record in found.items()
            if record is not None and path.name.startswith(f"{self.pod}.")
        ]
        return max(mine, key=lambda r: r.started_at, default=None)

    def _count_exits(self, now: float, reclaim_after_s: float, budget: Budget) -> None:
        """Count each exited replica's record once, then delete counted ones when old."""
        found = self._records(budget)
        current = self._own_newest(found)
        for path, record in found.items():
            age = now - mtime(path)
            if path.name.endswith(COUNTED):
                if age > reclaim_after_s:
                    path.unlink(missing_ok=True)
                continue
            if record is None or record == current:
                continue
            if record.flush is None and age <= reclaim_after_s:
                continue  # running (it rewrites its record every heartbeat)
            try:
                os.rename(path, path.with_name(path.name + COUNTED))
            except FileNotFoundError:
                continue  # another GC counted it
            flush = record.flush
            if flush is None:
                self.exits.labels("none").inc()
                continue
            self.exits.labels("partial" if flush.dropped_blocks else "complete").inc()
            self.flushed.labels("written").inc(flush.written_blocks)
            self.flushed.labels("failed").inc(flush.failed_blocks)
            self.flushed.labels("dropped").inc(flush.dropped_blocks)


class _TierStatusCollector(Collector):
    """The pod's running tier, as the tier counted it (absent until it has started)."""

    def __init__(self, gc: SnapshotGc) -> None:
        self.gc = gc

    def collect(self) -> Iterator[Metric]:
        status = self.gc.own_status()
        if status is None:
            return
        for name, value, doc in (
            ("lookups", status.lookups, "Block lookups answered (hit or miss)."),
            ("hits", status.hits, "Blocks found in the tier."),
            ("restored_hits", status.restored_hits, "Hits on blocks an earlier replica wrote."),
            ("stored_blocks", status.stored_blocks, "Blocks written to the tier."),
            ("store_failures", status.store_failures, "Blocks whose write failed."),
            ("load_failures", status.load_failures, "Blocks found but gone at load (a miss)."),
        ):
            yield CounterMetricFamily(f"gpupool_kv_tier_{name}", doc, value=value)
        yield GaugeMetricFamily(
            "gpupool_kv_tier_restored_hits_first_minute",
            "Restored hits in the first minute after the tier started.",
            value=status.restored_hits_first_minute,
        )
        yield GaugeMetricFamily(
            "gpupool_kv_tier_started_timestamp_seconds",
            "Unix time the tier started (the engine had loaded).",
            value=status.started_at,
        )
        if status.first_hit_s is not None:
            yield GaugeMetricFamily(
                "gpupool_kv_tier_first_hit_seconds",
                "Seconds from the tier's start to its first hit.",
                value=status.first_hit_s,
            )

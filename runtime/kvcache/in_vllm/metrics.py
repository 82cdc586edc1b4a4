"""Prometheus metrics of KV compaction; each owner passes its own registry (tests, no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class CompactionMetrics:
    """What the plugin reports from inside the engine (served through the sidecar)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.compactions = Counter(
            "gpupool_kv_compactions",
            "Compaction requests by outcome (done, deferred, refused, failed, noop).",
            ["outcome"],
            registry=registry,
        )
        self.resizes = Counter(
            "gpupool_kv_resizes",
            "Pool resizes done, by direction (shrink, grow).",
            ["direction"],
            registry=registry,
        )
        self.blocks_moved = Counter(
            "gpupool_kv_blocks_moved", "KV blocks relocated.", registry=registry
        )
        self.bytes_moved = Counter(
            "gpupool_kv_bytes_moved", "KV bytes copied by relocations.", registry=registry
        )
        self.pause_seconds = Histogram(
            "gpupool_kv_pause_seconds",
            "Time the engine paused between two steps for a compaction, shrink or grow.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.fragmentation = Gauge(
            "gpupool_kv_fragmentation",
            "Occupied blocks above the packed watermark over occupied blocks (0 = packed).",
            registry=registry,
        )
        self.usable_blocks = Gauge(
            "gpupool_kv_usable_blocks", "Blocks the pool may hand out now.", registry=registry
        )
        self.released_bytes = Gauge(
            "gpupool_kv_memory_released_bytes",
            "KV allocation given back by shrink, relative to the size the engine started with.",
            registry=registry,
        )
        self.released_measured_bytes = Gauge(
            "gpupool_kv_memory_released_measured_bytes",
            "Memory the last resize measurably returned (RSS on CPU, reserved bytes on CUDA).",
            registry=registry,
        )
        self.resize_peak_extra_bytes = Gauge(
            "gpupool_kv_resize_peak_extra_bytes",
            "Most memory any rank held during the last resize beyond the larger of its old "
            "and new pool (one layer where a whole new buffer would need the smaller pool).",
            registry=registry,
        )

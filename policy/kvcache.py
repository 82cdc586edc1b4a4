"""Paged KV-cache sizing, prefix caching and the compaction trigger of flex vLLM instances."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from policy.base import INT32_MAX, Duration, Fraction, Invariants, StrictModel

PrefixHashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
"""vLLM 0.32's ``--prefix-caching-hash-algo`` values (vllm/config/cache.py)."""

SEEDLESS_HASH_ALGOS = ("xxhash", "xxhash_cbor")
"""Algorithms whose block-hash seed vLLM draws at random per process unless ``PYTHONHASHSEED``
is set (vllm/v1/core/kv_cache_utils.py ``resolve_none_hash_seed``): a restarted engine
computes other hashes, so every block it restored from the snapshot tier would miss."""

KvCacheDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""Values of vLLM's ``--kv-cache-dtype`` that gpupool accepts."""


class KvCache(StrictModel):
    """KV cache of every flex vLLM instance; vLLM sizes pages in tokens, gpupool in bytes."""

    page_bytes_target: int = Field(4096, ge=256, le=16 * 1024 * 1024)
    """Target bytes of one KV page per layer; translated to the nearest block size in tokens
    that the attention backend supports (``gpupool vllm-args`` shows the translation)."""
    max_gpu_memory_share: Fraction = 0.75
    """Most of a GPU's memory the KV cache may take, leaving headroom for bursts (default: 75 %)."""
    activation_reserve_share: Fraction = 0.08
    """Share of GPU memory kept for activations, CUDA graphs and the allocator's slack."""
    page_table_max_usage: Fraction = 0.80
    """KV block usage above which an instance counts as full (default: page table max 80 %)."""
    prefix_caching: bool = True
    """vLLM automatic prefix caching (``--enable-prefix-caching``)."""
    cache_dtype: KvCacheDtype = "auto"
    """vLLM ``--kv-cache-dtype``; ``auto`` follows the model dtype."""
    kv_preservation: Literal["filesystem", "cpu", "off"] = "off"
    """How a flex instance keeps its KV across eviction: ``filesystem`` offloads blocks through
    a host-memory tier to files on the snapshot volume (vLLM OffloadingConnector, tiered spec),
    so a rescheduled replica finds them; ``cpu`` keeps a host-memory tier only (survives
    preemption of requests, not of the pod); ``off`` disables offloading. Both connectors
    hold block ids and the KV buffer, which KV compaction changes under them: a workload
    with ``kv_compaction`` needs ``off`` (docs/kvcache.md, Connectors)."""
    prefix_caching_hash_algo: PrefixHashAlgo = "sha256"
    """vLLM ``--prefix-caching-hash-algo``. The prefix hashes name the snapshot tier's files,
    so a restarted or rescheduled replica finds its blocks only if it hashes alike: sha256
    uses a fixed seed; the xxhash variants need ``python_hash_seed`` with
    ``kv_preservation: filesystem``."""
    python_hash_seed: int | None = Field(None, ge=0, le=4294967295)
    """``PYTHONHASHSEED`` of the vLLM container (unset: not set). It seeds vLLM's block
    hashes, so every replica sharing a snapshot volume must use the same value."""
    snapshot_reclaim_after: Duration = "15m"
    """A snapshot-tier directory no live replica has touched for this long is reclaimed once a
    replica of another vLLM version, model or layout is live on the volume; a partial write
    this old is a writer that died. Longer than a rolling update (docs/preservation.md)."""
    snapshot_gc_interval: Duration = "1m"
    """How often the snapshot GC scans the volume and enforces ``tier_capacity``."""
    offload_host_gib: float = Field(16.0, gt=0, le=4096)
    """Host memory (GiB) of the CPU tier every offloaded block passes through (vLLM
    ``cpu_bytes_to_use``); must fit in the workload's container memory."""
    compaction_usage_below: Fraction = 0.50
    """Compact (then shrink) when KV block usage stays below this share."""
    compaction_min_interval: Duration = "5m"
    """Shortest time between two compactions of one instance (Prometheus duration)."""
    compaction_max_moves: int = Field(4096, ge=1, le=INT32_MAX)
    """Most KV blocks one compaction pass moves while the engine pauses; a larger backlog is
    packed over several passes, highest blocks first (bounds the pause on a big pool)."""
    shrink_target_usage: Fraction = 0.60
    """After compaction the sidecar shrinks the pool so the blocks requests hold, plus the
    prefix cache it keeps (``shrink_prefix_cache_share``), fill this share; between
    ``compaction_usage_below`` and ``page_table_max_usage`` so a shrink neither re-triggers
    compaction nor makes the instance count as full."""
    shrink_prefix_cache_share: Fraction = 0.10
    """Prefix-cache budget of a shrink target: of the cached blocks no request holds, it
    counts at most this share of the pool the engine started with (counting all of them, a
    warm cache, where every block once used keeps its hash, would never let the pool
    shrink). Cached blocks the shrunk pool cannot hold are evicted, least recently used
    first; 0 keeps only those that fit in the headroom. Below ``shrink_target_usage``."""
    compaction_poll_interval: Duration = "15s"
    """How often the compaction sidecar reads the instance's metrics and decides."""
    compaction_sidecar_port: int = Field(9400, ge=1024, le=65535)
    """Port of the sidecar's ``/metrics`` (Prometheus) and ``POST /shrink`` (tuner, webhook)."""

    @model_validator(mode="after")
    def _fits(self) -> KvCache:
        found = Invariants()
        found.require(
            self.max_gpu_memory_share + self.activation_reserve_share < 1.0,
            "max_gpu_memory_share",
            f"max_gpu_memory_share ({self.max_gpu_memory_share}) + activation_reserve_share "
            f"({self.activation_reserve_share}) must stay below 1: the weights need the rest",
        )
        found.require(
            self.compaction_usage_below < self.page_table_max_usage,
            "compaction_usage_below",
            f"compaction_usage_below ({self.compaction_usage_below}) must be below "
            f"page_table_max_usage ({self.page_table_max_usage}); a full cache is not "
            "worth compacting",
        )
        found.require(
            self.compaction_usage_below < self.shrink_target_usage < self.page_table_max_usage,
            "shrink_target_usage",
            f"shrink_target_usage ({self.shrink_target_usage}) must lie between "
            f"compaction_usage_below ({self.compaction_usage_below}) and page_table_max_usage "
            f"({self.page_table_max_usage}): a shrunk pool must neither re-trigger compaction "
            "nor count as full",
        )
        found.require(
            self.shrink_prefix_cache_share < self.shrink_target_usage,
            "shrink_prefix_cache_share",
            f"shrink_prefix_cache_share ({self.shrink_prefix_cache_share}) must be below "
            f"shrink_target_usage ({self.shrink_target_usage}): a warm prefix cache would size "
            "every shrink target at or above the whole pool; lower shrink_prefix_cache_share",
        )
        found.require(
            self.kv_preservation != "filesystem"
            or self.prefix_caching_hash_algo not in SEEDLESS_HASH_ALGOS
            or self.python_hash_seed is not None,
            "prefix_caching_hash_algo",
            f"kv_preservation: filesystem with prefix_caching_hash_algo "
            f"{self.prefix_caching_hash_algo!r} and no python_hash_seed: vLLM seeds xxhash "
            "block hashes at random per process, so a restarted replica would miss every "
            "block it restored; expected prefix_caching_hash_algo sha256 or sha256_cbor, or "
            "kv_cache.python_hash_seed set",
        )
        found.raise_if_any()
        return self

"""Which engines the plugin may compact, shrink or grow: refused before anything moves.

A relocation renames block ids in the scheduler's pool and the workers' block tables, and a
resize swaps the workers' KV buffer. Anything else that holds block ids or the buffer would
be left pointing at the wrong data, silently:

* a KV connector (vLLM's OffloadingConnector, LMCache, NIXL, ...) keeps block ids of pending
  stores and loads, and registered the buffer at start; it would store stale blocks under
  correct prefix hashes (on a shared snapshot volume: corruption that survives restarts),
  and its transfers after a resize would use the freed buffer;
* a model with several KV cache groups (hybrid, sliding window beside full attention),
  Mamba / linear-attention state, or specs other than full attention, MLA and one sliding
  window (chunked local, cross attention, sinks) keeps block ids the plugin does not rename
  or relies on per-group semantics it does not reproduce;
* layers that share another layer's KV (``kv_sharing_target_layer_name``) alias its buffer.

Pure functions of vLLM's own config objects; the controller asks once per engine.
"""

from __future__ import annotations

from typing import Any

SUPPORTED_SPECS = frozenset({"FullAttentionSpec", "MLAAttentionSpec", "SlidingWindowSpec"})
"""KV cache spec classes (exact type, not subclasses) the relocation handles. A sliding
window's freed blocks stay in the worker's tables; the rename turns them into the null
block (``worker_side.rename``)."""


def engine_refusal(kv_transfer_config: Any, kv_cache_config: Any) -> str | None:
    """Why the plugin must not touch this engine's KV cache, or None when it may."""
    connector = getattr(kv_transfer_config, "kv_connector", None)
    if connector:
        return (
            f"a KV connector ({connector}) is configured: it holds block ids and the KV buffer, "
            "which compaction and resize would change under it (stale blocks stored under "
            "correct prefix hashes); turn kv_cache.kv_preservation off or kv_compaction off "
            "(docs/kvcache.md, Connectors)"
        )
    groups = list(getattr(kv_cache_config, "kv_cache_groups", ()))
    if len(groups) != 1:
        return (
            f"the model has {len(groups)} KV cache groups (hybrid or mixed attention); the "
            "plugin renames the block ids of a single full-attention group only"
        )
    spec = type(groups[0].kv_cache_spec).__name__
    if spec not in SUPPORTED_SPECS:
        return (
            f"the model's KV cache spec is {spec}; the plugin handles "
            f"{' and '.join(sorted(SUPPORTED_SPECS))} only"
        )
    return None


def worker_refusal(model_runner: Any) -> str | None:
    """Why one worker's KV cache cannot be relocated, or None: layers sharing another
    layer's KV."""
    shared = dict(getattr(model_runner, "shared_kv_cache_layers", {}) or {})
    if shared:
        first = next(iter(shared.items()))
        return (
            f"{len(shared)} layers share another layer's KV cache (e.g. {first[0]} -> "
            f"{first[1]}); the plugin does not relocate shared KV"
        )
    return None

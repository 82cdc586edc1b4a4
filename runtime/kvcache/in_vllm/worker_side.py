"""Worker-side half of a relocation or resize: KV tensors and the per-request block tables.

Runs in vLLM's worker process (called by name through ``collective_rpc``) between two
engine steps. Block tables there are plain integers: ``CachedRequestState.block_ids`` and the
persistent batch's ``BlockTable`` rows (the device copy is re-committed from the CPU rows
every step, and slot mappings are rebuilt every step), so a relocation rewrites both through
one lookup table after the data is copied.
"""

from __future__ import annotations

import ctypes
import gc
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from runtime.kvcache.in_vllm.mover import BlockMover, LayoutUnsupported, page_geometry
from runtime.kvcache.in_vllm.support import engine_refusal
from runtime.kvcache.limits import Strategy
from runtime.kvcache.planner import NULL_BLOCK, Move

_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)
"""glibc's ``malloc_trim`` (None with another C library)."""


class ResizeUnsupported(RuntimeError):
    """The KV layout is not one this resize knows how to narrow or widen."""


class RunnerUnsupported(RuntimeError):
    """The model runner keeps block tables where this module does not look (Model Runner V2)."""


def _require_v1_runner(runner: Any) -> None:
    """Refuse, before touching anything, a runner whose block tables live elsewhere."""
    if not (hasattr(runner, "requests") and hasattr(runner, "input_batch")):
        raise RunnerUnsupported(
            f"{type(runner).__name__} is not vLLM's V1 model runner; set "
            "VLLM_USE_V2_MODEL_RUNNER=0 on instances that compact "
            "(infra.builders.compaction_sidecar does)"
        )


def relocate(runner: Any, moves: list[Move], strategy: Strategy = "runs") -> int:
    """Copy each move's block in every layer, then rename ids in all block tables."""
    _require_v1_runner(runner)
    mover = BlockMover(runner.kv_caches, strategy, num_blocks=runner.kv_cache_config.num_blocks)
    copied = mover.move(moves)
    rename(runner, moves)
    return copied


def rename(runner: Any, moves: list[Move]) -> None:
    """Rewrite ids ``src -> dst`` in every block table: each request's
    ``CachedRequestState.block_ids`` (what its rows are rebuilt from when it is scheduled
    again) and the persistent batch's rows.

    A table entry that names a destination, or an id beyond the pool, is stale: the
    scheduler freed that block (a sliding window slid past it, or the request finished or
    was preempted and leaves at the next step), and the worker is never told. Stale entries
    become the null block, so no table names a block that now holds other data or no
    longer exists (after a shrink); attention never reads them."""
    tables = [table.block_table.np for table in runner.input_batch.block_table.block_tables]
    num_blocks = runner.kv_cache_config.num_blocks
    highest = max(
        num_blocks - 1,
        *(i for m in moves for i in m),
        *(int(rows.max(initial=0)) for rows in tables),
        *(max(ids, default=0) for s in runner.requests.values() for ids in s.block_ids),
    )
    lookup = np.arange(highest + 1, dtype=np.int64)
    lookup[num_blocks:] = NULL_BLOCK
    for move in moves:
        lookup[move.dst] = NULL_BLOCK
    for move in moves:
        lookup[move.src] = move.dst
    for state in runner.requests.values():
        for ids in state.block_ids:
            ids[:] = lookup[np.asarray(ids, dtype=np.int64)].tolist()
    for rows in tables:
        rows[:] = lookup[rows]


def rollback(runner: Any, moves: list[Move]) -> None:
    """Undo this rank's ``rename`` of a pass that failed somewhere: ``dst -> src``.

    Destinations were free before the pass, so only stale entries (never read) can have
    named them: every live id this rank renamed is renamed back, and a rank that never
    renamed keeps its live ids. The copies into the destinations are never read (the
    scheduler still counts them free)."""
    _require_v1_runner(runner)
    rename(runner, [Move(m.dst, m.src) for m in moves])


def resident_bytes() -> int:
    """Resident set size of this process (what a CPU-backed KV pool returns on release)."""
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_resident_bytes() -> int:
    """The kernel's high-water mark of this process's RSS (``VmHWM``) since its last reset."""
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/{os.getpid()}/status has no VmHWM line")


def _device_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return int(torch.cuda.memory_reserved(device))
    return resident_bytes()


def _reset_peak(device: torch.device) -> bool:
    """Start the peak over from what the process holds now; False where it cannot be."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as refs:
            refs.write("5")  # 5: reset VmHWM to the current RSS (proc(5))
    except OSError:
        return False
    return True


class MemoryWatch:
    """What this process holds on ``device`` from now on: how much it got back, and its peak.

    Measured, not sampled. CPU: resident set size, and the kernel's own high-water mark of it
    (``VmHWM``), reset to the current RSS at the start (``5`` into ``/proc/<pid>/clear_refs``),
    so every page touched in between counts however briefly it lived. CUDA: the caching
    allocator's reserved bytes after ``empty_cache`` (what the process holds from the driver)
    and their peak (``reset_peak_memory_stats``, ``max_memory_reserved``).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start_bytes = _device_bytes(device)
        self._peak_reset = _reset_peak(device)

    def released_bytes(self) -> int:
        """How much less the process holds now than at the start."""
        return self.start_bytes - _device_bytes(self.device)

    def peak_extra_bytes(self) -> int | None:
        """The most it held in between above both the start and now: what an operation
        needed beyond the larger of its before and after (a grow's new pool is not extra).
        None where the peak cannot be reset."""
        if not self._peak_reset:
            return None
        now = _device_bytes(self.device)
        if self.device.type == "cuda":
            peak = int(torch.cuda.max_memory_reserved(self.device))
        else:
            peak = _peak_resident_bytes()
        return peak - max(self.start_bytes, now)


@dataclass(frozen=True)
class ResizeResult:
    """Bytes of the KV allocation before and after, and what the device measurably did."""

    old_bytes: int
    new_bytes: int
    released_bytes: int
    """RSS drop on CPU, drop in the CUDA caching allocator's reserved bytes on GPU."""
    peak_extra_bytes: int | None
    """The most the process held during the resize beyond the larger of the old and the new
    pool (``MemoryWatch``): one layer's allocation, where a whole new buffer would need the
    smaller pool."""


def resize(runner: Any, num_blocks: int) -> ResizeResult:
    """Bring every layer's KV to ``num_blocks`` blocks, one layer at a time.

    An allocation is freed whole, so a pool cannot be cut in place: each layer in turn gets a
    fresh allocation of ``num_blocks`` blocks in vLLM's own layout, its first
    ``min(old, new)`` blocks are copied, it is re-bound (``runner.kv_caches``, its attention
    layer, its ``kv_cache_config.kv_cache_tensors`` entry) and its old allocation is freed
    before the next layer allocates. The memory a resize needs beyond the larger of the two
    pools is therefore one layer (a shrink's new one, a grow's old one) where a whole new
    buffer would need the smaller pool. That needs every layer in an allocation of its own
    (``allocate_per_layer`` makes them at start; a shared one is refused).

    A failure (e.g. an allocation the device cannot serve) puts the layers already resized
    back and re-raises, so the rank keeps its old pool: a grown layer is narrowed to its old
    blocks (no allocation), a shrunk one re-allocated at its old size (its blocks at or
    above ``num_blocks``, which the controller emptied before the resize, come back zeroed).
    Layers already at ``num_blocks`` are left alone, so resizing a rank back after another
    rank failed moves only what moved.
    """
    _require_v1_runner(runner)
    device = runner.kv_caches[0].device
    mode = getattr(runner.compilation_config, "cudagraph_mode", None)
    if device.type == "cuda" and mode is not None and mode.has_full_cudagraphs():
        raise ResizeUnsupported(
            "full CUDA graphs captured the KV buffer's address; resize needs "
            """--compilation-config '{"cudagraph_mode": "PIECEWISE"}' or --enforce-eager"""
        )
    layers = _own_layers(runner)
    watch = MemoryWatch(device)
    _resize_layers(runner, layers, num_blocks)
    runner.kv_cache_config.num_blocks = num_blocks
    gc.collect()
    return ResizeResult(
        sum(layer.entry.size for layer in layers),
        sum(entry.size for entry in runner.kv_cache_config.kv_cache_tensors),
        watch.released_bytes(),
        watch.peak_extra_bytes(),
    )


class ResizeNotRestored(RuntimeError):
    """A resize failed and putting a layer back failed too: layers are at mixed sizes until
    a resize of this rank succeeds (the controller resizes every rank back next)."""


@dataclass(frozen=True)
class _LayerKV:
    """One layer's KV as a resize sees it: ``blocks`` whole pages ``block_stride`` apart, in
    an allocation of its own described by ``kv_cache_config.kv_cache_tensors[slot]``."""

    name: str
    slot: int
    index: int
    """Position of its view in ``runner.kv_caches``."""
    blocks: int
    entry: Any


def _own_layers(runner: Any) -> list[_LayerKV]:
    """Every layer's KV, checked before anything changes: one layer per allocation, blocks
    outermost and one page each (LBHNC, LBNHC, MLA, padded pages, kernel blocks)."""
    context = runner.compilation_config.static_forward_context
    position = {view.data_ptr(): i for i, view in enumerate(runner.kv_caches)}
    layers = []
    for slot, entry in enumerate(runner.kv_cache_config.kv_cache_tensors):
        if len(entry.layers) != 1 or entry.size != entry.layer_stride or entry.host_resident:
            raise ResizeUnsupported(
                f"the KV of {', '.join(entry.layers)} is not in an allocation of its own "
                f"({entry.size} bytes, vLLM's, not worker_side.allocate_per_layer's): none "
                "of it could be freed before every layer in it had a new allocation"
            )
        (name,) = entry.layers
        index = position.get(context[name].kv_cache.data_ptr())
        blocks = entry.layer_stride // entry.block_stride
        if index is None or blocks < 1 or entry.layer_stride != blocks * entry.block_stride:
            raise ResizeUnsupported(
                f"KV of {name} is not {entry.layer_stride} bytes of whole blocks "
                f"{entry.block_stride} bytes apart in runner.kv_caches"
            )
        try:
            geometry = page_geometry(runner.kv_caches[index], blocks)
        except LayoutUnsupported as exc:
            raise ResizeUnsupported(f"KV of {name}: {exc}") from exc
        if geometry.chunks != 1 or geometry.block_stride != entry.block_stride:
            raise ResizeUnsupported(
                f"KV of {name} keeps a block in {geometry.chunks} chunks "
                f"{geometry.block_stride} bytes per block apart; a resize needs blocks "
                "outermost in the layer, one page each"
            )
        layers.append(_LayerKV(name, slot, index, blocks, entry))
    return layers


def _resize_layers(runner: Any, layers: list[_LayerKV], num_blocks: int) -> None:
    done: list[_LayerKV] = []
    try:
        for layer in layers:
            if layer.blocks != num_blocks:
                _reallocate(runner, layer, num_blocks)
                done.append(layer)
    except Exception as failure:
        for layer in reversed(done):
            try:
                _put_back(runner, layer, num_blocks)
            except Exception as exc:
                raise ResizeNotRestored(
                    f"resizing the KV to {num_blocks} blocks failed ({failure}) and putting "
                    f"{layer.name} back at {layer.blocks} blocks failed too ({exc})"
                ) from exc
        raise


def _put_back(runner: Any, layer: _LayerKV, num_blocks: int) -> None:
    """Undo ``_reallocate(runner, layer, num_blocks)``: a grown layer's first ``layer.blocks``
    blocks are its old pool (narrowed, nothing allocated); a shrunk one is re-allocated."""
    if num_blocks > layer.blocks:
        view = runner.kv_caches[layer.index]
        _bind(runner, layer, view[: view.shape[0] // num_blocks * layer.blocks], layer.entry)
    else:
        _reallocate(runner, replace(layer, blocks=num_blocks), layer.blocks)


def _own_entry(name: str, block_stride: int, num_blocks: int) -> Any:
    """The ``KVCacheTensor`` of one layer in an allocation of its own."""
    from vllm.v1.kv_cache_interface import KVCacheTensor

    size = num_blocks * block_stride
    return KVCacheTensor(size=size, layers=[name], layer_stride=size, block_stride=block_stride)


def _reallocate(runner: Any, layer: _LayerKV, num_blocks: int) -> None:
    """Give ``layer`` a fresh allocation of ``num_blocks`` blocks holding its first
    ``min(layer.blocks, num_blocks)``, bind it, and free the old one (before returning)."""
    from vllm.v1.worker import utils

    old = runner.kv_caches[layer.index]
    entry = _own_entry(layer.name, layer.entry.block_stride, num_blocks)
    config = replace(runner.kv_cache_config, num_blocks=num_blocks, kv_cache_tensors=[entry])
    layout = runner.cache_config.get_resolved_kv_cache_layout()
    (new,) = utils.allocate_kv_cache(
        config, old.device, layout, runner._kernel_block_sizes
    ).values()
    rows = old.shape[0] // layer.blocks * min(layer.blocks, num_blocks)
    new[:rows].copy_(old[:rows])
    del old
    _bind(runner, layer, new, entry)
    _hand_back(new.device)


def _hand_back(device: torch.device) -> None:
    """Return freed memory to the driver or the OS now, before the next layer allocates.

    CUDA: ``empty_cache``, else the caching allocator would carve the next layer out of the
    freed one and pin its whole segment. CPU: glibc's ``malloc_trim``, else a freed layer
    that glibc placed on its heap (allocations below its adaptive mmap threshold) stays
    resident in the process."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif _TRIM is not None:
        _TRIM(0)


def _bind(runner: Any, layer: _LayerKV, view: torch.Tensor, entry: Any) -> None:
    """Make ``view`` the layer's KV everywhere vLLM reads it, as ``initialize_kv_cache`` does."""
    from vllm.v1.worker.utils import map_kv_caches_to_kernel_blocks

    groups = [group for per_cache_group in runner.attn_groups for group in per_cache_group]
    if runner.speculative_config:
        groups += getattr(runner.drafter, "draft_attn_groups", [])
    (bound,) = map_kv_caches_to_kernel_blocks({layer.name: view}, groups).values()
    runner.kv_caches[layer.index] = view
    runner.compilation_config.static_forward_context[layer.name].bind_kv_cache(bound)
    runner.kv_cache_config.kv_cache_tensors[layer.slot] = entry


def allocate_per_layer(
    kv_cache_config: Any,
    device: torch.device,
    layout: Any,
    kernel_block_sizes: list[int] | None = None,
) -> dict[str, torch.Tensor]:
    """vLLM 0.32's ``allocate_kv_cache``, one allocation per layer where the plugin resizes.

    vLLM places every layer in one backing allocation (``KVCacheTensor`` entries are offsets
    into it) and an allocation is freed whole, so resizing it would hold the old and the new
    pool at once. This makes the same views (shape, strides, dtype, kernel blocks: vLLM's
    own ``allocate_kv_cache`` called per layer) in one allocation each, and leaves
    ``kv_cache_config.kv_cache_tensors`` with one entry per layer describing it (``size`` =
    ``layer_stride`` = blocks x ``block_stride``, offset 0). Engines the plugin refuses (a
    KV connector, several groups, other specs) and layouts whose layers are not runs of
    whole blocks (blocks outermost, heads outside blocks) keep vLLM's allocation.
    """
    from vllm.distributed.kv_transfer import has_kv_transfer_group
    from vllm.v1.worker import utils

    blocks = kv_cache_config.num_blocks
    tensors = kv_cache_config.kv_cache_tensors
    if (
        has_kv_transfer_group()
        or engine_refusal(None, kv_cache_config) is not None
        or not all(
            not t.host_resident and t.layer_stride == blocks * t.block_stride for t in tensors
        )
    ):
        views: dict[str, torch.Tensor] = utils.allocate_kv_cache(
            kv_cache_config, device, layout, kernel_block_sizes
        )
        return views
    own = [_own_entry(name, t.block_stride, blocks) for t in tensors for name in t.layers]
    views = {}
    for entry in own:
        one = replace(kv_cache_config, kv_cache_tensors=[entry])
        views.update(utils.allocate_kv_cache(one, device, layout, kernel_block_sizes))
    kv_cache_config.kv_cache_tensors = own
    return views


def install_per_layer_allocation() -> None:
    """Have vLLM's model runner (GPU and CPU) allocate the KV with ``allocate_per_layer``."""
    from vllm.v1.worker import gpu_model_runner

    gpu_model_runner.allocate_kv_cache = allocate_per_layer  # type: ignore[attr-defined]

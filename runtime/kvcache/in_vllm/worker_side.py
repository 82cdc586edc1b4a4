"""Worker-side half of a relocation or resize: KV tensors and the per-request block tables.

Runs in vLLM's worker process (called by name through ``collective_rpc``) between two
engine steps. Block tables there are plain integers: ``CachedRequestState.block_ids`` and the
persistent batch's ``BlockTable`` rows (the device copy is re-committed from the CPU rows
every step, and slot mappings are rebuilt every step), so a relocation rewrites both through
one lookup table after the data is copied.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from runtime.kvcache.in_vllm.mover import BlockMover
from runtime.kvcache.limits import Strategy
from runtime.kvcache.planner import Move


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


def _layer_views(runner: Any) -> dict[str, torch.Tensor]:
    context = runner.compilation_config.static_forward_context
    return {
        name: context[name].kv_cache
        for group in runner.kv_cache_config.kv_cache_groups
        for name in group.layer_names
    }


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
    again) and the persistent batch's rows. Ids the lookup does not cover pass through."""
    if not moves:
        return
    tables = [table.block_table.np for table in runner.input_batch.block_table.block_tables]
    highest = max(
        runner.kv_cache_config.num_blocks - 1,
        *(i for m in moves for i in m),
        *(int(rows.max(initial=0)) for rows in tables),
        *(max(ids, default=0) for s in runner.requests.values() for ids in s.block_ids),
    )
    lookup = np.arange(highest + 1, dtype=np.int64)
    for move in moves:
        lookup[move.src] = move.dst
    for state in runner.requests.values():
        for ids in state.block_ids:
            ids[:] = lookup[np.asarray(ids, dtype=np.int64)].tolist()
    for rows in tables:
        rows[:] = lookup[rows]


def rollback(runner: Any, moves: list[Move]) -> None:
    """Undo this rank's ``rename`` of a pass that failed somewhere: ``dst -> src``.

    Destinations were free before the pass, so no table held them: only ids this rank
    renamed are renamed back, and a rank that never renamed is left as it is. The copies
    into the destinations are never read (the scheduler still counts them free)."""
    _require_v1_runner(runner)
    rename(runner, [Move(m.dst, m.src) for m in moves])


def resident_bytes() -> int:
    """Resident set size of this process (what a CPU-backed KV pool returns on release)."""
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ResizeResult:
    """Bytes of the KV allocation before and after, and what the device measurably got back."""

    old_bytes: int
    new_bytes: int
    released_bytes: int
    """RSS drop on CPU, drop in the CUDA caching allocator's reserved bytes on GPU."""


def _device_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return int(torch.cuda.memory_reserved(device))
    return resident_bytes()


def resize(runner: Any, num_blocks: int) -> ResizeResult:
    """Re-bind every layer's KV view to a buffer of ``num_blocks`` blocks; free the old one.

    The layer dimension is outermost, so the pool cannot be cut in place: each layer's first
    ``min(old, new)`` blocks are copied into a fresh allocation with the same layout, the
    attention layers and ``runner.kv_caches`` are re-bound, and the old storage is dropped.
    """
    _require_v1_runner(runner)
    device = runner.kv_caches[0].device
    mode = getattr(runner.compilation_config, "cudagraph_mode", None)
    if device.type == "cuda" and mode is not None and mode.has_full_cudagraphs():
        raise ResizeUnsupported(
            "full CUDA graphs captured the KV buffer's address; resize needs "
            """--compilation-config '{"cudagraph_mode": "PIECEWISE"}' or --enforce-eager"""
        )
    before = _device_bytes(device)
    old_bytes, new_bytes = _rebind(runner, num_blocks)
    gc.collect()
    return ResizeResult(old_bytes, new_bytes, before - _device_bytes(device))


def _rebind(runner: Any, num_blocks: int) -> tuple[int, int]:
    config = runner.kv_cache_config
    old_num = config.num_blocks
    views = _layer_views(runner)
    device = runner.kv_caches[0].device
    old_bytes = new_bytes = 0
    rebound: dict[int, torch.Tensor] = {}
    for tensor in config.kv_cache_tensors:
        if tensor.offset != 0 or tensor.layer_stride != old_num * tensor.block_stride:
            raise ResizeUnsupported(
                f"KV tensor of {tensor.layers[0]} is not layer-outermost (offset "
                f"{tensor.offset}, layer_stride {tensor.layer_stride}, block_stride "
                f"{tensor.block_stride}, {old_num} blocks)"
            )
        num_layers = tensor.size // tensor.layer_stride
        layer_stride = num_blocks * tensor.block_stride
        buffer = torch.zeros(num_layers * layer_stride, dtype=torch.int8, device=device)
        keep = min(old_num, num_blocks)
        for name in tensor.layers:
            old = views[name]
            if old.shape[0] != old_num or not old.is_contiguous():
                raise ResizeUnsupported(f"KV view of {name} has shape {tuple(old.shape)}")
            index = (old.data_ptr() - old.untyped_storage().data_ptr()) // tensor.layer_stride
            new = buffer[index * layer_stride : (index + 1) * layer_stride]
            new = new.view(old.dtype).view((num_blocks, *old.shape[1:]))
            new[:keep].copy_(old[:keep])
            rebound[old.data_ptr()] = new
            views[name] = new
        old_bytes += tensor.size
        new_bytes += num_layers * layer_stride
        tensor.size, tensor.layer_stride = num_layers * layer_stride, layer_stride
    context = runner.compilation_config.static_forward_context
    for name, view in views.items():
        context[name].bind_kv_cache(view)
    runner.kv_caches[:] = [rebound[t.data_ptr()] for t in runner.kv_caches]
    config.num_blocks = num_blocks
    return old_bytes, new_bytes

"""KV views built by vLLM 0.32's own code for every layout it can give a layer, and a reference.

``vllm_views`` runs the path the model runner takes: ``get_kv_cache_config_from_groups``
places the layers (layer and block strides for the resolved ``KVCacheLayout``), and
``allocate_kv_cache`` (``create_kv_cache_views``) makes the per-layer views, kernel-block
splitting included. ``reference_move`` is the mover's specification: a pure-torch gather on
each layer's logical ``[blocks, ...]`` view of a copy of the buffer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.kvcache.planner import Move, packed_watermark, plan_moves

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheSpec

NUM_BLOCKS = 12
NUM_LAYERS = 3


@dataclass(frozen=True)
class Case:
    """One layer shape: a vLLM layout (or ``kv-outer``, built by hand) and its spec."""

    layout: str
    spec: str = "full"
    kernel_block_size: int | None = None


CASES = {
    "LBHNC-cpu-triton": Case("LBHNC"),
    "LBNHC-flashattn-flashinfer-hopper": Case("LBNHC"),
    "BLHNC-block-outermost": Case("BLHNC"),
    "BLNHC-block-outermost": Case("BLNHC"),
    "LHBNC-heads-outside-blocks": Case("LHBNC"),
    "BHLNC-heads-outside-layers": Case("BHLNC"),
    "MLA-one-latent-head": Case("LBNHC", "mla"),
    "LBNHC-kernel-blocks-64-as-4x16": Case("LBNHC", "full64", kernel_block_size=16),
    "LBHNC-padded-pages": Case("LBHNC", "padded"),
    "BLHNC-fp8": Case("BLHNC", "fp8"),
    "kv-outer-by-hand": Case("kv-outer"),
    "kv-and-heads-outer-by-hand": Case("kv-heads-outer"),
}
"""What each case stands for: LBHNC is the CPU and Triton attention layout, LBNHC the one
FlashAttention and FlashInfer resolve on Hopper (vLLM's default preference), BL* put blocks
outermost (DeepSeek-V4's indexer needs them), LHBNC/BHLNC split a block into one chunk per
head, ``kv-outer`` is a ``[2, blocks, ...]`` K/V split seen through ``transpose(0, 1)``
and ``kv-heads-outer`` a ``[2, heads, blocks, ...]`` one (its two levels nest into one)."""


def _spec(kind: str) -> KVCacheSpec:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    if kind == "mla":  # DeepSeek-style latent: kv_lora_rank 512 + rope 64, one "head"
        return MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    block_size = 64 if kind == "full64" else 16
    dtype = torch.float8_e4m3fn if kind == "fp8" else torch.bfloat16
    padded = 2 * 16 * 16 * 2 + 64 if kind == "padded" else None
    return FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=2,
        head_size=8,
        dtype=dtype,
        page_size_padded=padded,
    )


def vllm_views(case: Case) -> list[torch.Tensor]:
    """``NUM_LAYERS`` per-layer views of one buffer, as vLLM's model runner gets them."""
    if case.layout in ("kv-outer", "kv-heads-outer"):
        raw = torch.zeros(2 * NUM_BLOCKS * 16 * 2 * 8 * NUM_LAYERS, dtype=torch.bfloat16)
        per_layer = raw.numel() // NUM_LAYERS
        layers = [raw[i * per_layer : (i + 1) * per_layer] for i in range(NUM_LAYERS)]
        if case.layout == "kv-outer":
            return [t.view(2, NUM_BLOCKS, 16, 2, 8).transpose(0, 1) for t in layers]
        return [t.view(2, 2, NUM_BLOCKS, 16, 8).permute(2, 0, 1, 3, 4) for t in layers]
    from vllm.config import CacheConfig, VllmConfig
    from vllm.v1.core.kv_cache_utils import (
        create_kv_cache_group_specs,
        get_kv_cache_config_from_groups,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    spec = _spec(case.spec)
    cache = CacheConfig(block_size=spec.block_size)
    cache.kv_cache_layout = case.layout
    cache.num_gpu_blocks_override = NUM_BLOCKS
    specs = {f"model.layers.{i}.self_attn.attn": spec for i in range(NUM_LAYERS)}
    groups = create_kv_cache_group_specs(specs, [list(specs)])
    config = get_kv_cache_config_from_groups(VllmConfig(cache_config=cache), groups, 1 << 30)
    assert config.num_blocks == NUM_BLOCKS
    kernel = [case.kernel_block_size] if case.kernel_block_size else None
    views = allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout[case.layout], kernel)
    return list(views.values())


def raw_bytes(views: list[torch.Tensor]) -> torch.Tensor:
    """The whole backing buffer as bytes (padding and every layer included)."""
    return torch.empty(0, dtype=torch.uint8).set_(views[0].untyped_storage())


def fill_distinct(views: list[torch.Tensor], seed: int = 0) -> None:
    """Random bytes everywhere; checks every block of every layer holds different data."""
    raw = raw_bytes(views)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=_gen(seed)))
    for view in views:
        blocks = _logical(view, raw)
        assert len({blocks[b].contiguous().numpy().tobytes() for b in range(NUM_BLOCKS)}) == (
            NUM_BLOCKS
        )


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logical(view: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """``view``'s geometry over ``raw``'s storage as bytes, folded to ``[NUM_BLOCKS, ...]``."""
    size = view.element_size()
    same = torch.empty(0, dtype=torch.uint8).set_(
        raw.untyped_storage(),
        view.storage_offset() * size,
        (*view.shape, size),
        (*(s * size for s in view.stride()), 1),
    )
    return same.view(NUM_BLOCKS, -1, *same.shape[1:])


def reference_move(views: list[torch.Tensor], moves: list[Move]) -> torch.Tensor:
    """The buffer's bytes after ``moves``, by a torch gather per layer on a copy."""
    expected = raw_bytes(views).clone()
    src = torch.tensor([m.src for m in moves])
    dst = torch.tensor([m.dst for m in moves])
    for view in views:
        blocks = _logical(view, expected)
        blocks[dst] = blocks[src]
    return expected


def random_plan(seed: int, count: int = 4) -> list[Move]:
    """Disjoint sources and destinations in random order (no runs, no ordering)."""
    ids = random.Random(seed).sample(range(1, NUM_BLOCKS), 2 * count)
    return [Move(s, d) for s, d in zip(ids[:count], ids[count:], strict=True)]


def planner_plan(seed: int) -> list[Move]:
    """The planner's packing of a random half of the pool (consecutive runs included)."""
    ids = list(range(1, NUM_BLOCKS))
    occupied = set(random.Random(seed).sample(ids, len(ids) // 2))
    return plan_moves(occupied, set(ids) - occupied, packed_watermark(len(occupied)))

"""The GPU mover: one fused Triton gather-scatter launch moves KV blocks in a whole layer group.

Why a kernel: the unfused ``runs`` copy issues one device copy per run and layer (thousands
per pass), so launches, not bytes, bound it (expected ~0.01-0.02x of the device's copy
bandwidth); staged ``index_select`` + ``index_copy_`` moves every byte twice. Here each
program copies one tile of ``TILE`` words of one (move, layer, chunk) from the source block
to the destination block, all of a pass in one launch. Sources and destinations are
disjoint (``mover.check_moves``), so programs never race and nothing is staged.

Imported only when a mover is fused (CUDA). With ``TRITON_INTERPRET=1`` set before this
module is first imported, Triton's interpreter runs the same kernel on CPU tensors
(``INTERPRETED``), which is how the tests check it on machines without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs

TILE_WORDS = 1024
"""Words one program copies at most (a power of two; 8 KiB in int64 words)."""
NUM_WARPS = 4
"""Warps per program: 128 threads, 8 int64 words (four 16-byte accesses) each at 1024 words."""
INTERPRETED: bool = bool(knobs.runtime.interpret)
"""Whether the kernel below was built for Triton's CPU interpreter."""


@triton.jit  # type: ignore[untyped-decorator]
def _gather_scatter(  # type: ignore[no-untyped-def]  # Triton reads the annotations
    pages,
    src,
    dst,
    layer_stride,
    block_stride,
    chunk_stride,
    chunks,
    CHUNK_WORDS: tl.constexpr,
    TILE: tl.constexpr,
    TILES_PER_CHUNK: tl.constexpr,
    EVEN: tl.constexpr,
):
    tile_id = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    tiles_per_move = chunks * TILES_PER_CHUNK
    move = tile_id // tiles_per_move
    rest = tile_id % tiles_per_move
    chunk = (rest // TILES_PER_CHUNK).to(tl.int64)
    words = (rest % TILES_PER_CHUNK) * TILE + tl.arange(0, TILE)
    inner = layer * layer_stride + chunk * chunk_stride
    source = pages + (tl.load(src + move) * block_stride + inner) + words
    target = pages + (tl.load(dst + move) * block_stride + inner) + words
    if EVEN:
        tl.store(target, tl.load(source))
    else:
        mask = words < CHUNK_WORDS
        tl.store(target, tl.load(source, mask=mask), mask=mask)


def gather_scatter(
    pages: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    *,
    tile_words: int = TILE_WORDS,
    num_warps: int = NUM_WARPS,
) -> None:
    """Copy block ``src[i]`` onto ``dst[i]`` in every layer of ``pages``.

    ``pages``: ``[layers, blocks, chunks, words]`` (``mover.layer_groups``); ``src`` and
    ``dst``: int64 block ids on the same device, validated by the caller.
    """
    layers, _, chunks, chunk_words = pages.shape
    tile = min(tile_words, triton.next_power_of_2(chunk_words))
    tiles_per_chunk = triton.cdiv(chunk_words, tile)
    grid = (src.numel() * chunks * tiles_per_chunk, layers)
    _gather_scatter[grid](
        pages,
        src,
        dst,
        pages.stride(0),
        pages.stride(1),
        pages.stride(2),
        chunks,
        CHUNK_WORDS=chunk_words,
        TILE=tile,
        TILES_PER_CHUNK=tiles_per_chunk,
        EVEN=chunk_words % tile == 0,
        num_warps=num_warps,
    )

"""Copy KV blocks inside vLLM's KV buffer, every layer, on the buffer's own device.

vLLM 0.32 gives every attention layer a logical view ``[blocks, heads, tokens, channels]``
over one backing allocation; the resolved layout (``KVCacheLayout``: LBHNC on CPU and
Triton, LBNHC for FlashAttention and FlashInfer on Hopper, BLHNC/BLNHC when blocks are
outermost, MLA's one latent head, pages padded to an alignment, blocks split into kernel
blocks) only changes the strides. The mover therefore never looks at a backend name: it
derives each layer's page geometry from the view's strides (``page_geometry``). A block of a
layer is either one contiguous page or a fixed number of contiguous chunks at a fixed stride
(e.g. heads outside the block dim, LHBNC, or K and V halves of a kv-outer view); anything
else is refused with ``LayoutUnsupported`` when the mover is built, before anything moves.

Layers with the same geometry, evenly spaced in one allocation (every layer of a vLLM
KV cache tensor), form one group seen as ``[layers, blocks, chunks, words]`` in the widest
integer word the geometry and alignment allow (CPU copy kernels move int64 several times
faster than bytes). Sources and destinations never overlap (the planner takes sources at or
above the watermark and destinations below it; ``move`` checks it), so the copy order does
not matter and no staging buffer is needed.

How a pass copies, chosen per device:

* CUDA (``fused``, the default there when Triton is importable): one Triton launch per
  group (``triton_mover``), one program per (move, layer) tile, whatever the strategy; one
  copy per run and layer would be thousands of launches.
* ``runs`` elsewhere: one copy per run of consecutive moves and per layer. On CPU through
  NumPy views of the same memory: a NumPy slice assignment costs ~2 us where a torch
  ``copy_`` costs ~10-20 us of dispatch, and with ~100 runs x 32 layers that dispatch was a
  third of the pause (docs/benchmarks.md). ``numpy_copies=False`` keeps torch ``copy_``.
  Splitting copies over threads measured no better on the shared 2-core machine.
* ``gather``: one ``index_select`` + ``index_copy_`` over all moves per group.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from runtime.kvcache.limits import Strategy
from runtime.kvcache.planner import NULL_BLOCK, Move

_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)


class LayoutUnsupported(ValueError):
    """A KV view whose blocks are not whole pages or evenly strided chunks of one."""


@dataclass(frozen=True)
class Run:
    """``length`` consecutive blocks from ``src`` onwards go to ``dst`` onwards."""

    src: int
    dst: int
    length: int


def coalesce(moves: Iterable[Move]) -> list[Run]:
    """Merge moves whose sources and destinations are both consecutive into runs."""
    runs: list[Run] = []
    for move in sorted(moves):
        last = runs[-1] if runs else None
        if last and move.src == last.src + last.length and move.dst == last.dst + last.length:
            runs[-1] = Run(last.src, last.dst, last.length + 1)
        else:
            runs.append(Run(move.src, move.dst, 1))
    return runs


@dataclass(frozen=True)
class PageGeometry:
    """Where one block of one layer lies, in bytes from the layer's block 0.

    Block ``b`` is ``chunks`` contiguous runs of ``chunk_bytes``, the first at
    ``b * block_stride`` and each next one ``chunk_stride`` further. Block-compact layouts
    (LBHNC, LBNHC, BLHNC, BLNHC, MLA) have one chunk, the page.
    """

    block_stride: int
    chunks: int
    chunk_stride: int
    chunk_bytes: int

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of one layer (what one move copies per layer)."""
        return self.chunks * self.chunk_bytes


def _describe(view: torch.Tensor) -> str:
    return f"KV view of shape {tuple(view.shape)}, strides {tuple(view.stride())}, {view.dtype}"


def page_geometry(view: torch.Tensor, num_blocks: int) -> PageGeometry:
    """The geometry of block ``b`` = rows ``[b * k, (b + 1) * k)`` of ``view``.

    ``k = view.shape[0] // num_blocks``: vLLM splits a block into ``k`` kernel blocks when
    the attention kernel takes smaller blocks than the scheduler's. Raises
    ``LayoutUnsupported`` naming the view and why.
    """
    if view.dim() < 1 or num_blocks < 1 or view.shape[0] % num_blocks:
        raise LayoutUnsupported(
            f"{_describe(view)}: dim 0 does not hold {num_blocks} blocks (expected a "
            "multiple of the scheduler's block count)"
        )
    ratio = view.shape[0] // num_blocks
    size = view.element_size()
    block_stride = view.stride(0) * size * ratio
    dims = [(n, s * size) for n, s in zip(view.shape[1:], view.stride()[1:], strict=True)]
    dims = sorted((d for d in [(ratio, view.stride(0) * size), *dims] if d[0] > 1), key=_stride)
    if any(s <= 0 for _, s in dims) or (num_blocks > 1 and block_stride <= 0):
        raise LayoutUnsupported(f"{_describe(view)}: a zero or negative stride (broadcast view)")
    chunk = size
    outer: list[tuple[int, int]] = []
    for n, s in dims:  # innermost first: dims that continue the contiguous run join it
        if not outer and s == chunk:
            chunk *= n
        elif outer and s == outer[-1][0] * outer[-1][1]:
            outer[-1] = (outer[-1][0] * n, outer[-1][1])
        else:
            outer.append((n, s))
    if len(outer) > 1:
        raise LayoutUnsupported(
            f"{_describe(view)}: a block lies in {len(outer)} nested strided levels "
            f"({outer}, contiguous runs of {chunk} bytes); the mover copies whole pages or "
            "one level of evenly strided chunks"
        )
    chunks, chunk_stride = outer[0] if outer else (1, chunk)
    _refuse_overlap(view, [(chunks, chunk_stride), (num_blocks, block_stride)], chunk)
    return PageGeometry(block_stride, chunks, chunk_stride, chunk)


def _stride(dim: tuple[int, int]) -> int:
    return dim[1]


def _refuse_overlap(view: torch.Tensor, dims: list[tuple[int, int]], chunk: int) -> None:
    """Refuse ``(count, byte stride)`` levels over contiguous ``chunk`` bytes that may overlap.

    Sufficient test: in stride order, each level must start beyond everything inside it.
    """
    extent = chunk
    for n, s in sorted((d for d in dims if d[0] > 1), key=_stride):
        if s < extent:
            raise LayoutUnsupported(
                f"{_describe(view)}: layers, blocks or chunks overlap (stride {s} bytes "
                f"inside an extent of {extent} bytes)"
            )
        extent += (n - 1) * s


def _offset(view: torch.Tensor) -> int:
    """Byte offset of ``view`` into its storage."""
    return view.data_ptr() - view.untyped_storage().data_ptr()


def _distinct(views: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One view per distinct layer (layers sharing KV alias the same memory)."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for view in views:
        if view.data_ptr() not in seen:
            seen.add(view.data_ptr())
            out.append(view)
    return out


def _spaced(offsets: list[int]) -> list[list[int]]:
    """Split ascending offsets into maximal evenly spaced runs."""
    groups: list[list[int]] = []
    for offset in offsets:
        last = groups[-1] if groups else None
        if last and (len(last) == 1 or offset - last[-1] == last[1] - last[0]):
            last.append(offset)
        else:
            groups.append([offset])
    return groups


def _stacked(
    first: torch.Tensor, geometry: PageGeometry, offsets: list[int], num_blocks: int
) -> torch.Tensor:
    """``[layers, blocks, chunks, words]`` view of evenly spaced layers (never a copy)."""
    storage = first.untyped_storage()
    layer_stride = offsets[1] - offsets[0] if len(offsets) > 1 else 0
    levels = [(len(offsets), layer_stride), (num_blocks, geometry.block_stride)]
    _refuse_overlap(
        first, [*levels, (geometry.chunks, geometry.chunk_stride)], geometry.chunk_bytes
    )
    byte_values = (
        storage.data_ptr(),
        offsets[0],
        layer_stride,
        geometry.block_stride,
        geometry.chunk_stride,
        geometry.chunk_bytes,
    )
    word = next(w for w in _WORDS if all(v % w.itemsize == 0 for v in byte_values))
    base = torch.empty(0, dtype=word, device=first.device)
    base.set_(storage, 0, (storage.nbytes() // word.itemsize,), (1,))
    size = word.itemsize
    return torch.as_strided(
        base,
        (len(offsets), num_blocks, geometry.chunks, geometry.chunk_bytes // size),
        (layer_stride // size, geometry.block_stride // size, geometry.chunk_stride // size, 1),
        offsets[0] // size,
    )


def layer_groups(views: Sequence[torch.Tensor], num_blocks: int) -> list[torch.Tensor]:
    """Every distinct layer's blocks as few ``[layers, blocks, chunks, words]`` views as can be.

    Layers join a group when they share storage and geometry and are evenly spaced (all
    layers of a vLLM KV cache tensor are). Raises ``LayoutUnsupported`` for any view the
    mover cannot address, before anything moves.
    """
    keyed: dict[tuple[int, PageGeometry], list[torch.Tensor]] = {}
    for view in _distinct(views):
        key = (view.untyped_storage().data_ptr(), page_geometry(view, num_blocks))
        keyed.setdefault(key, []).append(view)
    groups: list[torch.Tensor] = []
    for (_, geometry), members in keyed.items():
        offsets = sorted(_offset(v) for v in members)
        for spaced in _spaced(offsets):
            groups.append(_stacked(members[0], geometry, spaced, num_blocks))
    return groups


def check_moves(moves: Sequence[Move], num_blocks: int) -> None:
    """Refuse, before any copy, moves a parallel or run-wise copy would get wrong."""
    for move in moves:
        if not (NULL_BLOCK < move.src < num_blocks and NULL_BLOCK < move.dst < num_blocks):
            raise ValueError(
                f"move {move.src} -> {move.dst} is outside blocks 1..{num_blocks - 1} (block "
                f"{NULL_BLOCK} is the null block)"
            )
    destinations = Counter(m.dst for m in moves)
    twice = sorted(b for b, n in destinations.items() if n > 1)
    if twice:
        raise ValueError(f"blocks {twice[:8]} are the destination of more than one move")
    both = {m.src for m in moves}.intersection(destinations)
    if both:
        raise ValueError(
            f"blocks {sorted(both)[:8]} are both a source and a destination; the moves of "
            "one pass must be disjoint"
        )


def _fused_default(device: torch.device) -> bool:
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


class BlockMover:
    """Moves blocks of every KV layer given as per-layer views ``[blocks, ...]``."""

    def __init__(
        self,
        views: Sequence[torch.Tensor],
        strategy: Strategy = "runs",
        *,
        num_blocks: int | None = None,
        numpy_copies: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        """``num_blocks``: the scheduler's block count (default: the views' first dim).

        ``fused``: one Triton launch per layer group (default: exactly on CUDA with Triton
        installed); ``numpy_copies``: copy ``runs`` through NumPy views (default: exactly
        on CPU). Raises ``LayoutUnsupported`` for a view whose blocks cannot be addressed.
        """
        if not views:
            raise ValueError("no KV cache views to move blocks in")
        self.num_blocks = views[0].shape[0] if num_blocks is None else num_blocks
        self.groups = layer_groups(views, self.num_blocks)
        """``[layers, blocks, chunks, words]`` views covering every distinct layer."""
        self.strategy: Strategy = strategy
        device = self.groups[0].device
        self.fused = _fused_default(device) if fused is None else fused
        if self.fused:
            from runtime.kvcache.in_vllm import triton_mover

            if device.type != "cuda" and not triton_mover.INTERPRETED:
                raise ValueError(f"fused moves need CUDA tensors, found them on {device}")
        use_numpy = (
            device.type == "cpu" and not self.fused if numpy_copies is None else numpy_copies
        )
        if use_numpy and (device.type != "cpu" or self.fused):
            raise ValueError(f"numpy_copies needs unfused moves of CPU tensors (on {device})")
        self._layers = [layer for group in self.groups for layer in group]
        """Every distinct layer as ``[blocks, chunks, words]``."""
        self._host_pages: list[np.ndarray] | None = (
            [layer.numpy() for layer in self._layers] if use_numpy else None
        )
        """NumPy aliases of ``_layers`` when runs are copied through NumPy, else None."""
        self.block_bytes = sum(
            g.shape[0] * g.shape[2] * g.shape[3] * g.element_size() for g in self.groups
        )
        """Bytes of one block summed over all layers (what one move copies)."""

    def move(self, moves: Sequence[Move]) -> int:
        """Copy every ``src`` block onto its ``dst`` in all layers; returns bytes copied.

        On CUDA the copy is queued on the current stream (later kernels see it in order).
        """
        if not moves:
            return 0
        check_moves(moves, self.num_blocks)
        if self.fused or self.strategy == "gather":
            device = self.groups[0].device
            src = torch.tensor([m.src for m in moves], dtype=torch.int64, device=device)
            dst = torch.tensor([m.dst for m in moves], dtype=torch.int64, device=device)
            if self.fused:
                from runtime.kvcache.in_vllm import triton_mover

                for group in self.groups:
                    triton_mover.gather_scatter(group, src, dst)
            else:
                for group in self.groups:
                    group.index_copy_(1, dst, group.index_select(1, src))
            return len(moves) * self.block_bytes
        runs = coalesce(moves)
        if self._host_pages is not None:
            for pages in self._host_pages:
                for run in runs:
                    pages[run.dst : run.dst + run.length] = pages[run.src : run.src + run.length]
        else:
            for layer in self._layers:
                for run in runs:
                    layer[run.dst : run.dst + run.length].copy_(
                        layer[run.src : run.src + run.length]
                    )
        return len(moves) * self.block_bytes

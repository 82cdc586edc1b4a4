"""Copy KV blocks inside vLLM's KV buffer, every layer, on the buffer's own device.

vLLM 0.32 keeps every layer of a KV cache group in one backing allocation with the layer
dimension outermost (layout LBHNC): layer ``l`` of block ``b`` starts at
``offset + l * layer_stride + b * block_stride``, and one block of one layer (a page) is
contiguous. The mover sees each layer as ``[blocks, page_words]`` in the widest integer type
the page size and alignment allow (CPU copy kernels move int64 several times faster than
bytes). Sources and destinations never overlap (the planner takes sources at or above the
watermark and destinations below it), so the copy order does not matter.

Measured on CPU (bench/compaction.py): one contiguous copy per run and layer beats both a
single strided copy over all layers and an index gather; ``gather`` is there for devices
where kernel launches, not bytes, dominate.

The ``runs`` copy is chosen per device. On CPU each copy goes through NumPy views of the
same memory: a NumPy slice assignment costs ~2 us where a torch ``copy_`` costs ~10-20 us of
dispatch, and with ~100 runs x 32 layers that dispatch was a third of the pause. Splitting
the copies over threads (pages are too small for torch's intra-op split) measured no better
on the shared 2-core machine, so the CPU path stays single-threaded. On other devices
(CUDA) each run is one torch ``copy_`` (an asynchronous device copy; threads are pointless).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from runtime.kvcache.limits import Strategy
from runtime.kvcache.planner import Move

_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)


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


def _pages(view: torch.Tensor) -> torch.Tensor:
    """``[blocks, page_words]`` alias of a per-layer view ``[blocks, ...]`` (never a copy)."""
    if not view[0].is_contiguous():
        raise ValueError(f"KV view with strides {tuple(view.stride())} is not block-contiguous")
    pages = view.view(view.shape[0], -1).view(torch.uint8)
    for word in _WORDS:
        size = torch.empty(0, dtype=word).element_size()
        if (
            pages.shape[1] % size == 0
            and pages.data_ptr() % size == 0
            and pages.stride(0) % size == 0
        ):
            return pages.view(word)
    return pages


def _distinct(views: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One view per distinct layer (layers sharing KV alias the same memory)."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for view in views:
        if view.data_ptr() not in seen:
            seen.add(view.data_ptr())
            out.append(view)
    return out


def _stack(layers: list[torch.Tensor]) -> torch.Tensor | None:
    """The ``[layers, blocks, page_words]`` view of one evenly strided allocation, if any."""
    first = layers[0]
    if any(
        t.shape != first.shape or t.stride() != first.stride() or t.dtype != first.dtype
        for t in layers
    ):
        return None
    storage = first.untyped_storage()
    if any(t.untyped_storage().data_ptr() != storage.data_ptr() for t in layers):
        return None
    size = first.element_size()
    offsets = [(t.data_ptr() - storage.data_ptr()) // size for t in layers]
    layer_stride = offsets[1] - offsets[0] if len(offsets) > 1 else 0
    if any(b - a != layer_stride for a, b in itertools.pairwise(offsets)):
        return None
    base = torch.empty(0, dtype=first.dtype, device=first.device)
    base.set_(storage, 0, (storage.nbytes() // size,), (1,))
    return torch.as_strided(
        base, (len(layers), *first.shape), (layer_stride, *first.stride()), offsets[0]
    )


class BlockMover:
    """Moves blocks of every KV layer given as per-layer views ``[num_blocks, ...]``."""

    def __init__(
        self,
        views: Sequence[torch.Tensor],
        strategy: Strategy = "runs",
        *,
        numpy_copies: bool | None = None,
    ) -> None:
        """``numpy_copies``: copy ``runs`` through NumPy views (default: exactly on CPU)."""
        self.layers = [_pages(v) for v in _distinct(views)]
        if not self.layers:
            raise ValueError("no KV cache views to move blocks in")
        self.strategy: Strategy = strategy
        device = self.layers[0].device
        use_numpy = device.type == "cpu" if numpy_copies is None else numpy_copies
        if use_numpy and device.type != "cpu":
            raise ValueError(f"numpy_copies needs CPU tensors, found them on {device}")
        self._host_pages: list[np.ndarray] | None = (
            [t.numpy() for t in self.layers] if use_numpy else None
        )
        """NumPy aliases of ``layers`` when runs are copied through NumPy, else None."""
        self.block_bytes = sum(t.shape[1] * t.element_size() for t in self.layers)
        """Bytes of one block summed over all layers (what one move copies)."""

    def move(self, moves: Sequence[Move]) -> int:
        """Copy every ``src`` block onto its ``dst`` in all layers; returns bytes copied."""
        if not moves:
            return 0
        if self.strategy == "runs":
            runs = coalesce(moves)
            if self._host_pages is not None:
                for pages in self._host_pages:
                    for run in runs:
                        pages[run.dst : run.dst + run.length] = pages[
                            run.src : run.src + run.length
                        ]
            else:
                for layer in self.layers:
                    for run in runs:
                        layer[run.dst : run.dst + run.length].copy_(
                            layer[run.src : run.src + run.length]
                        )
            return len(moves) * self.block_bytes
        device = self.layers[0].device
        src = torch.tensor([m.src for m in moves], dtype=torch.long, device=device)
        dst = torch.tensor([m.dst for m in moves], dtype=torch.long, device=device)
        stacked = _stack(self.layers)
        groups = [stacked] if stacked is not None else [t.unsqueeze(0) for t in self.layers]
        for group in groups:
            group.index_copy_(1, dst, group.index_select(1, src))
        return len(moves) * self.block_bytes

"""Copy KV blocks inside vLLM's KV buffer, all layers at once, on the buffer's own device.

vLLM 0.32 keeps every layer of a KV cache group in one backing allocation with the layer
dimension outermost (layout LBHNC): layer ``l`` of block ``b`` starts at
``offset + l * layer_stride + b * block_stride``. The mover views that allocation as one
``[layers, blocks, page_bytes]`` byte tensor, so a run of consecutive blocks is ONE strided
``copy_`` for all layers. Layers that do not share an evenly strided allocation fall back to
one copy per layer. Sources and destinations never overlap (the planner takes sources at or
above the watermark and destinations below it), so the copy order does not matter.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from runtime.kvcache.limits import Strategy
from runtime.kvcache.planner import Move


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


def _byte_blocks(view: torch.Tensor) -> torch.Tensor:
    """``[blocks, page_bytes]`` uint8 alias of a per-layer view ``[blocks, ...]``."""
    if not view[0].is_contiguous():
        raise ValueError(f"KV view with strides {tuple(view.stride())} is not block-contiguous")
    return view.view(view.shape[0], -1).view(torch.uint8)


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
    """The ``[layers, blocks, page_bytes]`` view of one evenly strided allocation, if any."""
    first = layers[0]
    storage = first.untyped_storage()
    if any(
        t.untyped_storage().data_ptr() != storage.data_ptr()
        or t.shape != first.shape
        or t.stride() != first.stride()
        for t in layers
    ):
        return None
    base = torch.empty(0, dtype=torch.uint8, device=first.device)
    base.set_(storage)
    offsets = [t.data_ptr() - storage.data_ptr() for t in layers]
    layer_stride = offsets[1] - offsets[0] if len(offsets) > 1 else 0
    if any(b - a != layer_stride for a, b in itertools.pairwise(offsets)):
        return None
    return torch.as_strided(
        base,
        (len(layers), first.shape[0], first[0].numel() * first.element_size()),
        (layer_stride, first.stride(0) * first.element_size(), 1),
        offsets[0],
    )


class BlockMover:
    """Moves blocks of every KV layer given as per-layer views ``[num_blocks, ...]``."""

    def __init__(self, views: Sequence[torch.Tensor], strategy: Strategy = "runs") -> None:
        layers = [_byte_blocks(v) for v in _distinct(views)]
        if not layers:
            raise ValueError("no KV cache views to move blocks in")
        stacked = _stack(layers)
        self.groups: list[torch.Tensor] = (
            [stacked] if stacked is not None else [t.unsqueeze(0) for t in layers]
        )
        self.strategy: Strategy = strategy
        self.block_bytes = sum(g.shape[0] * g.shape[2] for g in self.groups)
        """Bytes of one block summed over all layers (what one move copies)."""

    def move(self, moves: Sequence[Move]) -> int:
        """Copy every ``src`` block onto its ``dst`` in all layers; returns bytes copied."""
        if not moves:
            return 0
        if self.strategy == "runs":
            runs = coalesce(moves)
            for group in self.groups:
                for run in runs:
                    group[:, run.dst : run.dst + run.length].copy_(
                        group[:, run.src : run.src + run.length]
                    )
        else:
            device = self.groups[0].device
            src = torch.tensor([m.src for m in moves], dtype=torch.long, device=device)
            dst = torch.tensor([m.dst for m in moves], dtype=torch.long, device=device)
            for group in self.groups:
                group.index_copy_(1, dst, group.index_select(1, src))
        return len(moves) * self.block_bytes

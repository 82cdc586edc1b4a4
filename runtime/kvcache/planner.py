"""Which KV blocks move where: a pure plan from block occupancy to a minimal move list.

Every occupied block (held by a running request or kept for prefix caching) at or above the
watermark must leave the tail, and one copy per block is the least any plan can do, so the
plan moves exactly those blocks, each once, into free slots below the watermark. Block 0 is
vLLM's null block: it is never a source nor a destination. Sources and destinations are
paired in ascending order, which keeps consecutive sources consecutive at the destination,
so the mover can copy runs instead of single blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

NULL_BLOCK = 0
"""vLLM's placeholder block id; its content is never read and it never moves."""


class Move(NamedTuple):
    """Copy block ``src`` to ``dst``, then let ``dst`` carry the identity of ``src``."""

    src: int
    dst: int


class PlanError(ValueError):
    """The requested packing cannot be done (too few free slots below the watermark)."""


def packed_watermark(num_occupied: int) -> int:
    """Lowest watermark that holds ``num_occupied`` blocks below it (block 0 is reserved)."""
    return num_occupied + 1


def fragmentation(occupied: Iterable[int]) -> float:
    """Share of occupied blocks that sit above the packed watermark (0 = fully packed)."""
    ids = [b for b in occupied if b != NULL_BLOCK]
    if not ids:
        return 0.0
    watermark = packed_watermark(len(ids))
    return sum(1 for b in ids if b >= watermark) / len(ids)


def plan_moves(
    occupied: Iterable[int],
    free: Iterable[int],
    watermark: int,
    *,
    max_moves: int | None = None,
) -> list[Move]:
    """Moves that empty ``[watermark, ...)`` of occupied blocks, at most ``max_moves`` of them.

    ``occupied`` and ``free`` must be disjoint; ids outside both are ignored (the caller
    passes only what the pool knows). With ``max_moves`` the highest sources move first, so
    a bounded pass still lowers the highest occupied id. Raises ``PlanError`` when the free
    slots below the watermark cannot take the sources.
    """
    occupied_ids = sorted(set(occupied) - {NULL_BLOCK})
    free_ids = sorted(set(free) - {NULL_BLOCK})
    if watermark < 1:
        raise PlanError(
            f"watermark must be at least 1 (block 0 is the null block), found {watermark}"
        )
    overlap = set(occupied_ids) & set(free_ids)
    if overlap:
        raise PlanError(f"blocks both occupied and free: {sorted(overlap)[:8]}")
    sources = [b for b in occupied_ids if b >= watermark]
    if max_moves is not None:
        if max_moves < 0:
            raise PlanError(f"max_moves must be >= 0, found {max_moves}")
        sources = sources[max(0, len(sources) - max_moves) :] if max_moves else []
    slots = [b for b in free_ids if b < watermark]
    if len(slots) < len(sources):
        raise PlanError(
            f"{len(sources)} occupied blocks at or above watermark {watermark} but only "
            f"{len(slots)} free slots below it"
        )
    return [Move(src, dst) for src, dst in zip(sources, slots, strict=False)]


def apply_moves(occupied: Iterable[int], moves: Iterable[Move]) -> set[int]:
    """Occupied ids after ``moves`` (the model the engine-side remap must match)."""
    after = set(occupied)
    for move in moves:
        after.remove(move.src)
        after.add(move.dst)
    return after

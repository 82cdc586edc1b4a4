"""KV memory waste of a request trace: paged blocks of B tokens versus a contiguous allocator.

Measured at each sequence's full length (prompt + output), the moment it holds the most KV:
a paged allocator wastes only the unused slots of the last block; a contiguous one that
reserves ``max_model_len`` per sequence wastes everything past the sequence's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.vllm.backends import BlockRule


@dataclass(frozen=True)
class Waste:
    """Token slots reserved versus used by one allocator over the whole trace."""

    label: str
    reserved_tokens: int
    used_tokens: int
    legal: bool = True
    """False when the attention backend would refuse this block size (shown for comparison)."""

    @property
    def wasted_tokens(self) -> int:
        return self.reserved_tokens - self.used_tokens

    @property
    def waste_share(self) -> float:
        """Share of reserved KV memory that holds no token."""
        return self.wasted_tokens / self.reserved_tokens


@dataclass(frozen=True)
class WasteReport:
    """Paged waste at several block sizes and the contiguous baseline, on the same requests."""

    requests: int
    too_long: int
    """Requests longer than ``max_model_len``: vLLM would reject them; left out of both."""
    chosen_block_size: int
    max_model_len: int
    paged: list[Waste]
    contiguous: Waste


def neighbour_block_sizes(chosen: int) -> list[int]:
    """The chosen size with half, double and four times it: the trade-off around it."""
    return sorted({size for size in (chosen // 2, chosen, chosen * 2, chosen * 4) if size >= 1})


def waste_report(
    lengths: Sequence[int], *, chosen_block_size: int, rule: BlockRule, max_model_len: int
) -> WasteReport:
    """Internal fragmentation at ``chosen_block_size`` and its neighbours vs contiguous."""
    kept = [n for n in lengths if n <= max_model_len]
    if not kept:
        raise ValueError(f"no request fits max_model_len {max_model_len}")
    used = sum(kept)
    paged = [
        Waste(
            f"paged, block {size}",
            sum(-(-n // size) * size for n in kept),
            used,
            legal=rule.allows(size),
        )
        for size in neighbour_block_sizes(chosen_block_size)
    ]
    contiguous = Waste(f"contiguous, {max_model_len} per sequence", len(kept) * max_model_len, used)
    return WasteReport(
        requests=len(lengths),
        too_long=len(lengths) - len(kept),
        chosen_block_size=chosen_block_size,
        max_model_len=max_model_len,
        paged=paged,
        contiguous=contiguous,
    )

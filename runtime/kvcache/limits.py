"""Bounds of one compaction request, sent by the sidecar with its policy's values, and the
shrink floor both ends enforce.

Kept free of vLLM imports: the CLI and the sidecar build limits without loading the engine.
Kept free of ``policy`` at run time too: the plugin imports this module inside the stock vLLM
image, which has gpupool's code on ``PYTHONPATH`` but not its dependencies (ruamel.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from policy.kvcache import KvCache

Strategy = Literal["runs", "gather"]
"""How blocks are copied off CUDA: ``runs``: one contiguous copy per run of consecutive
moves and per layer (NumPy slice copies on CPU), best when copies are large; ``gather``: one
index_select + index_copy_ over all moves per layer group. On CUDA the mover uses the fused
Triton gather-scatter (``in_vllm.triton_mover``) whatever the strategy says."""


@dataclass(frozen=True)
class CompactionLimits:
    """Per-request bounds; the sidecar sends its policy's values."""

    max_moves: int
    """Most block moves in one pause (policy ``kv_cache.compaction_max_moves``)."""
    saturation_usage: float
    """Defer at or above this KV usage (policy ``kv_cache.page_table_max_usage``)."""
    strategy: Strategy = "runs"
    """How the worker copies blocks (see ``Strategy``)."""

    @classmethod
    def from_policy(cls, kv: KvCache) -> CompactionLimits:
        return cls(max_moves=kv.compaction_max_moves, saturation_usage=kv.page_table_max_usage)


def sequence_blocks(max_model_len: int, block_size: int) -> int:
    """Blocks one ``max_model_len`` sequence needs (a sequence that ends inside a block
    needs that block)."""
    return -(-max_model_len // block_size)


def shrink_floor(*, held_blocks: int, max_model_len: int, block_size: int) -> int:
    """Smallest pool a shrink may leave: the blocks requests hold, one ``max_model_len``
    sequence and the null block, so a full-length request can always start after a shrink.

    The one copy of the rule: the sidecar raises a shrink it was asked for to it
    (``sidecar.triggers``), the plugin refuses any shrink below it (``engine_control``),
    whoever sent it (the sidecar, ``gpupool kv-sidecar shrink N``, any socket client)."""
    return held_blocks + sequence_blocks(max_model_len, block_size) + 1

"""Bounds of one compaction request, sent by the sidecar with its policy's values.

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

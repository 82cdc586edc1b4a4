"""The mover on every layout vLLM 0.32 can give a layer, against a pure-torch gather.

Views come from vLLM's own allocation path (``kv_layouts.vllm_views``); every block holds
distinct data, and the whole buffer (other layers, padding) is compared byte for byte.
"""

from __future__ import annotations

import pytest
import torch

from runtime.kvcache.in_vllm.mover import BlockMover, LayoutUnsupported, page_geometry
from runtime.kvcache.planner import Move
from tests.kvcache.kv_layouts import (
    CASES,
    NUM_BLOCKS,
    NUM_LAYERS,
    fill_distinct,
    planner_plan,
    random_plan,
    raw_bytes,
    reference_move,
    vllm_views,
)

pytestmark = pytest.mark.vllm

UNFUSED = {
    "runs-numpy": {"strategy": "runs"},
    "runs-torch": {"strategy": "runs", "numpy_copies": False},
    "gather": {"strategy": "gather"},
}


@pytest.mark.parametrize("copier", list(UNFUSED))
@pytest.mark.parametrize("plan", ["random", "planner"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_layout_moves_exactly_the_planned_blocks(case: str, plan: str, copier: str) -> None:
    views = vllm_views(CASES[case])
    fill_distinct(views, seed=len(case))
    moves = random_plan(seed=1) if plan == "random" else planner_plan(seed=2)
    assert moves
    expected = reference_move(views, moves)
    mover = BlockMover(views, num_blocks=NUM_BLOCKS, **UNFUSED[copier])  # type: ignore[arg-type]
    copied = mover.move(moves)
    assert torch.equal(raw_bytes(views), expected)
    page = page_geometry(views[0], NUM_BLOCKS).page_bytes
    assert copied == len(moves) * NUM_LAYERS * page


@pytest.mark.parametrize(
    ("case", "chunks"),
    [
        ("LBHNC-cpu-triton", 1),
        ("LBNHC-flashattn-flashinfer-hopper", 1),
        ("BLHNC-block-outermost", 1),
        ("MLA-one-latent-head", 1),
        ("LBNHC-kernel-blocks-64-as-4x16", 1),
        ("LBHNC-padded-pages", 1),
        ("LHBNC-heads-outside-blocks", 2),
        ("BHLNC-heads-outside-layers", 2),
        ("kv-outer-by-hand", 2),
        ("kv-and-heads-outer-by-hand", 4),
    ],
)
def test_geometry_comes_from_the_strides_and_one_vllm_tensor_is_one_group(
    case: str, chunks: int
) -> None:
    views = vllm_views(CASES[case])
    geometry = page_geometry(views[0], NUM_BLOCKS)
    assert geometry.chunks == chunks
    mover = BlockMover(views, num_blocks=NUM_BLOCKS)
    assert [tuple(g.shape[:3]) for g in mover.groups] == [(NUM_LAYERS, NUM_BLOCKS, chunks)]
    assert mover.groups[0].dtype == torch.int64
    if case == "LBHNC-padded-pages":  # the block stride is the padded page, the copy is not
        assert geometry.block_stride == geometry.page_bytes + 64


def test_layers_in_separate_or_unevenly_spaced_buffers_still_move() -> None:
    buffers = [torch.randn(NUM_BLOCKS * 64) for _ in range(2)]
    shared = torch.randn(NUM_BLOCKS * 64 * 3)
    views = [b.view(NUM_BLOCKS, 4, 16) for b in buffers] + [
        shared[: NUM_BLOCKS * 64].view(NUM_BLOCKS, 4, 16),
        shared[2 * NUM_BLOCKS * 64 :].view(NUM_BLOCKS, 4, 16),
    ]
    before = [v.clone() for v in views]
    mover = BlockMover([*views, views[0]], "runs")  # a layer sharing KV is moved once
    assert len(mover.groups) == 3
    moves = random_plan(seed=3)
    mover.move(moves)
    for view, old in zip(views, before, strict=True):
        old[[m.dst for m in moves]] = old[[m.src for m in moves]]
        assert torch.equal(view, old)


def _nested(num_blocks: int) -> torch.Tensor:
    """Each block as 2 x 3 runs of 8 bytes whose two strides do not nest (1000 vs 3 x 100)."""
    raw = torch.zeros(num_blocks * 8 + 2000 + 300, dtype=torch.uint8)
    return raw.as_strided((num_blocks, 2, 3, 8), (8, 1000, 100, 1))


@pytest.mark.parametrize(
    ("view", "num_blocks", "reason"),
    [
        (_nested(NUM_BLOCKS), NUM_BLOCKS, "2 nested strided levels"),
        (torch.zeros(1, 4, 8).expand(NUM_BLOCKS, 4, 8), NUM_BLOCKS, "zero or negative stride"),
        (torch.zeros(1024).as_strided((NUM_BLOCKS, 64), (32, 1)), NUM_BLOCKS, "overlap"),
        (torch.zeros(NUM_BLOCKS, 4, 8), 5, "does not hold 5 blocks"),
    ],
    ids=["nested-levels", "broadcast", "overlapping-blocks", "block-count"],
)
def test_a_view_the_mover_cannot_address_is_refused_with_the_reason(
    view: torch.Tensor, num_blocks: int, reason: str
) -> None:
    with pytest.raises(LayoutUnsupported, match=reason) as refused:
        BlockMover([view], num_blocks=num_blocks)
    assert f"shape {tuple(view.shape)}" in str(refused.value)


def test_layers_whose_blocks_overlap_each_other_are_refused() -> None:
    """Evenly spaced but half a layer apart: layer 1's block 0 is layer 0's block 6."""
    shared = torch.zeros(2 * NUM_BLOCKS * 32)
    half = NUM_BLOCKS * 32 // 2
    views = [shared[i * half : i * half + NUM_BLOCKS * 32].view(NUM_BLOCKS, 32) for i in (0, 1)]
    with pytest.raises(LayoutUnsupported, match="layers, blocks or chunks overlap"):
        BlockMover(views)


@pytest.mark.parametrize(
    ("moves", "reason"),
    [
        ([Move(3, 1), Move(NUM_BLOCKS, 2)], "outside blocks 1..11"),
        ([Move(3, 1), Move(4, 0)], "null block"),
        ([Move(3, 1), Move(4, 1)], r"blocks \[1\] are the destination of more than one"),
        ([Move(3, 1), Move(1, 2)], r"blocks \[1\] are both a source and a destination"),
    ],
    ids=["out-of-range", "null-block", "twice-a-destination", "chained"],
)
def test_invalid_moves_are_refused_before_any_block_moves(moves: list[Move], reason: str) -> None:
    views = vllm_views(CASES["LBNHC-flashattn-flashinfer-hopper"])
    fill_distinct(views)
    before = raw_bytes(views).clone()
    for copier in UNFUSED.values():
        mover = BlockMover(views, num_blocks=NUM_BLOCKS, **copier)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=reason):
            mover.move(moves)
        assert torch.equal(raw_bytes(views), before)

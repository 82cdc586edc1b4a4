"""The pure planner and the mover, on plain tensors: minimal, collision-free, block 0 untouched."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.kvcache.in_vllm.mover import BlockMover, Run, coalesce
from runtime.kvcache.planner import (
    Move,
    PlanError,
    apply_moves,
    fragmentation,
    packed_watermark,
    plan_moves,
)


@st.composite
def pools(draw: st.DrawFn) -> tuple[set[int], set[int], int]:
    size = draw(st.integers(2, 300))
    states = draw(st.lists(st.booleans(), min_size=size - 1, max_size=size - 1))
    occupied = {i + 1 for i, busy in enumerate(states) if busy}
    free = {i + 1 for i, busy in enumerate(states) if not busy}
    return occupied, free, size


@given(pools())
@settings(max_examples=300)
def test_packing_plan_is_minimal_collision_free_and_never_touches_block_0(
    pool: tuple[set[int], set[int], int],
) -> None:
    occupied, free, _ = pool
    watermark = packed_watermark(len(occupied))
    moves = plan_moves(occupied, free, watermark)
    above = {b for b in occupied if b >= watermark}
    assert {m.src for m in moves} == above  # every block above moves, and only those: minimal
    assert len({m.dst for m in moves}) == len(moves)  # no two blocks land on one slot
    assert all(m.dst in free and m.dst < watermark for m in moves)
    assert all(0 not in m for m in moves)
    after = apply_moves(occupied, moves)
    assert len(after) == len(occupied) and max(after, default=0) < watermark
    assert fragmentation(after) == 0.0
    assert moves == plan_moves(sorted(occupied, reverse=True), sorted(free), watermark)


@given(pools(), st.integers(0, 50))
def test_bounded_plan_moves_the_highest_blocks_first(
    pool: tuple[set[int], set[int], int], max_moves: int
) -> None:
    occupied, free, _ = pool
    watermark = packed_watermark(len(occupied))
    moves = plan_moves(occupied, free, watermark, max_moves=max_moves)
    above = sorted(b for b in occupied if b >= watermark)
    assert len(moves) == min(max_moves, len(above))
    assert sorted(m.src for m in moves) == above[len(above) - len(moves) :]


def test_infeasible_watermark_and_bad_input_are_errors() -> None:
    with pytest.raises(PlanError, match="only 1 free slots"):
        plan_moves({2, 3, 4}, {1}, 3)
    with pytest.raises(PlanError, match="both occupied and free"):
        plan_moves({2}, {2, 3}, 2)
    with pytest.raises(PlanError, match="at least 1"):
        plan_moves({2}, {1}, 0)


def test_fragmentation_counts_blocks_above_the_packed_watermark() -> None:
    assert fragmentation([]) == 0.0
    assert fragmentation([1, 2, 3]) == 0.0
    assert fragmentation([1, 9, 10, 2]) == 0.5


def test_coalesce_merges_only_runs_consecutive_on_both_sides() -> None:
    moves = [Move(10, 1), Move(11, 2), Move(12, 4), Move(20, 5)]
    assert coalesce(moves) == [Run(10, 1, 2), Run(12, 4, 1), Run(20, 5, 1)]


@pytest.mark.parametrize(
    ("strategy", "numpy_copies"),
    [("runs", None), ("runs", False), ("gather", None)],
    ids=["runs-cpu-default-numpy", "runs-torch-copy-as-on-cuda", "gather"],
)
def test_mover_copies_every_layer_of_a_vllm_shaped_buffer(
    strategy: str, numpy_copies: bool | None
) -> None:
    layers, blocks, page = 3, 16, (2, 4, 8)  # [heads, block_size, 2*head_size]
    per_layer = blocks * 2 * 4 * 8
    buffer = torch.randn(layers * per_layer, dtype=torch.float32)
    views = [buffer[i * per_layer : (i + 1) * per_layer].view(blocks, *page) for i in range(layers)]
    expected = [v.clone() for v in views]
    moves = [Move(12, 1), Move(13, 2), Move(15, 7)]
    mover = BlockMover(views, strategy, numpy_copies=numpy_copies)  # type: ignore[arg-type]
    copied = mover.move(moves)
    assert copied == 3 * layers * 2 * 4 * 8 * 4
    for view, old in zip(views, expected, strict=True):
        for m in moves:
            assert torch.equal(view[m.dst], old[m.src])
        untouched = [b for b in range(blocks) if b not in {m.dst for m in moves}]
        assert torch.equal(view[untouched], old[untouched])


def test_worker_side_refuses_a_runner_it_does_not_know_before_copying() -> None:
    from runtime.kvcache.in_vllm.worker_side import RunnerUnsupported, relocate, resize

    class ModelRunnerV2:
        """Stands for a runner without V1's ``requests`` and ``input_batch``."""

    with pytest.raises(RunnerUnsupported, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        relocate(ModelRunnerV2(), [Move(5, 1)])
    with pytest.raises(RunnerUnsupported):
        resize(ModelRunnerV2(), 8)

"""The fused Triton gather-scatter kernel (the CUDA path), run by Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be set when the kernel is decorated, so the module is
(re)imported under it; the same kernel source is what a GPU compiles. Checked on every
layout of ``kv_layouts`` against the pure-torch reference and against the unfused mover.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from runtime.kvcache.in_vllm.mover import BlockMover, layer_groups
from runtime.kvcache.planner import Move
from tests.kvcache.kv_layouts import (
    CASES,
    NUM_BLOCKS,
    fill_distinct,
    planner_plan,
    random_plan,
    raw_bytes,
    reference_move,
    vllm_views,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def interpreted() -> Iterator[ModuleType]:
    """``runtime.kvcache.in_vllm.triton_mover`` built for the interpreter.

    The variable stays set while this module's tests run (Triton reads it again when it
    launches); afterwards it is restored and the module rebuilt as it was.
    """
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    name = "runtime.kvcache.in_vllm.triton_mover"
    module = importlib.reload(sys.modules[name]) if name in sys.modules else None
    module = module or importlib.import_module(name)
    assert module.INTERPRETED
    yield module
    if saved is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = saved
    importlib.reload(module)


@pytest.mark.parametrize("plan", ["random", "planner"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_kernel_matches_the_reference_and_the_unfused_mover(
    interpreted: ModuleType, case: str, plan: str
) -> None:
    views = vllm_views(CASES[case])
    fill_distinct(views, seed=len(case))
    moves = random_plan(seed=4) if plan == "random" else planner_plan(seed=5)
    before = raw_bytes(views).clone()
    expected = reference_move(views, moves)
    mover = BlockMover(views, num_blocks=NUM_BLOCKS, fused=True)
    assert mover.fused
    copied = mover.move(moves)
    assert torch.equal(raw_bytes(views), expected)
    raw_bytes(views).copy_(before)
    unfused = BlockMover(views, num_blocks=NUM_BLOCKS, fused=False)
    assert unfused.move(moves) == copied
    assert torch.equal(raw_bytes(views), expected)


@pytest.mark.parametrize(
    ("page_shape", "tile_words"),
    [((4, 16), 16), ((3, 5), 16), ((3, 5), 4), ((2, 16, 16), 1024)],
    ids=["several-tiles-per-page", "masked-tail", "several-tiles-masked-tail", "one-tile"],
)
def test_tiles_cover_each_page_exactly(
    interpreted: ModuleType, page_shape: tuple[int, ...], tile_words: int
) -> None:
    """Pages of 64 floats (8 tiles of 16 int64), 15 floats (int32 words, masked), and more."""
    views = [torch.randn(NUM_BLOCKS, *page_shape) for _ in range(2)]
    expected = [v.clone() for v in views]
    moves = [Move(9, 1), Move(10, 2), Move(5, 11)]
    for old in expected:
        old[[m.dst for m in moves]] = old[[m.src for m in moves]]
    src = torch.tensor([m.src for m in moves])
    dst = torch.tensor([m.dst for m in moves])
    for group in layer_groups(views, NUM_BLOCKS):
        interpreted.gather_scatter(group, src, dst, tile_words=tile_words)
    assert all(torch.equal(v, e) for v, e in zip(views, expected, strict=True))


def test_fused_is_the_default_exactly_on_cuda(interpreted: ModuleType) -> None:
    assert not BlockMover([torch.zeros(NUM_BLOCKS, 8)]).fused
    from runtime.kvcache.in_vllm.mover import _fused_default

    assert _fused_default(torch.device("cuda"))
    assert not _fused_default(torch.device("cpu"))

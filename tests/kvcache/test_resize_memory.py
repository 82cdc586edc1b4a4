"""A resize needs one layer beyond the larger pool, measured; a failed one keeps the old pool.

The peak is the kernel's own high-water mark of the process's RSS (``VmHWM``, reset at the
start through ``/proc/<pid>/clear_refs``: ``worker_side.MemoryWatch``), so nothing between
two samples can hide. The engine is in-process, so the worker's KV is this process's memory.
"Extra" is what the process held beyond the larger of the pool before and after. The tiny
model has two layers: a whole new buffer beside the old one needs the smaller pool (2 layers of
the smaller size) extra, layer by layer needs one such layer, so the bound is 1.5 x that layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from runtime.kvcache.in_vllm import plugin, worker_side
from tests.kvcache.engine import (
    TOTAL_BLOCKS,
    Engine,
    Finished,
    check_pool,
    check_tables,
    limits,
    shared_prefix_prompts,
)

pytestmark = pytest.mark.slow

PROMPTS = shared_prefix_prompts(12, seed=3)
LAYER_BLOCK_BYTES = 32 * 2 * 2 * 32 * 2
"""Bytes of one block of one layer: 32 tokens x 2 KV heads x (K+V) x 32 x bf16."""
HALF = TOTAL_BLOCKS // 2
MIB = 2**20


@pytest.fixture(scope="module")
def engine_at_full_size(engine: Engine) -> Engine:
    """The shared engine, grown back to the size it started with (other tests shrink it)."""
    assert engine.control("grow")["status"] in ("done", "noop")
    return engine


@pytest.fixture(scope="module")
def reference(engine_at_full_size: Engine) -> dict[int, Finished]:
    return engine_at_full_size.run(PROMPTS)


@contextmanager
def second_allocation_failing() -> Iterator[list[int]]:
    """vLLM's ``allocate_kv_cache`` (what a resize allocates each layer with) raises an
    out-of-memory error on its second call only; yields the block count of every call."""
    from vllm.v1.worker import utils

    real = utils.allocate_kv_cache
    calls: list[int] = []

    def allocate(config: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(config.num_blocks)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("injected: the device cannot serve this allocation")
        return real(config, *args, **kwargs)

    utils.allocate_kv_cache = allocate
    try:
        yield calls
    finally:
        utils.allocate_kv_cache = real


def _layout(engine: Engine) -> list[tuple[Any, ...]]:
    """Per layer: block count of its view, its entry, the bound view's address == its own."""
    runner = engine.runner
    context = runner.compilation_config.static_forward_context
    out = []
    for entry, view in zip(runner.kv_cache_config.kv_cache_tensors, runner.kv_caches, strict=True):
        (name,) = entry.layers
        bound = context[name].kv_cache.data_ptr() == view.data_ptr()
        out.append((view.shape[0], entry, bound, view.untyped_storage().nbytes()))
    return out


def test_every_layer_owns_an_allocation_of_exactly_its_blocks(engine_at_full_size: Engine) -> None:
    """The plugin's start-up allocation (``allocate_per_layer``): vLLM would have put both
    layers in one buffer, which a resize could only free after a whole new pool existed."""
    runner = engine_at_full_size.runner
    layer_bytes = TOTAL_BLOCKS * LAYER_BLOCK_BYTES
    assert [len(t.layers) for t in runner.kv_cache_config.kv_cache_tensors] == [1, 1]
    assert _layout(engine_at_full_size) == [
        (TOTAL_BLOCKS, entry, True, layer_bytes)
        for entry in runner.kv_cache_config.kv_cache_tensors
    ]
    assert len({view.untyped_storage().data_ptr() for view in runner.kv_caches}) == 2


def test_the_peak_measure_sees_a_short_lived_allocation() -> None:
    """The method itself: 64 MiB touched and freed between start and end is in the peak
    (a sampler could miss it), and nothing stays held. The kernel batches RSS counters per
    CPU, so the figures are exact to within about a MiB."""
    watch = worker_side.MemoryWatch(torch.device("cpu"))
    block = torch.ones(64 * MIB, dtype=torch.int8)
    del block
    peak = watch.peak_extra_bytes()
    assert peak is not None and 63 * MIB <= peak < 72 * MIB
    assert abs(watch.released_bytes()) < 8 * MIB


def _resize_rpc(engine: Engine, num_blocks: int) -> dict[str, Any]:
    """The workers' resize exactly as the controller calls it (``collective_rpc``)."""
    (result,) = engine.core.model_executor.collective_rpc("gpupool_kv_resize", args=(num_blocks,))
    return dict(result)


def test_shrink_and_grow_need_one_layer_beyond_the_larger_pool(engine_at_full_size: Engine) -> None:
    """The worker's own measure (``ResizeResult.peak_extra_bytes``), on an empty pool (so
    the scheduler, which is not told, has nothing at or above the smaller size)."""
    engine = engine_at_full_size
    with plugin.state(engine.core).lock:
        assert engine.core.reset_prefix_cache()
        engine.fill_kv_with_noise()  # every page resident, as in a used pool
        shrunk = _resize_rpc(engine, HALF)
        grown = _resize_rpc(engine, TOTAL_BLOCKS)
    half_layer, full_layer = HALF * LAYER_BLOCK_BYTES, TOTAL_BLOCKS * LAYER_BLOCK_BYTES
    assert shrunk["old_bytes"] == 2 * full_layer and shrunk["new_bytes"] == 2 * half_layer
    assert 0 < shrunk["peak_extra_bytes"] < 1.5 * half_layer  # all at once: 2 x half_layer
    assert shrunk["released_bytes"] >= 0.9 * 2 * (full_layer - half_layer)
    assert 0 < grown["peak_extra_bytes"] < 1.5 * half_layer  # all at once: 2 x half_layer
    assert _layout(engine)[0][0] == TOTAL_BLOCKS


def test_shrink_and_grow_mid_generation_peak_at_one_layer_and_keep_outputs(
    engine_at_full_size: Engine, reference: dict[int, Finished]
) -> None:
    """The whole control request (pack, then resize) measured from outside, while requests
    run; the outputs equal the run without it."""
    engine = engine_at_full_size
    device = engine.runner.kv_caches[0].device
    seen: list[tuple[dict[str, Any], int | None]] = []

    def measured(op: str, **args: Any) -> None:
        with plugin.state(engine.core).lock:
            watch = worker_side.MemoryWatch(device)
            outcome = engine.control(op, **args)
            seen.append((outcome, watch.peak_extra_bytes()))
            check_pool(engine.pool)
            check_tables(engine)

    def hook(step: int) -> None:
        if step == 4:
            measured("shrink", num_blocks=HALF, limits=limits())
        if step == 9:
            measured("grow")

    out = engine.run(PROMPTS, hook)
    assert {i: f.tokens for i, f in out.items()} == {i: f.tokens for i, f in reference.items()}
    (shrink, shrink_peak), (grow, grow_peak) = seen
    assert (shrink["status"], grow["status"]) == ("done", "done"), seen
    assert shrink_peak is not None and shrink_peak < 1.5 * HALF * LAYER_BLOCK_BYTES
    assert grow_peak is not None and grow_peak < 1.5 * HALF * LAYER_BLOCK_BYTES
    # the outcome carries the worker's own measure of the resize (the pack before is not in it)
    for outcome in (shrink, grow):
        assert 0 < outcome["peak_extra_bytes"] < 1.5 * HALF * LAYER_BLOCK_BYTES, outcome


def _gauge(engine: Engine, name: str) -> float:
    """One unlabelled gauge of the plugin's metrics, as the control request serves them."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(engine.control("metrics")["text"]):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"no {name} in the plugin's metrics")


def test_a_resize_outcome_and_gauge_carry_the_largest_peak_over_the_ranks(
    engine_at_full_size: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real worker's resize answered as three ranks would with tensor parallelism: the
    real one, one that cannot measure (None) and one that needed 1 MiB more. The shrink's
    outcome and ``gpupool_kv_resize_peak_extra_bytes`` carry the largest; a grow after it,
    on the real worker alone, its own measure (below 1.5 layers of the smaller pool)."""
    engine = engine_at_full_size
    executor = engine.core.model_executor
    real = executor.collective_rpc
    peaks: list[int] = []

    def three_ranks(method: str, *args: Any, **kwargs: Any) -> list[Any]:
        results: list[Any] = real(method, *args, **kwargs)
        if method != "gpupool_kv_resize":
            return results
        (mine,) = results
        peaks.append(mine["peak_extra_bytes"])
        more = mine["peak_extra_bytes"] + MIB
        return [mine, {**mine, "peak_extra_bytes": None}, {**mine, "peak_extra_bytes": more}]

    half_layer = HALF * LAYER_BLOCK_BYTES
    with plugin.state(engine.core).lock:
        assert engine.core.reset_prefix_cache()
        engine.fill_kv_with_noise()  # every page resident, as in a used pool
        monkeypatch.setattr(executor, "collective_rpc", three_ranks)
        shrunk = engine.control("shrink", num_blocks=HALF, limits=limits())
        monkeypatch.undo()
        shrunk_gauge = _gauge(engine, "gpupool_kv_resize_peak_extra_bytes")
        grown = engine.control("grow")
        grown_gauge = _gauge(engine, "gpupool_kv_resize_peak_extra_bytes")
    (real_peak,) = peaks
    assert shrunk["status"] == "done" and grown["status"] == "done", (shrunk, grown)
    assert 0 < real_peak < 1.5 * half_layer
    assert shrunk["peak_extra_bytes"] == shrunk_gauge == real_peak + MIB
    assert 0 < grown["peak_extra_bytes"] < 1.5 * half_layer
    assert grown_gauge == grown["peak_extra_bytes"]


@pytest.mark.parametrize(("start", "target"), [(TOTAL_BLOCKS, HALF), (HALF, TOTAL_BLOCKS)])
def test_an_allocation_failing_on_the_second_layer_puts_the_first_back(
    engine_at_full_size: Engine, start: int, target: int
) -> None:
    """Layer 0 is resized, layer 1's allocation fails: the resize raises and the rank has
    its old pool: sizes, entries, bindings; a grown layer 0 keeps every byte (narrowed), a
    shrunk one every block below the target (its others were free, and come back zeroed);
    layer 1 was never touched."""
    engine = engine_at_full_size
    runner = engine.runner
    with plugin.state(engine.core).lock:
        assert engine.core.reset_prefix_cache()
        if _layout(engine)[0][0] != start:
            _resize_rpc(engine, start)
        engine.fill_kv_with_noise()
        before = _layout(engine)
        data = [view.clone() for view in runner.kv_caches]
        untouched = runner.kv_caches[1].data_ptr()
        with second_allocation_failing() as calls, pytest.raises(torch.OutOfMemoryError):
            worker_side.resize(runner, target)
        after = _layout(engine)
        kept = min(start, target)
        first, second = runner.kv_caches
        assert [a[:3] for a in after] == [b[:3] for b in before]
        assert runner.kv_cache_config.num_blocks == start
        assert calls[:2] == [target, target]
        assert torch.equal(first[:kept], data[0][:kept])
        if target > start:
            assert torch.equal(first, data[0])
        else:
            assert calls[2:] == [start] and not first[kept:].any()
        assert second.data_ptr() == untouched and torch.equal(second, data[1])
        _resize_rpc(engine, TOTAL_BLOCKS)


def test_a_failed_resize_mid_generation_fails_the_shrink_and_changes_no_output(
    engine_at_full_size: Engine, reference: dict[int, Finished]
) -> None:
    """Through the controller: it packs below the target, the resize fails on the second
    layer and is put back, every rank is resized back (a no-op here), the scheduler's pool
    stays whole, and generation carries on with identical outputs."""
    engine = engine_at_full_size
    outcomes: list[dict[str, Any]] = []

    def hook(step: int) -> None:
        if step != 4:
            return
        with plugin.state(engine.core).lock, second_allocation_failing():
            outcomes.append(engine.control("shrink", num_blocks=HALF, limits=limits()))
            assert engine.pool.num_gpu_blocks == TOTAL_BLOCKS
            assert [layer[0] for layer in _layout(engine)] == [TOTAL_BLOCKS] * 2
            check_pool(engine.pool)
            check_tables(engine)

    out = engine.run(PROMPTS, hook)
    (outcome,) = outcomes
    assert outcome["status"] == "failed" and "injected" in outcome["reason"], outcome
    assert {i: f.tokens for i, f in out.items()} == {i: f.tokens for i, f in reference.items()}


def _vllm_layer_views(layout: str, spec: str) -> Callable[[bool], tuple[Any, dict[str, Any]]]:
    """A three-layer KV config as vLLM's engine core makes it, and its views from vLLM's
    ``allocate_kv_cache`` (False) or from ``allocate_per_layer`` (True)."""
    from vllm.config import CacheConfig, VllmConfig
    from vllm.v1.core.kv_cache_utils import (
        create_kv_cache_group_specs,
        get_kv_cache_config_from_groups,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    kinds = {
        "full": FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16),
        "padded": FullAttentionSpec(
            block_size=16,
            num_kv_heads=2,
            head_size=8,
            dtype=torch.bfloat16,
            page_size_padded=2 * 16 * 16 * 2 + 64,
        ),
        "full64": FullAttentionSpec(
            block_size=64, num_kv_heads=2, head_size=8, dtype=torch.bfloat16
        ),
        "mla": MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16),
    }
    kernel = [16] if spec == "full64" else None

    def build(per_layer: bool) -> tuple[Any, dict[str, Any]]:
        cache = CacheConfig(block_size=kinds[spec].block_size)
        cache.kv_cache_layout = layout
        cache.num_gpu_blocks_override = 12
        specs = {f"model.layers.{i}.self_attn.attn": kinds[spec] for i in range(3)}
        groups = create_kv_cache_group_specs(specs, [list(specs)])
        config = get_kv_cache_config_from_groups(VllmConfig(cache_config=cache), groups, 1 << 30)
        allocate = worker_side.allocate_per_layer if per_layer else allocate_kv_cache
        return config, allocate(config, torch.device("cpu"), KVCacheLayout[layout], kernel)

    return build


@pytest.mark.parametrize(
    ("layout", "spec", "split"),
    [
        ("LBHNC", "full", True),
        ("LBNHC", "full", True),
        ("LBHNC", "padded", True),
        ("LBNHC", "full64", True),  # 64-token blocks as four 16-token kernel blocks
        ("LBNHC", "mla", True),
        ("BLHNC", "full", False),  # blocks outermost: a block holds every layer's page
        ("LHBNC", "full", False),  # heads outside blocks: a layer is not a run of blocks
    ],
)
def test_per_layer_allocation_gives_vllms_own_views(layout: str, spec: str, split: bool) -> None:
    build = _vllm_layer_views(layout, spec)
    _, theirs = build(False)
    config, ours = build(True)
    assert list(ours) == list(theirs)
    for name, view in ours.items():
        assert (view.shape, view.stride(), view.dtype) == (
            theirs[name].shape,
            theirs[name].stride(),
            theirs[name].dtype,
        )
    storages = {view.untyped_storage().data_ptr() for view in ours.values()}
    assert len(storages) == (3 if split else 1)
    if split:
        assert [(t.layers, t.offset) for t in config.kv_cache_tensors] == [
            ([name], 0) for name in ours
        ]
        for entry, view in zip(config.kv_cache_tensors, ours.values(), strict=True):
            assert view.untyped_storage().nbytes() == entry.size == entry.layer_stride
            assert entry.size == config.num_blocks * entry.block_stride
    else:
        assert [len(t.layers) for t in config.kv_cache_tensors] == [3]

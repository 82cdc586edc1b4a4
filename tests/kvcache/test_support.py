"""Engines the plugin must not touch are refused before anything moves, with the reason:
a KV connector (the default policy's old combination), several KV cache groups, specs other
than full attention, layers sharing KV. The policy refuses compaction beside a connector."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from policy import PolicyError, load_policy, parse_policy
from runtime.kvcache.control import Op
from runtime.kvcache.in_vllm import plugin, scheduler_side
from runtime.kvcache.in_vllm.engine_control import EngineController
from runtime.kvcache.in_vllm.support import engine_refusal
from tests.kvcache.engine import Engine, limits, shared_prefix_prompts

pytestmark = pytest.mark.slow


def _occupied(engine: Engine) -> tuple[list[int], int]:
    occ = scheduler_side.occupancy(engine.pool)
    return sorted(occ.occupied), engine.pool.num_gpu_blocks


def _refuses_mid_generation(engine: Engine, controller: EngineController, reason: str) -> None:
    """Every pass is refused mid-generation, naming ``reason``, and no block id changes."""
    seen: list[dict[str, Any]] = []

    def hook(step: int) -> None:
        if step != 3:
            return
        with plugin.state(engine.core).lock:
            before = _occupied(engine)
            assert before[0], "requests hold blocks at this step"
            seen.append(controller.handle(Op.COMPACT, {"limits": limits()}))
            seen.append(controller.handle(Op.SHRINK, {"num_blocks": 512, "limits": limits()}))
            seen.append(controller.handle(Op.GROW, {}))
            assert _occupied(engine) == before

    engine.run(shared_prefix_prompts(6), hook)
    assert [(o["status"], o["blocks_moved"]) for o in seen] == [("refused", 0)] * 3
    assert all(reason in o["reason"] for o in seen)
    assert controller.status()["refusal"] == seen[0]["reason"]


def test_an_engine_with_a_kv_connector_refuses_every_pass(engine: Engine) -> None:
    from vllm.config import KVTransferConfig

    config = engine.core.vllm_config
    saved = config.kv_transfer_config
    config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both"
    )
    try:
        controller = EngineController(engine.core)
    finally:
        config.kv_transfer_config = saved
    _refuses_mid_generation(engine, controller, "a KV connector (OffloadingConnector)")


def test_a_worker_with_shared_kv_layers_refuses_every_pass(engine: Engine) -> None:
    runner = engine.runner
    saved = dict(runner.shared_kv_cache_layers)
    runner.shared_kv_cache_layers = {
        "model.layers.1.self_attn.attn": "model.layers.0.self_attn.attn"
    }
    try:
        controller = EngineController(engine.core)  # asks every worker over collective_rpc
    finally:
        runner.shared_kv_cache_layers = saved
    _refuses_mid_generation(engine, controller, "share another layer's KV cache")


def test_the_tiny_engine_itself_is_supported(engine: Engine) -> None:
    assert EngineController(engine.core).refusal is None


def test_several_groups_and_other_specs_are_refused(engine: Engine) -> None:
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, SlidingWindowSpec

    real = engine.core.scheduler.kv_cache_config
    (group,) = real.kv_cache_groups
    two = copy.copy(real)
    two.kv_cache_groups = [group, group]
    assert "2 KV cache groups" in (engine_refusal(None, two) or "")
    spec = group.kv_cache_spec
    shape = {
        "block_size": spec.block_size,
        "num_kv_heads": spec.num_kv_heads,
        "head_size": spec.head_size,
        "dtype": spec.dtype,
    }
    chunked = copy.copy(real)
    local = ChunkedLocalAttentionSpec(**shape, attention_chunk_size=128)
    chunked.kv_cache_groups = [replace(group, kv_cache_spec=local)]
    assert "ChunkedLocalAttentionSpec" in (engine_refusal(None, chunked) or "")
    sliding = copy.copy(real)
    window = SlidingWindowSpec(**shape, sliding_window=128)
    sliding.kv_cache_groups = [replace(group, kv_cache_spec=window)]
    assert engine_refusal(None, sliding) is None  # one window group: renamed with nulls
    assert engine_refusal(None, real) is None


@pytest.mark.parametrize("preservation", ["filesystem", "cpu"])
def test_the_policy_refuses_compaction_beside_a_connector(preservation: str) -> None:
    document = load_policy().model_dump(mode="json")
    document["kv_cache"]["kv_preservation"] = preservation
    with pytest.raises(PolicyError) as caught:
        parse_policy(document, "pool.yaml")
    (problem,) = [p for p in caught.value.problems if p.path == "workloads.0.kv_compaction"]
    assert f"kv_preservation is {preservation!r}" in problem.message
    assert "expected kv_compaction: false or kv_preservation: off" in problem.message
    document["workloads"][0]["kv_compaction"] = False
    assert parse_policy(document).kv_cache.kv_preservation == preservation


def test_the_default_policy_is_a_safe_combination() -> None:
    policy = load_policy()
    assert all(
        not w.kv_compaction or policy.kv_cache.kv_preservation == "off" for w in policy.workloads
    )

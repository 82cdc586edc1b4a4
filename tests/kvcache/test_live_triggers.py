"""The sidecar's triggers on the real engine's status: a warm prefix cache with few held
blocks plans a shrink (and the shrink keeps the cache it budgeted), and requests that wait for
blocks on a shrunk pool plan a grow, while requests that only wait for a sequence slot do not
count as short of blocks."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from policy.kvcache import KvCache
from runtime.kvcache.sidecar.triggers import (
    Decision,
    InstanceSample,
    PoolState,
    decide,
    kept_cache,
    planned_size,
    shrink_target,
)
from tests.kvcache.engine import TOTAL_BLOCKS, Engine, limits

pytestmark = pytest.mark.slow

WARM_POOL = 400
"""Pool the warm-cache test fills with prefix-cached blocks (as an instance that served a while)."""
KV = KvCache(shrink_prefix_cache_share=0.02)
"""Budget 0.02 x 4096 = 81 cached blocks: below the 400-block pool, so its warm cache shrinks."""


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(length)] for _ in range(count)]


def plan(engine: Engine, kv: KvCache = KV) -> tuple[dict[str, Any], PoolState, Decision]:
    """What the sidecar decides from the plugin's status now (usage low, no prior sample)."""
    status = engine.control("status")
    pool = PoolState.from_status(status)
    current = InstanceSample(at_s=0.0, usage=status["usage"], prefix_queries=0, prefix_hits=0)
    decision = decide(
        previous=None, current=current, pool=pool, kv=kv, hit_rate_min=0.8,
        last_compaction_at_s=None,
    )  # fmt: skip
    return status, pool, decision


def add(engine: Engine, batch: list[list[int]], tag: str, max_tokens: int) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    for i, prompt in enumerate(batch):
        engine.engine.add_request(f"{tag}-{i}", TokensPrompt(prompt_token_ids=prompt), params)


def finish(engine: Engine) -> dict[str, Any]:
    """Step until every request finished; their outputs by request id."""
    done: dict[str, Any] = {}
    for _ in range(2000):
        if not engine.engine.has_unfinished_requests():
            return done
        done.update((out.request_id, out) for out in engine.engine.step() if out.finished)
    raise AssertionError("generation did not finish")


@contextmanager
def shrunk_to(engine: Engine, num_blocks: int) -> Iterator[None]:
    assert engine.control("shrink", num_blocks=num_blocks, limits=limits())["status"] == "done"
    try:
        yield
    finally:
        finish(engine)
        assert engine.control("grow")["usable_blocks"] == TOTAL_BLOCKS


def test_a_warm_cache_with_few_held_blocks_plans_a_shrink_that_keeps_its_budget(
    engine: Engine,
) -> None:
    batch = prompts(28, 400, seed=21)  # 12 full blocks each stay hashed after they finish
    with shrunk_to(engine, WARM_POOL):
        engine.run(batch, max_tokens=8)
        _, pool, decision = plan(engine)
        assert pool.held_blocks == 0 and pool.occupied_blocks >= 300  # warm: mostly cached
        # counting every cached block as occupied plans no shrink at all
        assert shrink_target(pool.occupied_blocks, KV.shrink_target_usage) > WARM_POOL
        assert kept_cache(pool, KV.shrink_prefix_cache_share) == 81
        assert (decision.action, decision.num_blocks) == ("shrink", planned_size(pool, KV))
        assert decision.num_blocks == 136  # ceil(81 / 0.6) + 1

        shrunk = engine.control("shrink", num_blocks=decision.num_blocks, limits=limits())
        assert shrunk["status"] == "done", shrunk
        after = engine.control("status")
        assert after["usable_blocks"] == 136
        assert after["occupied_blocks"] == 135  # the cache fills the pool; LRU went first
        add(engine, [batch[-1]], "again", max_tokens=1)  # the most recently used prefix
        (again,) = finish(engine).values()
        assert again.num_cached_tokens == 12 * 32


def test_requests_short_of_blocks_on_a_shrunk_pool_plan_a_grow(engine: Engine) -> None:
    with shrunk_to(engine, 60):
        add(engine, prompts(12, 200, seed=22), "short", max_tokens=16)  # 7 blocks each
        engine.engine.step()
        status, pool, decision = plan(engine)
        assert status["num_waiting"] > 0 and pool.blocks_short > 0, status
        assert (decision.action, decision.num_blocks) == ("grow", TOTAL_BLOCKS)
        assert f"lacks {pool.blocks_short} blocks" in decision.reason
        grown = engine.control(decision.action, num_blocks=decision.num_blocks)
        assert grown["status"] == "done", grown
        engine.engine.step()
        assert engine.control("status")["num_waiting"] == 0  # all admitted on the grown pool
        assert len(finish(engine)) == 12

    # more requests than sequence slots (max_num_seqs 32) wait without lacking a block
    add(engine, prompts(40, 64, seed=23), "slots", max_tokens=4)
    engine.engine.step()
    status = engine.control("status")
    assert status["num_waiting"] > 0 and status["blocks_short"] == 0, status
    assert len(finish(engine)) == 40

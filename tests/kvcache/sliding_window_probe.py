"""Run in a fresh interpreter by ``test_sliding_window.py``: a sliding-window tiny model (one
``SlidingWindowSpec`` group, window 64 tokens = 2 blocks) through compaction, shrink and
grow mid-generation. Prints one JSON line with what the test asserts.

A process of its own because vLLM builds one in-process engine per interpreter reliably, and
the session engine of ``conftest.py`` serves the full-attention tests.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from tests.harness.servers import REPO
from tests.kvcache.conftest import ENGINE_ENV
from tests.kvcache.engine import (
    Engine,
    check_pool,
    limits,
    shared_prefix_prompts,
    start_engine,
)

MODEL = REPO / "tests" / "fixtures" / "tiny-mistral"
TOTAL_BLOCKS = 1024
ROOM = 24
"""Blocks a shrink leaves beyond those requests hold (52-ish of 1024: a deep cut)."""


def window_tables(engine: Engine) -> dict[str, int]:
    """Worker tables against the scheduler's for running requests: equal where the scheduler
    still holds the block, anything where the window freed it (the null block); the count of
    freed positions."""
    scheduler = engine.core.scheduler
    (single,) = scheduler.kv_cache_manager.coordinator.single_type_managers
    running = {request.request_id for request in scheduler.running}
    freed = 0
    for req_id, state in engine.runner.requests.items():
        if req_id not in running:
            continue
        (worker_ids,) = state.block_ids
        blocks = single.req_to_blocks.get(req_id, ())
        assert len(worker_ids) == len(blocks), f"{req_id}: table lengths differ"
        for worker_id, block in zip(worker_ids, blocks, strict=True):
            if block.is_null:
                freed += 1
            else:
                assert worker_id == block.block_id, f"{req_id}: live block renamed wrongly"
    return {"freed": freed}


def main() -> None:
    os.environ.update(ENGINE_ENV)
    from runtime.kvcache.in_vllm import plugin

    engine = start_engine(MODEL, TOTAL_BLOCKS)
    spec = engine.core.scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    prompts = shared_prefix_prompts(18, seed=4, num_prefixes=18)  # window-freed blocks unshared
    reference = engine.run(prompts, max_tokens=96)
    outcomes: list[tuple[str, str, str]] = []
    seen: dict[str, int] = {"freed": 0}

    def act(op: str, **args: Any) -> None:
        result = engine.control(op, **args)
        outcomes.append((op, result["status"], result.get("reason", "")))

    def hook(step: int) -> None:
        with plugin.state(engine.core).lock:
            check_pool(engine.pool)
            seen["freed"] = max(seen["freed"], window_tables(engine)["freed"])
        if step == 9:
            held = engine.control("status")["held_blocks"]
            act("shrink", num_blocks=held + ROOM, limits=limits())
        if step in (12, 15):
            act("compact", limits=limits())
        if step == 18:
            act("grow")

    got = engine.run(prompts, hook, max_tokens=96)
    print(
        json.dumps(
            {
                "spec": type(spec).__name__,
                "window": getattr(spec, "sliding_window", None),
                "same_tokens": {i: f.tokens for i, f in got.items()}
                == {i: f.tokens for i, f in reference.items()},
                "outcomes": outcomes,
                **seen,
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

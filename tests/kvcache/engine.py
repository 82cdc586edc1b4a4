"""A real in-process vLLM engine (CPU build, tiny random model) and a replayable workload."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.kvcache.limits import CompactionLimits

TOTAL_BLOCKS = 4096
"""Pool size the engine starts with (64 MiB of KV: big enough that a shrink shows in RSS)."""
PREFIX_TOKENS = 96
"""Shared prefix length: three full 32-token blocks that prefix caching can reuse."""
WAVE_SIZE, WAVE_EVERY = 6, 4
"""Requests arrive in waves so later waves hit prefixes cached (and moved) earlier."""

Hook = Callable[[int], None]


@dataclass
class Finished:
    """Output tokens of one request and how many prompt tokens came from the prefix cache."""

    tokens: list[int]
    cached_tokens: int


def limits(max_moves: int = 4096, saturation_usage: float = 0.8) -> dict[str, Any]:
    """Compaction limits as the control request carries them."""
    return CompactionLimits(max_moves=max_moves, saturation_usage=saturation_usage).__dict__


def start_engine(
    model: Path,
    total_blocks: int | None,
    *,
    gpu_memory_utilization: float | None = None,
    **llm_kwargs: Any,
) -> Engine:
    """A real in-process engine on ``model`` (random weights) with the plugin registered:
    32-token blocks, ``total_blocks`` of them, eager mode, seed 0, weights redrawn wide.

    ``total_blocks=None`` lets vLLM size the pool from ``gpu_memory_utilization`` (a GPU
    check runs a full device); ``llm_kwargs`` add to or replace the other ``LLM`` arguments
    (e.g. ``hf_overrides``)."""
    from vllm import LLM

    from runtime.kvcache.in_vllm import plugin

    plugin.register()  # vLLM loads plugins once per process; another test may have been first
    arguments: dict[str, Any] = {
        "model": str(model),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "block_size": 32,
        "max_model_len": 512,
        "max_num_seqs": 32,
        "enforce_eager": True,
        "num_gpu_blocks_override": total_blocks,
        "seed": 0,
    }
    if gpu_memory_utilization is not None:
        arguments["gpu_memory_utilization"] = gpu_memory_utilization
    llm = LLM(**(arguments | llm_kwargs))
    engine = Engine(llm)
    engine.redraw_weights()
    return engine


class Engine:
    """Wraps ``vllm.LLM`` (in-process) with the handles the tests need."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.engine = llm.llm_engine
        self.core = self.engine.engine_core.engine_core
        self.runner = self.core.model_executor.driver_worker.worker.model_runner

    @property
    def pool(self) -> Any:
        return self.core.scheduler.kv_cache_manager.block_pool

    def redraw_weights(self, seed: int = 0, std: float = 0.08) -> None:
        """Wider random weights than vLLM's dummy loader, so a misplaced block changes tokens."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.runner.model.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * std)

    def control(self, op: str, **args: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.core.gpupool_kv(op, args)
        return result

    def scatter_free_blocks(self, seed: int = 1) -> None:
        """Shuffle the free queue so new allocations land all over the pool (fragmentation)."""
        queue = self.pool.free_block_queue
        blocks = queue.popleft_n(queue.num_free_blocks)
        random.Random(seed).shuffle(blocks)
        queue.append_n(blocks)

    def fill_kv_with_noise(self) -> None:
        """Stale KV of an earlier identical run must never look right to a wrong block id.

        A method, not a loop in ``run``: a loop variable would keep the old KV storage alive
        across a shrink and hide the memory it returns.
        """
        for view in self.runner.kv_caches:
            view.normal_()

    def run(
        self, prompts: list[list[int]], hook: Hook | None = None, max_tokens: int = 40
    ) -> dict[int, Finished]:
        """Greedy generation in waves from a scattered pool full of noise; ``hook(step)`` after
        every step."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        assert self.core.reset_prefix_cache()
        self.scatter_free_blocks()
        self.fill_kv_with_noise()
        params = SamplingParams(
            temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
        )
        pending = list(enumerate(prompts))
        done: dict[int, Finished] = {}
        step = 0
        while pending or self.engine.has_unfinished_requests():
            assert step < 2000, "generation did not finish"
            if step % WAVE_EVERY == 0:
                for i, prompt in pending[:WAVE_SIZE]:
                    self.engine.add_request(str(i), TokensPrompt(prompt_token_ids=prompt), params)
                pending = pending[WAVE_SIZE:]
            for out in self.engine.step():
                if out.finished:
                    done[int(out.request_id)] = Finished(
                        list(out.outputs[0].token_ids), out.num_cached_tokens or 0
                    )
            step += 1
            if hook is not None:
                hook(step)
        return done


def shared_prefix_prompts(count: int, seed: int = 0, num_prefixes: int = 3) -> list[list[int]]:
    """``count`` prompts: one of ``num_prefixes`` shared prefixes plus a unique suffix."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 500) for _ in range(PREFIX_TOKENS)] for _ in range(num_prefixes)]
    return [
        prefixes[i % num_prefixes] + [rng.randrange(3, 500) for _ in range(rng.randrange(5, 40))]
        for i in range(count)
    ]


def check_pool(pool: Any) -> None:
    """Every invariant the scheduler relies on after ids were swapped or the pool resized."""
    assert len(pool.blocks) == pool.num_gpu_blocks
    assert all(block.block_id == i for i, block in enumerate(pool.blocks))
    queue, seen = pool.free_block_queue, 0
    node = queue.fake_free_list_head.next_free_block
    while node is not queue.fake_free_list_tail:
        assert node.ref_cnt == 0 and node.block_id < pool.num_gpu_blocks
        assert pool.blocks[node.block_id] is node
        seen += 1
        node = node.next_free_block
    assert seen == queue.num_free_blocks
    for key, entry in pool.cached_block_hash_to_block._cache.items():
        blocks = entry.values() if isinstance(entry, dict) else [entry]
        for block in blocks:
            assert pool.blocks[block.block_id] is block
            assert block.block_hash == key or key in pool.cached_block_hashes_by_block.get(
                block.block_id, ()
            )


def check_tables(engine: Engine) -> None:
    """The worker's block tables name the blocks the scheduler gave each request: every
    ``CachedRequestState.block_ids`` (what a request's rows are rebuilt from when it is
    scheduled again) equals the ids of the scheduler's ``req_to_blocks``, for every request
    the scheduler runs. Requests it finished, aborted or preempted keep stale ids on the
    worker until the next step drops them or a resumption replaces them whole; those ids
    are free to the scheduler and never read, so they are skipped."""
    scheduler = engine.core.scheduler
    (single,) = scheduler.kv_cache_manager.coordinator.single_type_managers
    running = {request.request_id for request in scheduler.running}
    for req_id, state in engine.runner.requests.items():
        if req_id not in running:
            continue
        (worker_ids,) = state.block_ids
        scheduler_ids = [block.block_id for block in single.req_to_blocks.get(req_id, ())]
        assert list(worker_ids) == scheduler_ids, f"request {req_id}: tables disagree"


def check_engine(engine: Engine) -> None:
    """``check_pool`` and ``check_tables`` under the plugin's lock, so no control request
    runs while they read (between steps, where passes run)."""
    from runtime.kvcache.in_vllm import plugin

    with plugin.state(engine.core).lock:
        check_pool(engine.pool)
        check_tables(engine)

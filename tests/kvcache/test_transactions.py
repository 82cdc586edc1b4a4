"""A pass is transactional and runs between steps: a worker that fails leaves scheduler and
workers as they were, a bad plan moves nothing, and control requests arriving while adds
and aborts run corrupt nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.kvcache.control import ControlClient
from runtime.kvcache.in_vllm import plugin, scheduler_side, worker_side
from runtime.kvcache.planner import Move
from tests.kvcache.engine import (
    Engine,
    Finished,
    check_pool,
    check_tables,
    limits,
    shared_prefix_prompts,
)

pytestmark = pytest.mark.slow

PROMPTS = shared_prefix_prompts(12, seed=5)


@pytest.fixture(scope="module")
def reference(engine: Engine) -> dict[int, Finished]:
    return engine.run(PROMPTS)


@contextmanager
def worker_method(name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    """Swap one of the plugin's worker methods (what ``collective_rpc`` calls by name)."""
    from vllm.v1.worker.worker_base import WorkerBase

    original = getattr(WorkerBase, name)
    setattr(WorkerBase, name, replacement)
    try:
        yield
    finally:
        setattr(WorkerBase, name, original)


def _state(engine: Engine) -> tuple[Any, ...]:
    occ = scheduler_side.occupancy(engine.pool)
    tables = {r: [list(ids) for ids in s.block_ids] for r, s in engine.runner.requests.items()}
    return (
        sorted(occ.occupied),
        engine.pool.num_gpu_blocks,
        engine.runner.kv_cache_config.num_blocks,
        tables,
    )


def _failing_pass(
    engine: Engine,
    reference: dict[int, Finished],
    op: str,
    kept: Callable[[Engine], Any],
    **args: Any,
) -> list[dict[str, Any]]:
    """Run the workload with a worker method failing; ``op`` at step 4 must fail and leave
    ``kept(engine)`` as it was, every table consistent, and the outputs unchanged."""
    outcomes: list[dict[str, Any]] = []

    def hook(step: int) -> None:
        if step != 4:
            return
        with plugin.state(engine.core).lock:
            before = kept(engine)
            outcomes.append(engine.control(op, **args))
            assert kept(engine) == before
            check_pool(engine.pool)
            check_tables(engine)

    got = engine.run(PROMPTS, hook)
    assert {i: f.tokens for i, f in got.items()} == {i: f.tokens for i, f in reference.items()}
    return outcomes


def _sizes(engine: Engine) -> tuple[int, int, int]:
    """Pool size as the scheduler, the worker's config and its buffer see it."""
    return (
        engine.pool.num_gpu_blocks,
        engine.runner.kv_cache_config.num_blocks,
        engine.runner.kv_caches[0].shape[0],
    )


def test_a_worker_failing_after_its_renames_is_rolled_back(
    engine: Engine, reference: dict[int, Finished]
) -> None:
    def relocate_then_fail(self: Any, pairs: list[tuple[int, int]], strategy: Any) -> int:
        worker_side.relocate(self.model_runner, [Move(s, d) for s, d in pairs], strategy)
        raise RuntimeError("rank 1 lost its device")

    with worker_method("gpupool_kv_relocate", relocate_then_fail):
        (outcome,) = _failing_pass(engine, reference, "compact", _state, limits=limits())
    assert outcome["status"] == "failed"
    assert "rank 1 lost its device" in outcome["reason"] and "rolled back" in outcome["reason"]


def test_a_worker_failing_a_shrink_leaves_the_pool_intact(
    engine: Engine, reference: dict[int, Finished]
) -> None:
    real = worker_side.resize
    calls: list[int] = []

    def resize_fails_once(self: Any, num_blocks: int) -> dict[str, int]:
        calls.append(num_blocks)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        from dataclasses import asdict

        return asdict(real(self.model_runner, int(num_blocks)))

    total = engine.pool.num_gpu_blocks
    with worker_method("gpupool_kv_resize", resize_fails_once):
        # The packing before the resize is a pass of its own and stands; the sizes do not move.
        (outcome,) = _failing_pass(
            engine, reference, "shrink", _sizes, num_blocks=1024, limits=limits()
        )
    assert outcome["status"] == "failed" and "out of memory" in outcome["reason"]
    assert calls == [1024, total]  # the failed target, then every rank back to the pool size


def test_a_plan_the_pool_cannot_take_moves_nothing(engine: Engine) -> None:
    prompts = shared_prefix_prompts(6, seed=9)
    seen: list[str] = []

    def hook(step: int) -> None:
        if step != 3:
            return
        with plugin.state(engine.core).lock:
            occ = scheduler_side.occupancy(engine.pool)
            before = _state(engine)
            bad = [
                [Move(occ.free[0], occ.free[1])],  # source not occupied
                [Move(occ.occupied[0], occ.occupied[1])],  # destination occupied
                [Move(occ.occupied[0], occ.free[0]), Move(occ.occupied[1], occ.free[0])],
                [Move(occ.occupied[0], engine.pool.num_gpu_blocks)],  # outside the pool
            ]
            for moves in bad:
                with pytest.raises(scheduler_side.PoolStateError) as caught:
                    plugin.controller(engine.core)._relocate(moves, "runs")
                seen.append(str(caught.value))
                assert _state(engine) == before

    engine.run(prompts, hook)
    assert len(seen) == 4 and "appears twice" in seen[2] and "outside the pool" in seen[3]


def test_control_requests_beside_adds_and_aborts_corrupt_nothing(
    engine: Engine, reference: dict[int, Finished], control_token: tuple[Path, Path, str]
) -> None:
    """A thread hammers the control socket (compact, shrink, grow, status) while the engine
    adds requests, aborts some and steps: the survivors' outputs equal the reference and
    every table stays consistent; nothing deadlocks."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    socket, _, token = control_token
    client = ControlClient(socket, token, timeout_s=30)
    stop = threading.Event()
    answers: list[str] = []
    errors: list[BaseException] = []

    def hammer() -> None:
        ops = [
            ("compact", {"limits": limits()}),
            ("shrink", {"num_blocks": 1024, "limits": limits()}),
            ("status", {}),
            ("grow", {}),
        ]
        try:
            i = 0
            while not stop.is_set():
                op, args = ops[i % len(ops)]
                answers.append(str(client.call(op, **args).get("status", "status")))
                i += 1
        except BaseException as exc:  # reported below, never swallowed
            errors.append(exc)

    engine.core.reset_prefix_cache()
    engine.scatter_free_blocks()
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, detokenize=False)
    aborted = {1, 6, 10}
    done: dict[int, Finished] = {}
    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        for i, prompt in enumerate(PROMPTS):
            engine.engine.add_request(str(i), TokensPrompt(prompt_token_ids=prompt), params)
        step = 0
        while engine.engine.has_unfinished_requests():
            assert step < 2000, "generation did not finish"
            if step == 5:
                engine.engine.abort_request([str(i) for i in aborted])
            for out in engine.engine.step():
                if out.finished and int(out.request_id) not in aborted:
                    done[int(out.request_id)] = Finished(
                        list(out.outputs[0].token_ids), out.num_cached_tokens or 0
                    )
            with plugin.state(engine.core).lock:
                check_pool(engine.pool)
                check_tables(engine)
            step += 1
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive() and not errors
    assert {i: f.tokens for i, f in done.items()} == {
        i: f.tokens for i, f in reference.items() if i not in aborted
    }
    assert "done" in answers  # passes really ran between the steps
    engine.control("grow")

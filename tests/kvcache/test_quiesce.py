"""The quiesce point: with batches in flight between steps (async scheduling, pipeline
parallelism) a compact, shrink or grow holds new batches back, the batch queue drains, the
request runs, and scheduling resumes; past the bound the request is deferred.

What runs here and what does not: vLLM's CPU build forces async scheduling off
(``CpuPlatform.check_and_update_config``), and pipeline parallelism on it (2 ranks, mp
executor, ``VLLM_CPU_OMP_THREADS_BIND=0|1``) fails inside vLLM's own ``update_from_output``
(KeyError on a request id, without the plugin), so no configuration gives the CPU engine a
batch queue of its own. The tests give the real in-process ``EngineCore`` the batch queue
its ``__init__`` builds when ``max_concurrent_batches`` is 2 or 3: ``step_with_batch_queue``,
the scheduler and the CPU model runner then run for real with one or two batches queued at
every step boundary (their outputs not yet processed). The uniprocess executor computes a
batch before it returns the batch's future, so nothing here executes on a device while a pass
runs; the drain on a GPU, where the queued batch is still executing, is not run.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.kvcache.control import ControlClient, Op
from runtime.kvcache.in_vllm import plugin
from tests.kvcache.engine import (
    WAVE_EVERY,
    WAVE_SIZE,
    Engine,
    Finished,
    check_engine,
    limits,
    shared_prefix_prompts,
)

PROMPTS = shared_prefix_prompts(24, seed=11)
LAST_WAVE = (len(PROMPTS) // WAVE_SIZE - 1) * WAVE_EVERY + 1
"""The hook's step after which ``Engine.run`` adds no more requests."""


@pytest.mark.parametrize(
    ("in_flight", "steps", "elapsed_s", "verdict"),
    [
        (0, 0, 0.0, "run"),  # nothing in flight: run at once
        (0, 5, 9.0, "run"),  # drained, however long it took
        (1, 0, 0.0, "drain"),
        (2, 1, 1.9, "drain"),
        (1, 2, 0.1, "give up"),  # the queue's size in steps
        (1, 1, 2.0, "give up"),  # the time bound
    ],
)
def test_drain_verdict(in_flight: int, steps: int, elapsed_s: float, verdict: str) -> None:
    assert (
        plugin.drain_verdict(
            in_flight=in_flight, steps=steps, elapsed_s=elapsed_s, max_steps=2, max_s=2.0
        )
        == verdict
    )


@pytest.fixture(scope="module")
def reference(engine: Engine) -> dict[int, Finished]:
    """The workload without a batch queue and without any pass."""
    return engine.run(PROMPTS)


@contextmanager
def batch_queue(engine: Engine, size: int) -> Iterator[Any]:
    """The batch queue ``EngineCore.__init__`` builds for ``max_concurrent_batches == size``."""
    core = engine.core
    assert core.batch_queue is None
    core.batch_queue_size, core.batch_queue = size, deque(maxlen=size)
    core.step_fn = core.step_with_batch_queue
    try:
        yield core
    finally:
        while core.batch_queue:  # the busy loop steps on while batches are queued (has_work)
            core.step_fn()
        core.batch_queue, core.batch_queue_size, core.step_fn = None, 1, core.step


def admit(core: Any, op: Op, **args: Any) -> plugin.EngineJob:
    """What the engine's main thread does with a control request from its input queue."""
    from vllm.v1.engine.core import EngineCoreProc

    job = plugin.control_job(core, op, args)
    EngineCoreProc._handle_client_request(core, plugin.JOB_REQUEST, job)
    return job


@pytest.mark.slow
def test_a_full_batch_queue_drains_for_compact_shrink_and_grow_and_scheduling_resumes(
    engine: Engine, reference: dict[int, Finished], control_token: tuple[Path, Path, str]
) -> None:
    socket, _, token = control_token
    in_flight: list[int] = []
    direct: list[dict[str, Any]] = []
    jobs: dict[int, plugin.EngineJob] = {}
    remote: list[dict[str, Any]] = []
    caller = threading.Thread(
        target=lambda: remote.append(ControlClient(socket, token).call(Op.COMPACT, limits=limits()))
    )
    requests: dict[int, tuple[str, dict[str, Any]]] = {
        5: (Op.COMPACT, {"limits": limits()}),
        9: (Op.SHRINK, {"num_blocks": 512, "limits": limits()}),
        13: (Op.GROW, {}),
    }

    with batch_queue(engine, 2) as core:

        def hook(step: int) -> None:
            check_engine(engine)
            if step - 1 in jobs:  # the step after the admission held new batches back
                job = jobs[step - 1]
                assert job.done.is_set() and len(core.batch_queue) == 0
            elif step <= LAST_WAVE:
                in_flight.append(len(core.batch_queue))
            if step == 3:  # a utility call does not drain: deferred while a batch is in flight
                direct.append(engine.control("compact", limits=limits()))
            if step == 7:  # a shrink too, and it changes nothing
                before = [id(b) for b in engine.pool.blocks]
                direct.append(engine.control("shrink", num_blocks=512, limits=limits()))
                assert [id(b) for b in engine.pool.blocks] == before
                assert engine.runner.kv_caches[0].shape[0] == len(before)
            if step == 11:  # a grow too (it swaps the buffer the batch in flight writes)
                direct.append(engine.control("grow"))
            if step in requests:
                assert step % WAVE_EVERY != 0  # no wave is added before the drain step
                op, args = requests[step]
                jobs[step] = admit(core, op, **args)
                assert not jobs[step].done.is_set()  # parked: a batch is in flight
            if step == LAST_WAVE + 1:  # a socket request from another thread
                caller.start()

        out = engine.run(PROMPTS, hook)
        assert plugin.state(core).drain is None
    caller.join(timeout=60)
    # under load a batch is in flight at every step boundary: without the drain, every
    # request would be deferred
    assert min(in_flight) >= 1
    assert [d["status"] for d in direct] == ["deferred"] * 3, direct
    assert all("1 batches in flight" in d["reason"] for d in direct)
    assert all("retry through the control socket" in d["reason"] for d in direct)
    results = {step: job.result for step, job in jobs.items()}
    assert all(r is not None and r["status"] == "done" for r in results.values()), results
    assert results[9] is not None and results[9]["usable_blocks"] == 512
    assert remote and remote[0]["status"] in ("done", "noop"), remote
    assert {i: f.tokens for i, f in out.items()} == {i: f.tokens for i, f in reference.items()}


@pytest.mark.slow
def test_a_drain_past_its_bound_is_deferred_and_changes_nothing(
    engine: Engine, reference: dict[int, Finished], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    with batch_queue(engine, 4) as core:

        def hook(step: int) -> None:
            check_engine(engine)
            job = seen.get("job")
            if job is not None and not job.done.is_set():
                assert len(core.batch_queue) > 0  # still draining: nothing new was queued
                if job is seen.get("gave_up"):  # the time bound passes before the next step
                    monkeypatch.setattr(plugin, "QUIESCE_MAX_S", 0.0)
                return
            if job is not None and job is seen.get("gave_up") and "after" not in seen:
                seen["after"] = [id(b) for b in engine.pool.blocks]
            if step <= LAST_WAVE or len(core.batch_queue) != 3:
                return
            if "drained" not in seen:  # three in flight, within the bound: three steps, then run
                seen["drained"] = seen["job"] = admit(core, Op.COMPACT, limits=limits())
            elif "gave_up" not in seen:
                seen["before"] = [id(b) for b in engine.pool.blocks]
                seen["gave_up"] = seen["job"] = admit(core, Op.COMPACT, limits=limits())

        out = engine.run(PROMPTS, hook)
        assert plugin.state(core).drain is None
    drained, gave_up = seen["drained"].result, seen["gave_up"].result
    assert drained["status"] in ("done", "noop"), drained
    assert gave_up["status"] == "deferred", gave_up
    reason = gave_up["reason"]
    assert "1 batches still in flight after holding new batches back for 2 steps" in reason
    assert "bound 4 steps or 0 s" in reason
    assert seen["after"] == seen["before"]  # no block moved
    assert {i: f.tokens for i, f in out.items()} == {i: f.tokens for i, f in reference.items()}

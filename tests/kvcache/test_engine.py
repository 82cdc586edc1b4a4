"""Compaction, shrink and grow inside the real vLLM engine, mid-generation, greedy decoding."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime.kvcache.control import ControlClient, ControlError
from runtime.kvcache.in_vllm.mover import BlockMover
from tests.kvcache.engine import (
    PREFIX_TOKENS,
    TOTAL_BLOCKS,
    WAVE_SIZE,
    Engine,
    Finished,
    check_engine,
    limits,
    shared_prefix_prompts,
)

pytestmark = pytest.mark.slow

PROMPTS = shared_prefix_prompts(24)
BLOCK_BYTES = 2 * 32 * 2 * 2 * 32 * 2
"""Bytes of one block over all layers: 2 layers x 32 tokens x 2 KV heads x (K+V) x 32 x bf16."""


@pytest.fixture(scope="module")
def reference(engine: Engine) -> dict[int, Finished]:
    """The same workload without any compaction."""
    return engine.run(PROMPTS)


def test_compaction_and_shrink_mid_generation_keep_outputs(
    engine: Engine, reference: dict[int, Finished], control_token: tuple[Path, str, str]
) -> None:
    socket, _, token = control_token
    client = ControlClient(socket, token)
    outcomes: list[tuple[str, dict[str, Any]]] = []
    remote: list[dict[str, Any]] = []
    caller = threading.Thread(target=lambda: remote.append(client.call("compact", limits=limits())))

    def hook(step: int) -> None:
        check_engine(engine)
        if step in (3, 11):
            outcomes.append(("compact", engine.control("compact", limits=limits())))
        if step == 6:
            outcomes.append(("shrink", engine.control("shrink", num_blocks=512, limits=limits())))
        if step == 9:
            outcomes.append(("grow", engine.control("grow")))
        if step == 13:
            outcomes.append(("shrink", engine.control("shrink", num_blocks=640, limits=limits())))
        if step == 15:
            caller.start()  # through the socket, concurrently with the next steps
        if step == 20:
            caller.join(timeout=60)

    out = engine.run(PROMPTS, hook)
    engine.control("grow")

    assert {i: f.tokens for i, f in out.items()} == {i: f.tokens for i, f in reference.items()}
    statuses = [(op, o["status"]) for op, o in outcomes]
    assert statuses == [
        ("compact", "done"),
        ("shrink", "done"),
        ("grow", "done"),
        ("compact", "done"),
        ("shrink", "done"),
    ], outcomes
    assert all(o["blocks_moved"] > 0 for op, o in outcomes if op == "compact")
    assert remote and remote[0]["status"] in ("done", "noop")
    first_shrink = outcomes[1][1]
    assert first_shrink["usable_blocks"] == 512
    assert first_shrink["released_bytes"] == (TOTAL_BLOCKS - 512) * BLOCK_BYTES
    assert first_shrink["released_measured_bytes"] >= 0.9 * first_shrink["released_bytes"]
    # prefix caching kept hitting the moved blocks: every request after the first wave
    assert all(out[i].cached_tokens >= PREFIX_TOKENS for i in range(WAVE_SIZE, len(PROMPTS)))


def test_relocating_ids_without_copying_changes_outputs(
    engine: Engine, reference: dict[int, Finished], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the output comparison above can fail."""
    monkeypatch.setattr(BlockMover, "move", lambda self, moves: 0)

    def hook(step: int) -> None:
        if step in (3, 7, 11, 15):
            assert engine.control("compact", limits=limits())["status"] == "done"

    out = engine.run(PROMPTS, hook)
    changed = sum(out[i].tokens != reference[i].tokens for i in reference)
    assert changed >= 1, "relocating ids without the data went unnoticed"


def test_shrunk_pool_never_allocates_above_its_size_and_grow_restores(engine: Engine) -> None:
    size = 256
    assert engine.control("shrink", num_blocks=size, limits=limits())["status"] == "done"
    highest: list[int] = []
    allocate = engine.pool.get_new_blocks

    def recording(num_blocks: int) -> list[Any]:
        blocks: list[Any] = allocate(num_blocks)
        highest.extend(b.block_id for b in blocks)
        return blocks

    engine.pool.get_new_blocks = recording
    try:
        engine.run(PROMPTS)
        assert highest and max(highest) < size
        assert engine.runner.input_batch.block_table.block_tables[0].block_table.np.max() < size
        check_engine(engine)
        grown = engine.control("grow")
        assert grown["status"] == "done" and grown["usable_blocks"] == TOTAL_BLOCKS
        assert engine.runner.kv_caches[0].shape[0] == TOTAL_BLOCKS
        highest.clear()
        long_prompts = [p * 3 for p in shared_prefix_prompts(32, seed=5)]  # ~10 blocks each
        engine.run(long_prompts, max_tokens=8)
        assert max(highest) >= size  # the regained capacity is handed out again
        check_engine(engine)
    finally:
        del engine.pool.get_new_blocks


def test_saturated_compaction_is_deferred_and_passes_are_bounded(
    engine: Engine, reference: dict[int, Finished]
) -> None:
    assert engine.control("shrink", num_blocks=40, limits=limits())["status"] == "done"
    seen: dict[str, dict[str, Any]] = {}

    def hook(step: int) -> None:
        state = engine.control("status")
        if state["blocks_short"] > 0 and "deferred" not in seen:
            before = [id(b) for b in engine.pool.blocks]
            seen["deferred"] = engine.control("compact", limits=limits())
            assert [id(b) for b in engine.pool.blocks] == before  # nothing touched
        elif state["num_waiting"] == 0 and state["fragmentation"] > 0 and "bounded" not in seen:
            seen["bounded"] = engine.control("compact", limits=limits(max_moves=2))
        check_engine(engine)

    out = engine.run(PROMPTS, hook)
    engine.control("grow")
    assert seen["deferred"]["status"] == "deferred"
    assert "waiting requests lacks" in seen["deferred"]["reason"]
    assert seen["bounded"]["status"] == "done" and seen["bounded"]["blocks_moved"] == 2
    assert {i: f.tokens for i, f in out.items()} == {i: f.tokens for i, f in reference.items()}


def test_a_shrink_below_the_floor_is_refused_through_the_socket_and_changes_nothing(
    engine: Engine, reference: dict[int, Finished], control_token: tuple[Path, str, str]
) -> None:
    """The floor (held blocks + one max_model_len sequence + the null block) holds for any
    client of the control socket (``gpupool kv-sidecar shrink N`` is one), not only for the
    sidecar's own requests: refused with the floor in the reason, nothing evicted or cut."""
    socket, _, token = control_token
    client = ControlClient(socket, token)
    refused: list[tuple[int, dict[str, Any]]] = []

    def hook(step: int) -> None:
        if step == 5:
            before = engine.control("status")
            assert before["held_blocks"] > 0
            floor = before["held_blocks"] + 512 // 32 + 1
            for num_blocks in (floor - 1, before["held_blocks"]):
                outcome = client.call("shrink", num_blocks=num_blocks, limits=limits())
                refused.append((floor, outcome))
                after = engine.control("status")
                assert after["usable_blocks"] == before["usable_blocks"] == TOTAL_BLOCKS
                assert after["occupied_blocks"] == before["occupied_blocks"]  # no cache evicted

    out = engine.run(PROMPTS, hook)
    assert len(refused) == 2
    for floor, outcome in refused:
        assert outcome["status"] == "refused", outcome
        assert f"below the floor of {floor} blocks: requests hold {floor - 17}" in outcome["reason"]
    assert {i: f.tokens for i, f in out.items()} == {i: f.tokens for i, f in reference.items()}


def _run_at_once(
    engine: Engine, prompts: list[list[int]], hook: Any = None, max_tokens: int = 8
) -> dict[int, list[int]]:
    """Greedy generation with every request added before the first step (more of them than
    sequence slots), from a scattered pool full of noise; ``hook(step)`` after every step."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    assert engine.core.reset_prefix_cache()
    engine.scatter_free_blocks()
    engine.fill_kv_with_noise()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    for i, prompt in enumerate(prompts):
        engine.engine.add_request(f"slots-{i}", TokensPrompt(prompt_token_ids=prompt), params)
    done: dict[int, list[int]] = {}
    step = 0
    while engine.engine.has_unfinished_requests():
        assert step < 2000, "generation did not finish"
        for out in engine.engine.step():
            if out.finished:
                done[int(out.request_id.removeprefix("slots-"))] = list(out.outputs[0].token_ids)
        step += 1
        if hook is not None:
            hook(step)
    return done


def test_requests_waiting_only_for_sequence_slots_do_not_defer_compaction(
    engine: Engine,
) -> None:
    """40 requests of 16 blocks for 32 sequence slots (``max_num_seqs``) on a 4096-block
    pool: requests wait although blocks are free, and a compaction runs (and moves blocks)
    mid-generation with identical outputs; a shrink to the floor, where the waiting
    requests together would not fit, is deferred and changes nothing; so is one to a pool
    that would fit them were it not for the blocks the running requests hold (one block
    short with them counted, room to spare without)."""
    rng = random.Random(31)
    prompts = [[rng.randrange(3, 500) for _ in range(470)] for _ in range(40)]
    reference = _run_at_once(engine, prompts)
    seen: dict[str, dict[str, Any]] = {}

    def hook(step: int) -> None:
        check_engine(engine)
        state = engine.control("status")
        if "compact" in seen or state["num_waiting"] == 0:
            return
        assert state["blocks_short"] == 0 and state["usage"] < 0.8, state
        seen["state"] = state
        floor = state["held_blocks"] + 512 // 32 + 1
        before = [id(b) for b in engine.pool.blocks]
        seen["shrink"] = engine.control("shrink", num_blocks=floor, limits=limits())
        scheduler = engine.core.scheduler
        queued = sum(-(-r.num_tokens // scheduler.block_size) for r in scheduler.waiting)
        assert scheduler.scheduler_config.watermark == 0  # else the pool below keeps it free
        one_short = queued + state["held_blocks"]  # + the null block would be an exact fit
        assert one_short >= floor and state["held_blocks"] > 1  # not refused; held decides
        seen["held"] = engine.control("shrink", num_blocks=one_short, limits=limits())
        assert [id(b) for b in engine.pool.blocks] == before  # nothing touched
        seen["compact"] = engine.control("compact", limits=limits())
        check_engine(engine)

    out = _run_at_once(engine, prompts, hook)
    assert seen["state"]["num_waiting"] >= 40 - 32, seen["state"]
    compact, shrink = seen["compact"], seen["shrink"]
    assert compact["status"] == "done" and compact["blocks_moved"] > 0, compact
    assert shrink["status"] == "deferred", shrink
    assert "waiting requests would lack" in shrink["reason"], shrink
    held = seen["held"]
    assert held["status"] == "deferred", held
    assert "would lack 1 KV blocks" in held["reason"], held
    assert out == reference


def test_control_socket_rejects_a_wrong_token(
    engine: Engine, control_token: tuple[Path, str, str]
) -> None:
    socket, _, _ = control_token
    with pytest.raises(ControlError, match="unauthorized"):
        ControlClient(socket, "not-the-token").call("status")
    with pytest.raises(ControlError, match="unknown op"):
        ControlClient(socket, control_token[2]).call("defragment-everything")
    assert (socket.stat().st_mode & 0o777) == 0o600

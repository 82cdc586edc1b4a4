"""The sidecar's pure decisions and metric parsing, and the sidecar's container spec."""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from ruamel.yaml import YAML

from infra.builders.compaction_sidecar import (
    compaction_sidecar,
    compaction_volumes,
    vllm_plugin_env,
    vllm_plugin_mounts,
)
from policy import DEFAULT_POLICY, PolicyError, load_policy
from policy.kvcache import KvCache
from runtime.kvcache.control import ControlClient, ControlServer
from runtime.kvcache.sidecar.service import CompactionSidecar, parse_sample
from runtime.kvcache.sidecar.triggers import (
    Decision,
    InstanceSample,
    PoolState,
    decide,
    hit_rate,
    planned_size,
    shrink_floor,
    shrink_target,
)
from tests.harness.policy_docs import set_path

KV = KvCache()
FULL = PoolState(
    usable_blocks=1000, original_blocks=1000, occupied_blocks=120, held_blocks=120,
    max_model_len=512, block_size=32, blocks_short=0,
)  # fmt: skip
SHRUNK = replace(FULL, usable_blocks=300)
SEQUENCE_BLOCKS = 512 // 32
"""Blocks one ``max_model_len`` sequence needs in FULL and SHRUNK."""


def sample(
    at: float, usage: float, queries: float = 0, hits: float = 0, preempted: float | None = None
) -> InstanceSample:
    return InstanceSample(at, usage, queries, hits, preempted)


def run(
    pool: PoolState,
    current: InstanceSample,
    previous: InstanceSample | None = None,
    kv: KvCache = KV,
    **extra: Any,
) -> Decision:
    return decide(
        previous=previous, current=current, pool=pool, kv=kv, hit_rate_min=0.8,
        last_compaction_at_s=extra.pop("last_compaction_at_s", None), **extra,
    )  # fmt: skip


def test_low_usage_shrinks_so_held_blocks_fill_the_target_share() -> None:
    decision = run(FULL, sample(0, 0.12))
    assert decision.action == "shrink"
    assert decision.num_blocks == shrink_target(120, KV.shrink_target_usage) == 201
    assert 120 / (decision.num_blocks - 1) <= KV.shrink_target_usage


@pytest.mark.parametrize(
    ("held", "occupied", "share", "max_model_len", "expected"),
    [
        # no cache: the held blocks alone fill 60 %
        (120, 120, 0.10, 512, 201),
        # a warm cache (every free block still hashed) counts only its budget of 100 blocks:
        # ceil((10 + 100) / 0.6) + 1; counting all 980 cached blocks would ask for 1651
        (10, 990, 0.10, 512, 185),
        # a cache smaller than its budget counts whole: ceil((10 + 50) / 0.6) + 1
        (10, 60, 0.10, 512, 101),
        # budget 0: ceil(10 / 0.6) + 1 = 18, below the floor 10 + 16 + 1
        (10, 990, 0.0, 512, 27),
        # an idle pool keeps one max_model_len sequence: 0 + 16 + 1 (not 2)
        (0, 0, 0.10, 512, 17),
        # a sequence that ends inside a block needs that block: ceil(500 / 32) = 16
        (0, 0, 0.10, 500, 17),
        (0, 0, 0.10, 513, 18),
        # long sequences: 0 + ceil(4096 / 32) + 1 = 129 beats ceil(40 / 0.6) + 1 = 68
        (0, 40, 0.10, 4096, 129),
    ],
)
def test_shrink_target_counts_held_blocks_a_bounded_cache_and_the_floor(
    held: int, occupied: int, share: float, max_model_len: int, expected: int
) -> None:
    pool = replace(FULL, held_blocks=held, occupied_blocks=occupied, max_model_len=max_model_len)
    kv = KvCache(shrink_prefix_cache_share=share)
    assert planned_size(pool, kv) == expected
    assert shrink_floor(pool) == held + -(-max_model_len // 32) + 1
    decision = run(pool, sample(0, 0.05), kv=kv)
    assert (decision.action, decision.num_blocks) == ("shrink", expected)


def test_a_pool_at_or_below_its_target_or_floor_is_compacted_not_shrunk() -> None:
    small = replace(FULL, usable_blocks=150)  # target 201 > 150
    assert run(small, sample(0, 0.1)).action == "compact"
    tight = replace(FULL, usable_blocks=30, held_blocks=14, occupied_blocks=14)
    assert shrink_floor(tight) == 14 + SEQUENCE_BLOCKS + 1 == 31  # floor above the pool
    assert run(tight, sample(0, 0.1)).action == "compact"


def test_usage_at_threshold_and_min_interval_hold_compaction_back() -> None:
    busy = run(FULL, sample(0, KV.compaction_usage_below))
    assert busy.action == "none"
    recent = run(FULL, sample(299, 0.1), last_compaction_at_s=0)
    assert recent.action == "none" and "5m" in recent.reason
    due = run(FULL, sample(300, 0.1), last_compaction_at_s=0)
    assert due.action == "shrink"


@pytest.mark.parametrize(
    ("pool", "previous", "current", "reason"),
    [
        # the next waiting request lacks blocks (the plugin's blocks_short)
        (replace(SHRUNK, blocks_short=3), None, sample(15, 0.7), "lacks 3 blocks"),
        # preemptions since the last sample (vLLM preempts only for lack of blocks)
        (SHRUNK, sample(0, 0.7, preempted=5), sample(15, 0.7, preempted=7), "2 requests preempted"),
        # prefix hit rate 0.6 < 0.8 since the last sample
        (SHRUNK, sample(0, 0.7, 1000, 900), sample(15, 0.7, 2000, 1500), "hit rate 0.60 < 0.80"),
        # no evidence: a counter missing on either side, a counter reset, nothing new
        (SHRUNK, sample(0, 0.7), sample(15, 0.7, preempted=7), None),
        (SHRUNK, sample(0, 0.7, preempted=7), sample(15, 0.7, preempted=2), None),
        (SHRUNK, sample(0, 0.7, preempted=7), sample(15, 0.7, preempted=7), None),
        (SHRUNK, sample(0, 0.7, 2000, 1500), sample(15, 0.7, 1000, 900), None),
        # a full-size pool has nothing to grow back to, whatever the signals
        (
            replace(FULL, blocks_short=3),
            sample(0, 0.7, 1000, 900, preempted=5),
            sample(15, 0.7, 2000, 1500, preempted=9),
            None,
        ),
    ],
)  # fmt: skip
def test_a_shrunk_pool_grows_back_when_requests_wait_or_are_preempted_or_hits_drop(
    pool: PoolState, previous: InstanceSample, current: InstanceSample, reason: str | None
) -> None:
    decision = run(pool, current, previous)
    if reason is None:
        assert decision.action == "none", decision  # usage 0.7 is above the compaction trigger
    else:
        assert (decision.action, decision.num_blocks) == ("grow", 1000)
        assert reason in decision.reason


def test_hit_rate_between_samples() -> None:
    before, after = sample(0, 0.7, 1000, 900), sample(15, 0.7, 2000, 1500)
    assert hit_rate(before, after) == pytest.approx(0.6)
    assert hit_rate(None, after) is None
    assert hit_rate(after, after) is None  # no queries since
    assert hit_rate(after, before) is None  # counter reset: no rate, no decision from it


@pytest.mark.parametrize(
    ("pool", "requested", "action", "num_blocks", "words"),
    [
        (FULL, 400, "shrink", 400, "shrink to 400 blocks requested"),
        # below the floor (120 held + 16 + 1): raised to it
        (FULL, 50, "shrink", 137, "raised to the floor of 137 blocks"),
        (FULL, 137, "shrink", 137, "shrink to 137 blocks requested"),
        # the floor is not below the pool: nothing to give back
        (replace(FULL, usable_blocks=130), 50, "none", None, "not below the pool's 130"),
    ],
)
def test_explicit_shrink_wins_but_never_goes_below_the_floor(
    pool: PoolState, requested: int, action: str, num_blocks: int | None, words: str
) -> None:
    decision = run(replace(pool, blocks_short=5), sample(0, 0.9), shrink_request=requested)
    assert (decision.action, decision.num_blocks) == (action, num_blocks)
    assert words in decision.reason


def test_missing_data_fails_closed() -> None:
    for current, pool in ((None, FULL), (sample(0, 0.1), None)):
        blind = decide(
            previous=None, current=current, pool=pool, kv=KV, hit_rate_min=0.8,
            last_compaction_at_s=None, shrink_request=400,
        )  # fmt: skip
        assert blind.action == "none"


def test_pool_state_reads_the_plugins_status_and_names_a_bad_field() -> None:
    status: dict[str, Any] = {
        "usable_blocks": 300, "original_blocks": 1000, "occupied_blocks": 120,
        "held_blocks": 120, "max_model_len": 512, "block_size": 32, "blocks_short": 0,
        "free_blocks": 179, "usage": 0.4, "refusal": None,
    }  # fmt: skip
    assert PoolState.from_status(status) == SHRUNK
    with pytest.raises(ValueError, match="plugin status: held_blocks is None, expected an"):
        PoolState.from_status({**status, "held_blocks": None})
    with pytest.raises(ValueError, match="blocks_short is True"):
        PoolState.from_status({**status, "blocks_short": True})


def test_a_status_the_sidecar_cannot_read_decides_nothing_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[str] = []

    def handle(op: str, args: dict[str, Any]) -> dict[str, Any]:
        asked.append(op)
        return {"usable_blocks": 300, "original_blocks": 1000, "occupied_blocks": 120}

    token = secrets.token_hex(8)
    server = ControlServer(tmp_path / "ctl" / "kv.sock", token, handle)
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(
        'vllm:kv_cache_usage_perc{engine="0"} 0.1\n'
        'vllm:prefix_cache_queries_total{engine="0"} 10\n'
        'vllm:prefix_cache_hits_total{engine="0"} 1\n'
    )
    sidecar = CompactionSidecar(
        load_policy(DEFAULT_POLICY), metrics.as_uri(), ControlClient(server.path, token)
    )
    try:
        with caplog.at_level(logging.ERROR):
            decision, reply = sidecar.poll()
    finally:
        server.close()
    assert (decision.action, reply, asked) == ("none", None, ["status"])
    assert "fail closed" in decision.reason
    assert "plugin status: held_blocks is None, expected an integer" in caplog.text
    assert sidecar.registry.get_sample_value("gpupool_kv_sidecar_errors_total") == 1.0


def test_cache_budget_default_and_invariant(tmp_path: Path) -> None:
    assert KV.shrink_prefix_cache_share == 0.10
    yaml = YAML(typ="rt")
    doc = yaml.load(DEFAULT_POLICY.read_text())
    set_path(doc, "kv_cache.shrink_prefix_cache_share", 0.6)
    source = tmp_path / "pool.yaml"
    with source.open("w") as fh:
        yaml.dump(doc, fh)
    with pytest.raises(PolicyError) as caught:
        load_policy(source)
    (problem,) = caught.value.problems
    assert problem.path == "kv_cache.shrink_prefix_cache_share"
    assert "(0.6) must be below shrink_target_usage (0.6)" in problem.message
    line = source.read_text().splitlines()[problem.line - 1]
    assert line.strip().startswith("shrink_prefix_cache_share:")


def test_parse_sample_sums_engines_and_needs_every_series() -> None:
    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 640.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 192.0\n'
    )
    assert parse_sample(text, 7.0) == InstanceSample(7.0, 0.25, 640.0, 192.0, None)
    assert parse_sample(text.split("# TYPE vllm:prefix_cache_hits")[0], 7.0) is None
    preemptions = (
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n'
        'vllm:num_preemptions_total{engine="1",model_name="m"} 4.0\n'
    )
    assert parse_sample(text + preemptions, 7.0) == InstanceSample(7.0, 0.25, 640.0, 192.0, 7.0)


def test_sidecar_spec_is_a_valid_container_in_a_flex_pod() -> None:
    policy = load_policy(DEFAULT_POLICY)
    if not policy.workloads:
        pytest.fail("the shipped policy declares no flex workload to attach the sidecar to")
    workload = policy.workloads[0]
    sidecar = compaction_sidecar(policy, workload)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": workload.name},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": workload.image,
                    "env": vllm_plugin_env(),
                    "volumeMounts": vllm_plugin_mounts(),
                },
                sidecar,
            ],
            "volumes": compaction_volumes(policy, workload),
        },
    }
    kubernetes_validate.validate(pod, "1.30.0", strict=True)
    assert sidecar["image"] == policy.cluster.runtime_image
    assert f"http://127.0.0.1:{workload.port}/metrics" in sidecar["args"]
    assert sidecar["ports"][0]["containerPort"] == policy.kv_cache.compaction_sidecar_port

"""The sidecar's pure decisions and metric parsing, and the sidecar's container spec."""

from __future__ import annotations

import kubernetes_validate
import pytest

from infra.builders.compaction_sidecar import (
    compaction_sidecar,
    compaction_volumes,
    vllm_plugin_env,
    vllm_plugin_mounts,
)
from policy import DEFAULT_POLICY, load_policy
from policy.kvcache import KvCache
from runtime.kvcache.sidecar.service import parse_sample
from runtime.kvcache.sidecar.triggers import (
    InstanceSample,
    PoolState,
    decide,
    hit_rate,
    shrink_target,
)

KV = KvCache()
FULL = PoolState(usable_blocks=1000, original_blocks=1000, occupied_blocks=120)
SHRUNK = PoolState(usable_blocks=300, original_blocks=1000, occupied_blocks=120)


def sample(at: float, usage: float, queries: float = 0, hits: float = 0) -> InstanceSample:
    return InstanceSample(at, usage, queries, hits)


def test_low_usage_shrinks_so_occupied_blocks_fill_the_target_share() -> None:
    decision = decide(
        previous=None, current=sample(0, 0.12), pool=FULL, kv=KV, hit_rate_min=0.8,
        last_compaction_at_s=None,
    )  # fmt: skip
    assert decision.action == "shrink"
    assert decision.num_blocks == shrink_target(120, KV.shrink_target_usage) == 201
    assert 120 / (decision.num_blocks - 1) <= KV.shrink_target_usage


def test_usage_at_threshold_and_min_interval_hold_compaction_back() -> None:
    busy = decide(
        previous=None, current=sample(0, KV.compaction_usage_below), pool=FULL, kv=KV,
        hit_rate_min=0.8, last_compaction_at_s=None,
    )  # fmt: skip
    assert busy.action == "none"
    recent = decide(
        previous=None, current=sample(299, 0.1), pool=FULL, kv=KV, hit_rate_min=0.8,
        last_compaction_at_s=0,
    )  # fmt: skip
    assert recent.action == "none" and "5m" in recent.reason
    due = decide(
        previous=None, current=sample(300, 0.1), pool=FULL, kv=KV, hit_rate_min=0.8,
        last_compaction_at_s=0,
    )  # fmt: skip
    assert due.action == "shrink"


def test_a_pool_already_small_is_compacted_not_shrunk() -> None:
    small = PoolState(usable_blocks=150, original_blocks=1000, occupied_blocks=120)
    decision = decide(
        previous=None, current=sample(0, 0.1), pool=small, kv=KV, hit_rate_min=0.8,
        last_compaction_at_s=None,
    )  # fmt: skip
    assert decision.action == "compact"


def test_low_hit_rate_on_a_shrunk_pool_grows_back_and_only_then() -> None:
    before, after = sample(0, 0.7, 1000, 900), sample(15, 0.7, 2000, 1500)
    assert hit_rate(before, after) == pytest.approx(0.6)
    grow = decide(
        previous=before, current=after, pool=SHRUNK, kv=KV, hit_rate_min=0.8,
        last_compaction_at_s=None,
    )  # fmt: skip
    assert (grow.action, grow.num_blocks) == ("grow", 1000)
    full = decide(
        previous=before, current=after, pool=FULL, kv=KV, hit_rate_min=0.8,
        last_compaction_at_s=None,
    )  # fmt: skip
    assert full.action == "none"
    assert hit_rate(after, before) is None  # counter reset: no rate, no decision from it


def test_explicit_shrink_wins_and_missing_data_fails_closed() -> None:
    asked = decide(
        previous=None, current=sample(0, 0.9), pool=FULL, kv=KV, hit_rate_min=0.8,
        last_compaction_at_s=None, shrink_request=400,
    )  # fmt: skip
    assert (asked.action, asked.num_blocks) == ("shrink", 400)
    for current, pool in ((None, FULL), (sample(0, 0.1), None)):
        blind = decide(
            previous=None, current=current, pool=pool, kv=KV, hit_rate_min=0.8,
            last_compaction_at_s=None, shrink_request=400,
        )  # fmt: skip
        assert blind.action == "none"


def test_parse_sample_sums_engines_and_needs_every_series() -> None:
    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 640.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 192.0\n'
    )
    assert parse_sample(text, 7.0) == InstanceSample(7.0, 0.25, 640.0, 192.0)
    assert parse_sample(text.split("# TYPE vllm:prefix_cache_hits")[0], 7.0) is None


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

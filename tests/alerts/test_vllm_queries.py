"""The catalogue's vLLM queries against a REAL vLLM server scraped by a real Prometheus."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from alerts.kv_cache import warming_up
from policy import PoolPolicy, parse_policy
from runtime.metrics.catalogue import (
    KV_CACHE_HIT_RATE,
    KV_CACHE_USAGE,
    PROMPT_TOKENS_FROM_TIER,
    VLLM_PREEMPTIONS,
    VLLM_QUEUE_DEPTH,
    VLLM_START_TIME,
    build_catalogue,
)
from tests.alerts.conftest import fast_policy
from tests.alerts.test_e2e import query
from tests.harness.servers import TINY_MODEL, Server, start_prometheus

WINDOW_S = 30
PREFIX_TOKENS = 64
"""Two full 32-token blocks: what a repeated prompt can hit in the prefix cache."""
BY_SOURCE = "vllm:prompt_tokens_by_source"
INSTANCE = {"namespace": "gpupool-flex", "workload": "tiny", "pod": "vllm-0"}
"""The scrape target's labels: one vLLM instance."""


@pytest.fixture(scope="module")
def policy() -> PoolPolicy:
    return fast_policy("http://127.0.0.1:9", rate_window=f"{WINDOW_S}s")


@pytest.fixture(scope="module")
def prometheus(vllm_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    target = vllm_server.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "vllm",
                "static_configs": [
                    {
                        "targets": [target],
                        "labels": {
                            "namespace": "gpupool-flex",
                            "workload": "tiny",
                            "pod": "vllm-0",
                        },
                    }
                ],
            }
        ],
    }
    server = start_prometheus(json.dumps(config), tmp_path_factory.mktemp("prom-vllm"))
    yield server
    server.stop()


def _families(vllm: Server) -> list[Metric]:
    with urllib.request.urlopen(vllm.url + "/metrics", timeout=10) as response:
        return list(text_string_to_metric_families(response.read().decode()))


def _counters(vllm: Server) -> tuple[float, float, float, float]:
    """(prefix-cache hits, queries, prompt tokens, of them from the local prefix cache), each
    summed over engines, read from vLLM's own /metrics."""
    totals = dict.fromkeys(
        ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", "vllm:prompt_tokens", "local"),
        0.0,
    )
    for family in _families(vllm):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name in totals:
                totals[family.name] += sample.value
            elif (family.name, sample.labels.get("source")) == (BY_SOURCE, "local_cache_hit"):
                totals["local"] += sample.value
    hits, queries, prompt, local = totals.values()
    return hits, queries, prompt, local


def _stable_counters(vllm: Server) -> tuple[float, float, float, float]:
    """Counters once two reads a second apart agree (vLLM updates them after responding)."""
    previous = _counters(vllm)
    for _ in range(30):
        time.sleep(1)
        current = _counters(vllm)
        if current == previous:
            return current
        previous = current
    raise AssertionError(f"vLLM prefix-cache counters never settled: {previous}")


def _complete(vllm: Server, prompt: list[int]) -> None:
    body = json.dumps({"model": str(TINY_MODEL), "prompt": prompt, "max_tokens": 1}).encode()
    request = urllib.request.Request(
        vllm.url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def _prefix(seed: int) -> list[int]:
    return [(seed * 37 + i * 11) % 500 + 3 for i in range(PREFIX_TOKENS)]


def _wait_scraped(prometheus: Server, metric: str, value: float) -> None:
    for _ in range(60):
        result = query(prometheus, f"sum({metric})")
        if result and float(result[0]["value"][1]) == value:
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never scraped {metric} = {value}:\n{prometheus.log_tail()}")


@pytest.mark.slow
def test_hit_rate_query_matches_vllms_own_counters(
    vllm_server: Server, prometheus: Server, policy: PoolPolicy
) -> None:
    catalogue = build_catalogue(policy)
    queries_metric = "vllm:prefix_cache_queries_total"
    # Warm up so both counters are non-zero: rate() then extrapolates both alike.
    for _ in range(3):
        _complete(vllm_server, [*_prefix(99), 7])
    warm = _stable_counters(vllm_server)
    warmed_at = time.time()
    _wait_scraped(prometheus, queries_metric, warm[1])
    time.sleep(2)
    h0, q0, p0, l0 = _counters(vllm_server)
    started = time.time()
    for seed in range(3):  # each prefix once (misses), then again with new tails (hits)
        for tail in range(4):
            _complete(vllm_server, [*_prefix(seed), 100 + tail, 200 + seed])
    h1, q1, p1, l1 = _stable_counters(vllm_server)
    ended = time.time()
    assert q1 > q0 and h1 > h0, "the repeated prefixes produced no prefix-cache hits"
    expected = (h1 - h0) / (q1 - q0)
    _wait_scraped(prometheus, queries_metric, q1)
    # Evaluate where the window holds a pre-traffic sample and the settled post-traffic one,
    # and none from the warm-up.
    at = max(ended + 2.5, warmed_at + WINDOW_S + 1)
    assert at - WINDOW_S < started, "traffic took longer than the window; raise WINDOW_S"
    time.sleep(max(0.0, at - time.time() + 1.5))
    result = query(prometheus, catalogue.query(KV_CACHE_HIT_RATE), at=at)
    assert len(result) == 1, result
    assert result[0]["metric"] == INSTANCE
    hit_rate = float(result[0]["value"][1])
    assert 0 < hit_rate < 1
    assert hit_rate == pytest.approx(expected, rel=1e-9)

    usage = query(prometheus, catalogue.query(KV_CACHE_USAGE), at=at)
    assert len(usage) == 1 and 0 <= float(usage[0]["value"][1]) <= 1
    assert float(query(prometheus, catalogue.query(VLLM_QUEUE_DEPTH), at=at)[0]["value"][1]) == 0
    assert float(query(prometheus, catalogue.query(VLLM_PREEMPTIONS), at=at)[0]["value"][1]) == 0

    # The share of prefill tokens from the offloading connector's tiers: 0 on this server
    # (no connector), but present, since it had prompt tokens. The same query on the local
    # prefix-cache source must equal vLLM's own counters, so the ratio itself is right.
    from_tier = catalogue.query(PROMPT_TOKENS_FROM_TIER)
    share = query(prometheus, from_tier, at=at)
    assert [r["metric"] for r in share] == [INSTANCE]
    assert float(share[0]["value"][1]) == 0
    local = from_tier.replace('"external_kv_transfer"', '"local_cache_hit"')
    assert local != from_tier
    assert l1 > l0 and p1 > p0
    local_share = query(prometheus, local, at=at)
    assert float(local_share[0]["value"][1]) == pytest.approx((l1 - l0) / (p1 - p0), rel=1e-9)


def _with_warmup(policy: PoolPolicy, warmup: str) -> PoolPolicy:
    document = policy.model_dump(by_alias=True, mode="json")
    document["alerting"]["thresholds"]["kv_hit_rate"]["warmup"] = warmup
    return parse_policy(document)


@pytest.mark.slow
def test_warmup_reads_the_real_servers_process_start(
    vllm_server: Server, prometheus: Server, policy: PoolPolicy
) -> None:
    """vLLM's API server (one process, the default) exports prometheus_client's process
    collector: the start time the KV hit-rate alert's warm-up counts from."""
    (started,) = [
        s.value
        for f in _families(vllm_server)
        if f.name == "process_start_time_seconds"
        for s in f.samples
    ]
    catalogue = build_catalogue(policy)
    _wait_scraped(prometheus, "process_start_time_seconds", started)
    time.sleep(max(0.0, started + 3 - time.time()))  # so a shorter warm-up is >= 1 s
    at = float(int(time.time()))
    start_time = query(prometheus, catalogue.query(VLLM_START_TIME), at=at)
    assert [(r["metric"], float(r["value"][1])) for r in start_time] == [(INSTANCE, started)]

    # Evaluated at a fixed time, the instance's age is at - started: a warm-up longer than
    # that keeps it warming up (value: its age), one shorter does not.
    age = at - started
    longer = _with_warmup(policy, f"{int(age) + 60}s")
    shorter = _with_warmup(policy, f"{int(age) - 1}s")
    started_expr = catalogue.query(VLLM_START_TIME)
    warming = query(prometheus, warming_up(longer, started_expr), at=at)
    assert [r["metric"] for r in warming] == [INSTANCE]
    assert float(warming[0]["value"][1]) == pytest.approx(age, rel=1e-9)
    assert query(prometheus, warming_up(shorter, started_expr), at=at) == []

    # The alert's join: an instance series of the catalogue (the same labels as the hit rate)
    # is dropped while its instance warms up, kept once it has.
    by = ", ".join(policy.metrics.instance_labels)
    usage = catalogue.query(KV_CACHE_USAGE)
    for warmup, kept in ((longer, []), (shorter, [INSTANCE])):
        suppressed = f"({usage}) unless on ({by}) ({warming_up(warmup, started_expr)})"
        assert [r["metric"] for r in query(prometheus, suppressed, at=at)] == kept

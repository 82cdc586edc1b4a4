"""What the KV snapshot tier buys: first-minute hit rates after evictions, with and without."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np
import pytest

from policy import PoolPolicy, load_policy, parse_policy
from runtime.sim import fleet_pools
from runtime.sim.engine import replay_pooled
from runtime.sim.markdown import rows, tier_lines
from runtime.sim.replay_model import FlexInput, Layout, Replay, Settings
from runtime.sim.report import Summary, summarize
from runtime.sim.request_stream import Requests
from runtime.sim.serving import Array, Fleet
from runtime.sim.traces import ProductionTrace, prefix_reuse
from tests.sim.test_engine import DUTY, Latencies, _ramp, _run, _stream, _without_production

BLOCK = 512
PREFIX = 2 * BLOCK
PROMPT = 4 * BLOCK
EVICTED_AT = 1800.0
SURVIVAL = math.exp(-2 / 8)
"""Share of a prefix cached before the eviction that survives it without the tier: two of
the eight replicas go (``runtime.sim.serving``: e^-share)."""


def _policy(mode: str) -> PoolPolicy:
    """gpu-prod and gpu-flex one 8-GPU node each; eight one-GPU flex replicas fill gpu-flex."""
    document = _without_production(load_policy())
    document["node_pools"][0]["max_nodes"] = 1
    document["node_pools"][1]["max_nodes"] = 1
    document["workloads"][0].update(min_replicas=8, max_replicas=8, kv_compaction=False)
    document["kv_cache"]["kv_preservation"] = mode
    return parse_policy(document)


def _production(burst: bool) -> ProductionTrace:
    """One production pod, then (with ``burst``) ceil(5.9 / 0.6) = 10 from minute 30: two
    beyond gpu-prod, so the scheduler preempts two running flex replicas at 1800 s."""
    busy = np.full(60, 0.5)
    if burst:
        busy[30:] = 5.9
    return ProductionTrace("burst", 0.0, 60.0, np.full(60, 10, dtype=np.int64), busy)


# (arrival s, conversation): 4-block prompts whose first 2 blocks are the conversation's.
# A step serves what arrived by its end, so 1800 is served before the eviction and the
# minute's four steps (1800-1845) serve the arrivals after 1800 up to 1860.
SCHEDULE = [
    (1700, "a"), (1700, "b"), (1700, "c"), (1700, "d"), (1790, "a"), (1800, "e"),  # before
    (1805, "a"), (1810, "b"), (1820, "a"), (1830, "e"), (1840, "f"), (1850, "c"),  # minute
    (1870, "c"), (1900, "d"),  # after it
]  # fmt: skip


def _requests() -> Requests:
    arrival = np.array([t for t, _ in SCHEDULE], dtype=np.float64)
    tokens = np.full(arrival.size, PROMPT, dtype=np.int64)
    prefixes = {c: [10 * i, 10 * i + 1] for i, c in enumerate("abcdef", start=1)}
    hashes = [[*prefixes[c], 1000 + 2 * i, 1001 + 2 * i] for i, (_, c) in enumerate(SCHEDULE)]
    blocks, seen = prefix_reuse(arrival, tokens, hashes, BLOCK)
    n = arrival.size
    return Requests(
        arrival, tokens, np.full(n, 16, dtype=np.int64), blocks * BLOCK, seen, np.ones(n, bool)
    )


def _tier(
    mode: str, *, burst: bool = True, requests: Requests | None = None
) -> tuple[Replay, Summary]:
    """45 minutes of the constructed cluster; KV for 10^9 tokens, so nothing ages out."""
    policy = _policy(mode)
    flex = [FlexInput(policy.workloads[0], requests or _requests(), 10**9, Latencies())]
    settings = Settings(hours=0.75, flex_startup_s=60, production=DUTY)
    replay = replay_pooled(
        policy,
        Layout.of_policy(policy),
        _production(burst),
        flex,
        settings,
    )
    return replay, summarize(replay, policy)


@pytest.mark.parametrize("mode", ["off", "filesystem"])
def test_first_minute_hit_rates_after_an_eviction_by_hand(mode: str) -> None:
    """Served in the eviction's minute: a (last seen 1790), b (1700), a (1805, after the
    eviction), e (1800, the eviction's own time: still cached then), f (new), c (1700).
    With the tier the five shared prefixes hit; without it the four seen before the
    eviction keep e^-(2/8) of their blocks. c at 1870 (seen 1850) and d at 1900 (seen
    1700) are after the minute; d counts in the run's saved prefill."""
    replay, summary = _tier(mode)
    s, tier = replay.series, summary.kv_tier
    assert [t for t, n in zip(s.t, s.evictions, strict=True) if n] == [EVICTED_AT]
    assert tier.evicted_replicas == 2
    assert tier.first_minute_query_tokens == 2 * 6 * PROMPT  # each eviction counts its minute
    assert tier.first_minute_hit_rate_with_tier == pytest.approx(5 * PREFIX / (6 * PROMPT))
    assert tier.first_minute_hit_rate_without_tier == pytest.approx(
        (4 * PREFIX * SURVIVAL + PREFIX) / (6 * PROMPT)
    )
    assert tier.prefill_tokens_saved == pytest.approx(5 * PREFIX * (1 - SURVIVAL))
    assert tier.note is None
    assert (tier.kv_preservation, tier.served_with_tier) == (mode, mode == "filesystem")
    (totals,) = replay.fleets.values()
    served = 8 * PREFIX if mode == "filesystem" else 3 * PREFIX + 5 * PREFIX * SURVIVAL
    assert totals.hit_tokens == pytest.approx(served)


def test_the_report_states_the_mode_and_both_rates() -> None:
    _, summary = _tier("off")
    lines = tier_lines(summary)
    assert "`kv_cache.kv_preservation: off`" in lines[0] and "without the tier" in lines[0]
    assert "41.7% with the snapshot tier, 34.3% without" in lines[1]
    assert "evicted running flex replicas: 2; prompt tokens queried" in lines[1]
    assert lines[2].endswith(": 1,133")
    table = {name: pooled for name, pooled, _ in rows(summary, summary)}
    assert table["KV hit rate, 1st minute after an eviction, with / without the snapshot tier"] == (
        "41.7% / 34.3%"
    )
    assert asdict(summary)["kv_tier"]["first_minute_hit_rate_with_tier"] == pytest.approx(5 / 12)


def test_without_evictions_or_block_hashes_the_report_says_so() -> None:
    _, calm = _tier("off", burst=False)
    tier = calm.kv_tier
    assert tier.evicted_replicas == 0 and tier.note == "no running flex replica evicted"
    assert tier.first_minute_hit_rate_with_tier is None is tier.first_minute_hit_rate_without_tier
    assert tier.prefill_tokens_saved == 0.0
    first = tier_lines(calm)[1]
    assert first.endswith("n/a: no running flex replica evicted") and "%" not in first

    unhashed = replace(_requests(), hashed=np.zeros(len(SCHEDULE), dtype=bool))
    unhashed = replace(unhashed, prefix_tokens=np.zeros(len(SCHEDULE), dtype=np.int64))
    _, blind = _tier("off", requests=unhashed)
    assert blind.kv_tier.note == "no served request has block hashes"
    assert blind.kv_tier.prefill_tokens_saved is None
    assert [line.split(": ")[-1] for line in tier_lines(blind)[1:3]] == [
        "no served request has block hashes",
        "n/a",
    ]


def test_prefix_reuse_the_tier_cannot_keep_is_not_a_zero_rate() -> None:
    """Evictions but no shared prefix served in their minutes: no rate, a reason."""
    fresh = replace(_requests(), prefix_tokens=np.zeros(len(SCHEDULE), dtype=np.int64))
    _, summary = _tier("off", requests=fresh)
    assert summary.kv_tier.note == "no prefix reuse after evictions"
    assert summary.kv_tier.first_minute_hit_rate_with_tier is None


class _ServedOnly(Fleet):
    """A fleet without the counterfactual: both tallies are the hits it serves with."""

    def _hits(self, idx: np.ndarray, now: float) -> tuple[Array, Array]:
        kept, survived = super()._hits(idx, now)
        served = kept if self.preservation else survived
        return served, served


def _conversations(hours: float, seed: int) -> Requests:
    """A request every 2 s, each opening with one of 400 conversations' 3-block prefixes
    (a conversation comes back every 800 s on average, about the cache's retention)."""
    rng = np.random.default_rng(seed)
    n = int(hours * 1800)
    arrival = np.arange(n) * 2.0
    tokens = rng.integers(4, 9, n) * BLOCK
    talk = rng.integers(0, 400, n)
    hashes = [
        [3 * c, 3 * c + 1, 3 * c + 2, *range(10**6 + 16 * i, 10**6 + 16 * i + 8)]
        for i, c in enumerate(talk.tolist())
    ]
    blocks, seen = prefix_reuse(arrival, tokens, hashes, BLOCK)
    return Requests(
        arrival, tokens, rng.integers(10, 200, n), blocks * BLOCK, seen, np.ones(n, bool)
    )


@pytest.mark.parametrize("mode", ["off", "filesystem"])
def test_the_counterfactual_leaves_the_replay_unchanged(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Production waves preempt flex on every crest and the HPA sheds it in between: the
    replay with the with/without tally serves exactly what one without it serves."""
    t = np.arange(240)
    phase = t % 60
    held = (20 + np.where(phase < 30, 2 * phase, 60 - 2 * (phase - 30))).astype(np.int64)
    trace = ProductionTrace("waves", 0.0, 60.0, held, held * 0.6)
    document = _without_production(load_policy())
    document["workloads"][0].update(max_replicas=32, kv_compaction=False)
    document["kv_cache"]["kv_preservation"] = mode
    for pool in document["node_pools"]:
        pool["reserve_ratio"] = 0.0
    policy = parse_policy(document)
    flex = [FlexInput(policy.workloads[0], _conversations(4, seed=3), 20_000, Latencies())]
    settings = Settings(hours=4, flex_startup_s=60, production=DUTY)

    def run() -> Replay:
        layout = Layout.of_policy(policy)
        return replay_pooled(policy, layout, trace, flex, settings)

    counted = run()
    monkeypatch.setattr(fleet_pools, "Fleet", _ServedOnly)
    plain = run()
    assert counted.series == plain.series
    a, b = summarize(counted, policy), summarize(plain, policy)
    assert replace(a, kv_tier=b.kv_tier) == b
    new = {"hit_tokens_with_tier", "hit_tokens_without_tier", "after_evictions"}
    for x, y in zip(counted.fleets.values(), plain.fleets.values(), strict=True):
        assert {k: v for k, v in asdict(x).items() if k not in new} == {
            k: v for k, v in asdict(y).items() if k not in new
        }
    # The tally was live: evictions cost prefix hits without the tier, in their minutes too.
    assert a.evictions_total > 10
    assert a.kv_tier.prefill_tokens_saved is not None and a.kv_tier.prefill_tokens_saved > 0
    assert b.kv_tier.prefill_tokens_saved == 0
    first = a.kv_tier
    assert first.first_minute_hit_rate_with_tier is not None
    assert first.first_minute_hit_rate_without_tier is not None
    assert first.first_minute_hit_rate_with_tier > first.first_minute_hit_rate_without_tier


def test_a_scale_down_is_one_replica_exit_and_no_eviction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Production rising past the reserve sheds flex by scale-down, never by preemption:
    each replica that goes drops its cache share once, and none counts as evicted."""
    exits: list[int] = []
    lose = Fleet.lose_replicas

    def spy(self: Fleet, lost: int, before: int, now: float) -> float:
        exits.append(lost)
        return lose(self, lost, before, now)

    monkeypatch.setattr(Fleet, "lose_replicas", spy)
    document = _without_production(load_policy())
    document["workloads"][0]["max_replicas"] = 32
    policy = parse_policy(document)
    pooled, _ = _run(policy, _ramp(10, 50, per_minute=0.5), _stream(5_000, backlog=True))
    running = np.asarray(pooled.series.flex_running_gpus)
    assert sum(pooled.series.evictions) == 0
    assert sum(exits) == int(np.clip(running[:-1] - running[1:], 0, None).sum()) > 0
    (totals,) = pooled.fleets.values()
    assert totals.after_evictions.evicted_replicas == 0

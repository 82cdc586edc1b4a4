"""What the snapshot GC deletes, decided from one scan (pure)."""

from __future__ import annotations

from runtime.kvcache.preservation.retention import LOW_WATERMARK, TierFile, plan
from runtime.kvcache.preservation.volume import kind_of

NOW = 10_000.0
KIB = 1024


def block(name: str, mtime: float, tier: str = "new", size: int = 100 * KIB) -> TierFile:
    return TierFile(f"/v/{tier}/{name}.bin", tier, "block", size, mtime)


def test_vllm_file_names_are_classified() -> None:
    assert kind_of("ab12.bin") == "block"
    assert kind_of("ab12.bin_4093982374.tmp") == "partial"
    assert kind_of("config.json") == "other"
    assert kind_of("ab12.bin.tmp") == "other"  # not vLLM's suffix: never taken for a partial


def test_under_capacity_nothing_goes() -> None:
    files = [block(f"b{i}", NOW - i) for i in range(5)]
    decided = plan(files, {"new": NOW}, now=NOW, capacity_bytes=500 * KIB, reclaim_after_s=60)
    assert decided.deletions == () and decided.kept_bytes == 500 * KIB


def test_over_capacity_the_least_recently_used_go_down_to_the_watermark() -> None:
    files = [block(f"b{i}", NOW - 10 * i) for i in range(10)]  # b9 is the oldest
    capacity = 800 * KIB
    decided = plan(files, {"new": NOW}, now=NOW, capacity_bytes=capacity, reclaim_after_s=60)
    gone = [d.path.rsplit("/", 1)[1] for d in decided.deletions]
    assert gone == ["b9.bin", "b8.bin", "b7.bin"]  # 1000 KiB -> 700 KiB <= 0.9 x 800 KiB
    assert {d.reason for d in decided.deletions} == {"capacity"}
    assert decided.kept_bytes <= LOW_WATERMARK * capacity
    assert [d.age_s for d in decided.deletions] == [90.0, 80.0, 70.0]


def test_a_young_partial_write_is_never_deleted_an_old_one_is() -> None:
    young = TierFile("/v/new/x.bin_1.tmp", "new", "partial", 900 * KIB, NOW - 5)
    old = TierFile("/v/new/y.bin_2.tmp", "new", "partial", 10 * KIB, NOW - 120)
    decided = plan(
        [young, old, block("b", NOW)],
        {"new": NOW},
        now=NOW,
        capacity_bytes=100 * KIB,
        reclaim_after_s=60,
    )
    reasons = {d.path: d.reason for d in decided.deletions}
    assert young.path not in reasons  # vLLM is writing it, capacity or not
    assert reasons[old.path] == "abandoned_write"
    assert reasons["/v/new/b.bin"] == "capacity"


def test_a_stale_tree_is_reclaimed_only_while_another_is_live() -> None:
    old = [block(f"o{i}", NOW - 3600, tier="old") for i in range(3)]
    alone = plan(old, {"old": NOW - 3600}, now=NOW, capacity_bytes=10**9, reclaim_after_s=60)
    assert alone.deletions == ()  # every replica gone: keep the cache the next one restores
    both = plan(
        [*old, block("n", NOW)],
        {"old": NOW - 3600, "new": NOW - 30},
        now=NOW,
        capacity_bytes=10**9,
        reclaim_after_s=60,
    )
    assert {d.path for d in both.deletions} == {f.path for f in old}
    assert {d.reason for d in both.deletions} == {"reclaimed"}
    assert both.reclaimed_tiers == {"old"} and both.live_tiers == {"new"}


def test_capacity_never_deletes_identity_or_config_files() -> None:
    other = TierFile("/v/new/gpupool-tier.json", "new", "other", 300 * KIB, NOW - 9999)
    decided = plan(
        [other, block("b", NOW)],
        {"new": NOW},
        now=NOW,
        capacity_bytes=100 * KIB,
        reclaim_after_s=60,
    )
    assert [d.path for d in decided.deletions] == ["/v/new/b.bin"]

"""gpupool's snapshot tier and GC against vLLM 0.32's REAL filesystem tier and file layout.

The tier is built by vLLM's own SecondaryTierFactory from the entry gpupool emits, and every
file here is written by vLLM's own store code (``tests/harness/offload_tier.py``)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from vllm.v1.kv_offload.base import LookupResult, OffloadKey
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.kv_offload.tiering.fs import manager as fs_manager

from runtime.kvcache.preservation.gc import GcSettings, SnapshotGc
from runtime.kvcache.preservation.identity import IDENTITY_FILE, TIER_DIR_PREFIX
from runtime.kvcache.preservation.status import read_status, replicas_dir
from runtime.kvcache.preservation.tier import SnapshotTier
from runtime.kvcache.preservation.volume import scan
from tests.harness.offload_tier import (
    BLOCK_BYTES,
    block_files,
    build_tier,
    finished,
    key,
    load,
    primary_view,
    request,
    store,
)

pytestmark = pytest.mark.vllm

IDENTITY = {"model": "tiny/model", "hash_algo": "sha256", "attention_backend": "cpu"}


def snapshot_config(root: Path, **extra: Any) -> dict[str, Any]:
    """The ``secondary_tiers`` entry, as runtime.vllm emits it (plus test thread counts)."""
    return {
        "type": "SnapshotTier",
        "module_path": "runtime.kvcache.preservation.tier",
        "root_dir": str(root),
        "identity": IDENTITY,
        "flush_budget_s": 5.0,
        "heartbeat_s": 0.05,
        "n_read_threads": 2,
        "n_write_threads": 2,
    } | extra


@pytest.fixture
def tiers() -> Iterator[list[SecondaryTierManager]]:
    """Tiers a test built; shut down at the end if the test did not."""
    made: list[SecondaryTierManager] = []
    yield made
    for tier in made:
        if not getattr(tier, "_stopping", threading.Event()).is_set():
            tier.shutdown()


def make(tiers: list[SecondaryTierManager], config: dict[str, Any], chunks: int = 64, **spec: Any):
    buffer = primary_view(chunks)
    tier = build_tier(config, buffer, **spec)
    tiers.append(tier)
    return tier, buffer


def fill(buffer: np.ndarray, chunk: int, n: int) -> None:
    """Chunk ``chunk`` holds bytes derived from block ``n`` (so a load can be checked)."""
    buffer[chunk] = np.frombuffer(np.random.default_rng(n).bytes(BLOCK_BYTES), dtype=np.uint8)


def stored(tier: SecondaryTierManager, buffer: np.ndarray, blocks: range) -> None:
    """Write ``blocks`` one after the other through chunk 0, each with its own bytes."""
    for n in blocks:
        fill(buffer, 0, n)
        finished(tier, {store(tier, [key(n)], [0])})


def lookup(tier: SecondaryTierManager, k: OffloadKey) -> LookupResult:
    """A lookup as the scheduler makes it: ask every step until the async probe answers
    (each step ends with ``on_schedule_end``, which submits and drains the probes)."""
    ctx = request()
    deadline = time.monotonic() + 10
    while (result := tier.lookup(k, ctx)) is LookupResult.RETRY:
        assert time.monotonic() < deadline, "the lookup never resolved"
        tier.on_schedule_end(None)  # type: ignore[arg-type]
        time.sleep(0.005)
    tier.on_request_finished(ctx)
    return result


def test_a_restarted_tier_finds_the_blocks_a_stopped_one_wrote(
    tmp_path: Path, tiers: list[SecondaryTierManager]
) -> None:
    first, buffer = make(tiers, snapshot_config(tmp_path))
    stored(first, buffer, range(8))
    first.shutdown()

    second, buffer = make(tiers, snapshot_config(tmp_path))
    assert isinstance(second, SnapshotTier) and isinstance(first, SnapshotTier)
    assert second.tier_root == first.tier_root
    assert lookup(second, key(3)) is LookupResult.HIT
    assert lookup(second, key(99)) is LookupResult.MISS
    finished(second, {load(second, [key(3)], [5])})
    expected = np.frombuffer(np.random.default_rng(3).bytes(BLOCK_BYTES), dtype=np.uint8)
    assert np.array_equal(buffer[5], expected)
    second.shutdown()
    record = read_status(second._status_file)
    assert record is not None
    assert (record.hits, record.restored_hits, record.restored_hits_first_minute) == (1, 1, 1)
    assert record.lookups == 2 and record.first_hit_s is not None


def test_own_blocks_are_hits_but_not_restored(
    tmp_path: Path, tiers: list[SecondaryTierManager]
) -> None:
    tier, buffer = make(tiers, snapshot_config(tmp_path))
    stored(tier, buffer, range(2))
    assert lookup(tier, key(1)) is LookupResult.HIT
    tier.shutdown()
    record = read_status(tier._status_file)  # type: ignore[attr-defined]
    assert record is not None and (record.hits, record.restored_hits) == (1, 0)
    assert record.stored_blocks == 2


@pytest.mark.parametrize(
    ("change", "spec"),
    [
        ({"identity": IDENTITY | {"revision": "abc123"}}, {}),
        ({"identity": IDENTITY | {"hash_algo": "sha256_cbor"}}, {}),
        ({}, {"dtype": "fp8_e4m3"}),
        ({}, {"tokens_per_block": 32}),
        ({}, {"tp_size": 2}),
    ],
    ids=["revision", "hash-algo", "kv-dtype", "block-size", "tp"],
)
def test_an_incompatible_engine_never_reads_the_tree(
    tmp_path: Path, tiers: list[SecondaryTierManager], change: dict[str, Any], spec: dict[str, Any]
) -> None:
    first, buffer = make(tiers, snapshot_config(tmp_path))
    stored(first, buffer, range(4))
    first.shutdown()
    other, _ = make(tiers, snapshot_config(tmp_path, **change), **spec)
    assert other.tier_root != first.tier_root  # type: ignore[attr-defined]
    assert lookup(other, key(1)) is LookupResult.MISS


def test_the_engine_identity_names_the_vllm_version(
    tmp_path: Path, tiers: list[SecondaryTierManager]
) -> None:
    import vllm

    tier, _ = make(tiers, snapshot_config(tmp_path))
    identity = json.loads((Path(tier.tier_root) / IDENTITY_FILE).read_text())  # type: ignore[attr-defined]
    assert identity["engine"]["vllm"] == vllm.__version__
    assert identity["policy"] == IDENTITY
    assert os.path.basename(tier.tier_root).startswith(TIER_DIR_PREFIX)  # type: ignore[attr-defined]


def test_a_block_deleted_under_the_reader_is_a_miss_not_an_error(
    tmp_path: Path, tiers: list[SecondaryTierManager]
) -> None:
    tier, buffer = make(tiers, snapshot_config(tmp_path))
    stored(tier, buffer, range(3))
    assert lookup(tier, key(2)) is LookupResult.HIT
    for path in block_files(str(tmp_path)):
        os.unlink(path)  # the GC, between the lookup and the load
    job = load(tier, [key(2)], [4])
    result = finished(tier, {job})[job]
    assert not result.success
    assert lookup(tier, key(2)) is not LookupResult.HIT  # vLLM marked it a miss: recomputed
    tier.shutdown()
    record = read_status(tier._status_file)  # type: ignore[attr-defined]
    assert record is not None and record.load_failures == 1


class _StalledDisk:
    """vLLM's block writer, held until released: a slow PVC at SIGTERM."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        real = fs_manager.batch_store_block

        def held(*args: Any, **kwargs: Any) -> None:
            self.release.wait(timeout=30)
            real(*args, **kwargs)

        monkeypatch.setattr(fs_manager, "batch_store_block", held)


def test_the_flush_waits_for_writes_within_the_budget(
    tmp_path: Path, tiers: list[SecondaryTierManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _StalledDisk(monkeypatch)
    tier, _ = make(tiers, snapshot_config(tmp_path, flush_budget_s=20.0, n_write_threads=1))
    for n in range(6):
        store(tier, [key(n)], [n])
    threading.Timer(0.3, disk.release.set).start()
    tier.shutdown()
    record = read_status(tier._status_file)  # type: ignore[attr-defined]
    assert record is not None and record.flush is not None
    flush = record.flush
    assert (flush.in_flight_blocks, flush.written_blocks, flush.dropped_blocks) == (6, 6, 0)
    assert len(block_files(str(tmp_path))) == 6


def test_the_flush_drops_what_the_budget_cannot_cover_and_says_so(
    tmp_path: Path,
    tiers: list[SecondaryTierManager],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    disk = _StalledDisk(monkeypatch)
    tier, _ = make(
        tiers,
        snapshot_config(tmp_path, flush_budget_s=0.2, n_write_threads=1, n_read_threads=0),
    )
    for n in range(6):
        store(tier, [key(n)], [n])
    threading.Timer(0.5, disk.release.set).start()  # after the budget: one write was running
    with caplog.at_level("INFO", logger="vllm.gpupool.snapshot_tier"):
        tier.shutdown()
    record = read_status(tier._status_file)  # type: ignore[attr-defined]
    assert record is not None and record.flush is not None
    flush = record.flush
    assert flush.in_flight_blocks == 6
    assert flush.written_blocks == 1 and flush.dropped_blocks == 5
    assert flush.written_blocks + flush.failed_blocks + flush.dropped_blocks == 6
    assert len(block_files(str(tmp_path))) == 1
    assert "6 blocks in flight, 1 written, 0 failed, 5 dropped" in caplog.text


def test_gc_keeps_the_tier_within_capacity_under_concurrent_writers(
    tmp_path: Path, tiers: list[SecondaryTierManager]
) -> None:
    """Two writers (two replicas on one volume) store while the GC deletes: no write fails
    (a partial file is never deleted), the volume stays bounded, and every block that is
    left reads back with its own bytes."""
    capacity = 40 * BLOCK_BYTES
    writers = [make(tiers, snapshot_config(tmp_path)) for _ in range(2)]
    gc = SnapshotGc(tmp_path, "pod-a", CollectorRegistry())
    settings = GcSettings(capacity_bytes=capacity, reclaim_after_s=600, interval_s=0)
    stop = threading.Event()

    def write(tier: SecondaryTierManager, buffer: np.ndarray, n: int) -> None:
        while not stop.is_set():
            stored(tier, buffer, range(n, n + 1))
            n += 2

    threads = [
        threading.Thread(target=write, args=(tier, buffer, i))
        for i, (tier, buffer) in enumerate(writers)
    ]
    for t in threads:
        t.start()
    deleted = 0
    try:
        for _ in range(40):
            _, applied = gc.run_once(settings)
            deleted += applied.deleted_files.get("capacity", 0)
            assert not applied.errors
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert deleted > 0, "the writers never filled the tier: the test proves nothing"
    gc.run_once(settings)
    assert sum(f.size for f in scan(tmp_path).files) <= capacity
    for tier, _ in writers:
        tier.shutdown()
        record = read_status(tier._status_file)  # type: ignore[attr-defined]
        assert record is not None and record.store_failures == 0
    reader, buffer = make(tiers, snapshot_config(tmp_path))
    left = [f for f in scan(tmp_path).files if f.kind == "block"]
    assert left
    for f in left[:10]:
        n = next(n for n in range(100_000) if Path(f.path).name.startswith(key(n)[:-4].hex()))
        finished(reader, {load(reader, [key(n)], [1])})
        expected = np.frombuffer(np.random.default_rng(n).bytes(BLOCK_BYTES), dtype=np.uint8)
        assert np.array_equal(buffer[1], expected)


def test_gc_reclaims_an_old_layout_only_once_a_new_tier_is_live(
    tmp_path: Path, tiers: list[SecondaryTierManager]
) -> None:
    """vLLM's tree directly under the volume (before gpupool keyed it) survives while no
    replica is live, and is reclaimed whole once a keyed tier is."""
    old, buffer = make(tiers, {"type": "fs", "root_dir": str(tmp_path)})
    stored(old, buffer, range(5))
    old.shutdown()
    hour_ago = time.time() - 3600
    for dirpath, _, files in os.walk(tmp_path):
        for name in files:
            os.utime(os.path.join(dirpath, name), (hour_ago, hour_ago))
    gc = SnapshotGc(tmp_path, "pod-a", CollectorRegistry())
    settings = GcSettings(capacity_bytes=1 << 30, reclaim_after_s=60, interval_s=0)

    decided, _ = gc.run_once(settings)
    assert not decided.deletions, "no tier is live: the next replica may restore from it"
    assert len(block_files(str(tmp_path))) == 5

    new, _ = make(tiers, snapshot_config(tmp_path))
    decided, applied = gc.run_once(settings)
    assert applied.deleted_files == {"reclaimed": 5 + 1}  # the blocks and vLLM's config.json
    assert sorted(os.listdir(tmp_path)) == sorted(
        [".gpupool", os.path.basename(new.tier_root)]  # type: ignore[attr-defined]
    )


def test_gc_exports_its_work_and_the_tiers_restore(
    tmp_path: Path, tiers: list[SecondaryTierManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "pod-a")
    first, buffer = make(tiers, snapshot_config(tmp_path))
    stored(first, buffer, range(6))
    first.shutdown()  # an exited replica with a complete flush
    second, _ = make(tiers, snapshot_config(tmp_path))
    assert lookup(second, key(1)) is LookupResult.HIT
    second._beat()  # type: ignore[attr-defined]
    registry, other_registry = CollectorRegistry(), CollectorRegistry()
    settings = GcSettings(capacity_bytes=3 * BLOCK_BYTES, reclaim_after_s=600, interval_s=0)
    SnapshotGc(tmp_path, "pod-a", registry).run_once(settings)
    SnapshotGc(tmp_path, "pod-b", other_registry).run_once(settings)  # same volume, later
    text = generate_latest(registry).decode()
    assert 'gpupool_kv_tier_deleted_files_total{reason="capacity"} 4.0' in text
    assert "gpupool_kv_tier_restored_hits_total 1.0" in text
    assert "gpupool_kv_tier_restored_hits_first_minute 1.0" in text
    assert "gpupool_kv_tier_first_hit_seconds" in text
    assert 'gpupool_kv_tier_replica_exits_total{flush="complete"} 1.0' in text
    other = generate_latest(other_registry).decode()
    assert 'gpupool_kv_tier_replica_exits_total{flush="complete"} 0.0' in other  # counted once
    assert "gpupool_kv_tier_restored_hits_total" not in other  # pod-b has no tier running
    assert len(list(replicas_dir(tmp_path).glob("*.counted"))) == 1


def test_the_tier_gpupool_emits_is_the_one_vllm_builds(
    tmp_path: Path, tiers: list[SecondaryTierManager]
) -> None:
    """The ``secondary_tiers`` entry of the default policy with preservation on, as rendered,
    builds through vLLM's factory into this tier, keyed by the policy's identity."""
    from policy import DEFAULT_POLICY, load_policy
    from runtime.vllm import load_model_spec, plan_kv_cache

    policy = load_policy(DEFAULT_POLICY)
    preserving = policy.model_copy(
        update={"kv_cache": policy.kv_cache.model_copy(update={"kv_preservation": "filesystem"})}
    )
    workload = policy.workloads[0].model_copy(update={"kv_compaction": False})
    spec = load_model_spec(DEFAULT_POLICY.parent / workload.hf_config)
    plan = plan_kv_cache(preserving, workload, spec)
    assert plan.kv_transfer_config is not None
    (entry,) = plan.kv_transfer_config["kv_connector_extra_config"]["secondary_tiers"]
    tier, _ = make(tiers, entry | {"root_dir": str(tmp_path)})
    assert isinstance(tier, SnapshotTier)
    assert tier._flush_budget_s == policy.disruption.snapshot_s  # type: ignore[attr-defined]
    identity = json.loads((Path(tier.tier_root) / IDENTITY_FILE).read_text())
    assert identity["policy"]["block_size"] == plan.block_size
    assert identity["policy"]["prefix_caching_hash_algo"] == "sha256"


def test_a_hit_makes_a_block_recently_used_for_the_gc(
    tmp_path: Path, tiers: list[SecondaryTierManager]
) -> None:
    """The GC's order is the files' mtimes; the tier refreshes them on every block it finds,
    so the block a restarted replica keeps hitting outlives newer blocks nobody reads."""
    tier, buffer = make(tiers, snapshot_config(tmp_path))
    stored(tier, buffer, range(4))
    long_ago = time.time() - 3600
    for path in block_files(str(tmp_path)):
        os.utime(path, (long_ago, long_ago))
    assert lookup(tier, key(0)) is LookupResult.HIT
    tier._beat()  # type: ignore[attr-defined]
    gc = SnapshotGc(tmp_path, "pod-a", CollectorRegistry())
    gc.run_once(
        GcSettings(capacity_bytes=int(1.5 * BLOCK_BYTES), reclaim_after_s=600, interval_s=0)
    )
    assert lookup(tier, key(0)) is LookupResult.HIT
    assert [lookup(tier, key(n)) for n in (1, 2, 3)] == [LookupResult.MISS] * 3

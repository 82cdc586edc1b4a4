"""``gpupool kv-snapshots gc`` and ``show`` on a volume anything may have been put on:
folders nested far past Python's recursion limit, FIFOs and symlinks to ``/dev/zero`` named
like replica records and blocks, huge sparse files, symlinks out of the tree. Each command
runs as a real process under a timeout (a hang fails the test instead of stalling it) and
must end with its report, no traceback, the over-capacity blocks deleted and nothing outside
the volume touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from runtime.kvcache.preservation.gc import GcSettings, SnapshotGc
from runtime.kvcache.preservation.retention import plan
from runtime.kvcache.preservation.volume import Budget, scan

GPUPOOL = [sys.executable, "-m", "runtime.cli.app", "kv-snapshots"]
HANG_GUARD_S = 120
"""Far above a pass over these trees (about a second); only a hang reaches it."""
TIER = "gpupool-kv-0123456789abcdef"
BLOCK = 1500
CAPACITY = 3000  # three blocks of 1500 bytes: over it, two must go
DEEP = 1500  # folders: past the default recursion limit of 1000
HUGE = 1 << 36  # 64 GiB, sparse


def run(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*GPUPOOL, *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=os.environ | {"POD_NAME": "pod-gc"},
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def gc(root: Path) -> subprocess.CompletedProcess[str]:
    return run(
        "gc",
        "--root",
        str(root),
        "--capacity-bytes",
        str(CAPACITY),
        "--passes",
        "1",
        "--listen",
        "127.0.0.1:0",
    )


def show(root: Path, *extra: str) -> dict[str, Any]:
    done = run("show", "--root", str(root), *extra)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def volume(root: Path) -> Path:
    """A live tier holding three old blocks (over ``CAPACITY``); returns the tier."""
    tier = root / TIER
    (tier / "b").mkdir(parents=True)
    (tier / "gpupool-tier.json").write_text("{}")  # heartbeat: now
    (root / ".gpupool" / "replicas").mkdir(parents=True)
    for i in range(3):
        block = tier / "b" / f"{i:064x}.bin"
        block.write_bytes(b"\0" * BLOCK)
        os.utime(block, (time.time() - 1000 + i,) * 2)
    return tier


def deep(top: Path, depth: int = DEEP) -> Path:
    """``depth`` nested folders under ``top``; the innermost (made one by one: pathlib's and
    os.makedirs' ``parents`` recurse, and would hit the limit this tests)."""
    path = str(top)
    os.mkdir(path)
    for _ in range(depth):
        path = os.path.join(path, "d")
        os.mkdir(path)
    return Path(path)


def remove_tree(top: Path) -> None:
    """Remove ``top`` without recursion: pytest's cleanup of old temporary folders
    (shutil.rmtree) recurses, and would crash on a tree this deep in a later session."""
    folders, stack = [], [str(top)]
    while stack:
        folders.append(stack.pop())
        with os.scandir(folders[-1]) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    os.unlink(entry.path)
    for folder in reversed(folders):
        os.rmdir(folder)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The volume's mount (created by ``volume``), removed after the test."""
    yield tmp_path / "volume"
    if (tmp_path / "volume").exists():
        remove_tree(tmp_path / "volume")


def regular_blocks(root: Path) -> list[tuple[str, int]]:
    """Every regular ``.bin`` under ``root`` and its size (the oracle's own iterative walk)."""
    found, stack = [], [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) and entry.name.endswith(".bin"):
                    found.append((entry.path, entry.stat(follow_symlinks=False).st_size))
    return found


def record(started: float) -> str:
    return json.dumps({"pod": "pod-x", "tier": TIER, "started_at": started})


def outside_dir(tmp_path: Path) -> Path:
    """A folder beside the volume with a record and a block a GC must never touch."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "pod-x.1.000000.json").write_text(record(1.0))
    (outside / "old.bin").write_bytes(b"\0" * BLOCK * 3)
    os.utime(outside / "old.bin", (0, 0))
    return outside


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _sparse(path: Path) -> None:
    with open(path, "wb") as out:
        out.truncate(HUGE)


BAD = {"fifo": _fifo, "dev_zero": _dev_zero, "sparse": _sparse}


@pytest.mark.process
@pytest.mark.parametrize(
    ("where", "bad", "says"),
    [
        (".gpupool/replicas/pod-x.1.000000.json", "fifo", "a FIFO"),
        (".gpupool/replicas/pod-x.1.000000.json", "dev_zero", "a symlink (not followed)"),
        (".gpupool/replicas/pod-x.1.000000.json", "sparse", "not a regular file of at most"),
        (f"{TIER}/b/{'f' * 64}.bin", "fifo", "a FIFO"),
        (f"{TIER}/b/{'f' * 64}.bin", "dev_zero", "a symlink (not followed)"),
        (f"{TIER}/gpupool-tier.json.bin_1.tmp", "fifo", "a FIFO"),
    ],
)
def test_a_bad_entry_is_passed_over_and_the_rest_of_the_pass_is_done(
    root: Path, where: str, bad: str, says: str
) -> None:
    volume(root)
    BAD[bad](root / where)
    done = gc(root)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "snapshot GC: walk passed over" in x]
    assert f"{root / where}: {says}" in line
    assert sorted(Path(p).name for p, _ in regular_blocks(root)) == [f"{2:064x}.bin"]
    assert os.path.lexists(root / where)  # passed over, not deleted or renamed
    walk = show(root)["walk"]
    assert (walk["complete"], walk["passed_over"]) == (True, 1)
    assert says in walk["note"]


@pytest.mark.process
def test_folders_nested_past_the_recursion_limit_are_walked(root: Path) -> None:
    """A block at the bottom of 1,500 folders is counted and, being the oldest, deleted; a
    stale tier as deep is reclaimed to its last folder."""
    tier = volume(root)
    bottom = deep(tier / "deep") / f"{9:064x}.bin"
    bottom.write_bytes(b"\0" * BLOCK)
    os.utime(bottom, (time.time() - 5000,) * 2)
    stale = root / "gpupool-kv-fedcba9876543210"
    (deep(stale) / "x.bin").write_bytes(b"\0")
    (stale / "gpupool-tier.json").write_text("{}")
    os.utime(stale / "gpupool-tier.json", (time.time() - 7200,) * 2)  # past reclaim (15 m)
    before = show(root)
    assert before["tiers"][TIER]["files"] == 5  # identity, three blocks, the deep one
    assert before["walk"] == {"complete": True, "passed_over": 0, "note": None}
    done = gc(root)
    assert done.returncode == 0, done.stderr
    assert not bottom.exists()
    assert not stale.exists()
    assert sum(size for _, size in regular_blocks(root)) <= CAPACITY


@pytest.mark.process
def test_symlinks_out_of_the_tree_are_not_followed(root: Path, tmp_path: Path) -> None:
    """A tier folder linked to a folder outside, and the replicas' folder linked to one: the
    GC neither counts, deletes nor renames anything there."""
    tier = volume(root)
    outside = outside_dir(tmp_path)
    (tier / "elsewhere").symlink_to(outside)
    (root / "gpupool-kv-linked").symlink_to(outside)
    (root / ".gpupool" / "replicas").rmdir()
    (root / ".gpupool" / "replicas").symlink_to(outside)
    before = sorted(p.name for p in outside.iterdir())
    done = gc(root)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in outside.iterdir()) == before == ["old.bin", "pod-x.1.000000.json"]
    assert sorted(Path(p).name for p, _ in regular_blocks(root)) == [f"{2:064x}.bin"]
    report = show(root)
    assert report["replicas"] == {}
    assert "gpupool-kv-linked" not in report["tiers"]


@pytest.mark.process
def test_the_walk_stops_at_its_budget_and_then_reclaims_nothing(root: Path) -> None:
    volume(root)
    stale = root / "gpupool-kv-fedcba9876543210"
    stale.mkdir()
    (stale / "x.bin").write_bytes(b"\0")
    os.utime(stale / "x.bin", (0, 0))
    found = scan(root, Budget(0.0))
    assert not found.complete
    decided = plan(
        found.files,
        found.heartbeats,
        now=time.time(),
        capacity_bytes=CAPACITY,
        reclaim_after_s=900,
        complete=found.complete,
    )
    assert decided.reclaimed_tiers == frozenset()
    complete = scan(root, Budget())
    assert complete.complete
    reclaiming = plan(
        complete.files,
        complete.heartbeats,
        now=time.time(),
        capacity_bytes=CAPACITY,
        reclaim_after_s=900,
    )
    assert reclaiming.reclaimed_tiers == {stale.name}  # what the partial scan held back
    walk = show(root, "--budget-s", "1e-9")["walk"]
    assert walk["complete"] is False and "stopped at its 1e-09 s budget" in walk["note"]


def test_the_gc_exports_what_its_walk_passed_over(root: Path, tmp_path: Path) -> None:
    """In process, with entries no code path opens (a FIFO block, a record linked to a
    regular file outside): each is counted once although records are looked at twice."""
    volume(root)
    outside = outside_dir(tmp_path)
    os.mkfifo(root / TIER / "b" / f"{'f' * 64}.bin")
    (root / ".gpupool" / "replicas" / "pod-gc.1.000000.json").symlink_to(
        outside / "pod-x.1.000000.json"
    )
    registry = CollectorRegistry()
    gc = SnapshotGc(root, "pod-gc", registry)
    gc.run_once(GcSettings(capacity_bytes=CAPACITY, reclaim_after_s=900, interval_s=60))
    assert registry.get_sample_value("gpupool_kv_tier_gc_passed_over_entries") == 2
    assert registry.get_sample_value("gpupool_kv_tier_gc_complete") == 1
    assert (
        registry.get_sample_value("gpupool_kv_tier_deleted_files_total", {"reason": "capacity"})
        == 2
    )
    assert gc.own_status() is None  # the linked record is not this pod's
    cut = GcSettings(capacity_bytes=CAPACITY, reclaim_after_s=900, interval_s=60, pass_budget_s=0)
    gc.run_once(cut)
    assert registry.get_sample_value("gpupool_kv_tier_gc_complete") == 0


# --- generated trees ---

PLACES = {
    "record": ".gpupool/replicas/pod-x.{i}.000000.json",
    "block": f"{TIER}/b/{{i:064x}}.bin",
    "deep_block": f"{TIER}/deep/" + "d/" * 40 + "{i:064x}.bin",
    "partial": f"{TIER}/b/{{i:064x}}.bin_7.tmp",
    "other": f"{TIER}/notes-{{i}}.txt",
}
_entry = st.tuples(st.sampled_from(sorted(BAD)), st.sampled_from(sorted(PLACES)))


def _skipped(bad: str, place: str) -> bool:
    """Whether ``show`` passes over this entry (a sparse file is a regular file: only a
    record that size is refused)."""
    return bad != "sparse" or place == "record"


@pytest.mark.slow
@settings(
    max_examples=6,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # shrinking: minutes of processes
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    entries=st.lists(_entry, max_size=6),
    depth=st.sampled_from([0, 3, DEEP]),
    valid_record=st.booleans(),
)
def test_any_such_tree_ends_in_a_report_and_a_bounded_tier(
    tmp_path_factory: pytest.TempPathFactory,
    entries: list[tuple[str, str]],
    depth: int,
    valid_record: bool,
) -> None:
    root = tmp_path_factory.mktemp("hostile") / "volume"
    try:
        _check_tree(root, entries, depth, valid_record)
    finally:
        remove_tree(root)


def _check_tree(root: Path, entries: list[tuple[str, str]], depth: int, valid_record: bool) -> None:
    tier = volume(root)
    if depth:
        (deep(tier / "nested", depth) / f"{7:064x}.bin").write_bytes(b"\0" * BLOCK)
    if valid_record:  # an exited replica's record, beside the bad ones: still counted
        exited = root / ".gpupool" / "replicas" / "pod-y.5.000000.json"
        exited.write_text(record(5.0))
        os.utime(exited, (time.time() - 7200,) * 2)  # silent past reclaim: killed
    for i, (bad, place) in enumerate(entries, start=100):
        path = root / PLACES[place].format(i=i)
        path.parent.mkdir(parents=True, exist_ok=True)
        BAD[bad](path)
    report = show(root)
    expected = sum(_skipped(bad, place) for bad, place in entries)
    assert report["walk"]["passed_over"] == expected, report["walk"]
    assert list(report["replicas"]) == ["pod-y.5.000000.json"] * valid_record
    done = gc(root)
    assert done.returncode == 0, done.stderr
    passes = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
    assert [p["complete"] for p in passes] == [True]
    assert sum(size for _, size in regular_blocks(root)) <= CAPACITY
    for bad, place in entries:  # FIFOs and links are passed over, never removed
        if bad != "sparse":
            assert any(
                os.path.lexists(root / PLACES[place].format(i=i))
                for i in range(100, 100 + len(entries))
            )
    if valid_record:
        assert (root / ".gpupool" / "replicas" / "pod-y.5.000000.json.counted").exists()

"""Write and read throughput of the KV snapshot tier against plain sequential I/O of the same
bytes on the same disk, measured in the same run.

Tier rows: vLLM 0.32's own filesystem tier (``FileSystemTierManager``: one file per block,
a temp file then ``os.replace``, ``O_DIRECT`` where the directory takes it, a thread pool),
built standalone on CPU by vLLM's ``SecondaryTierFactory`` (``tests/harness/offload_tier.py``)
and driven as the scheduler drives it: ``submit_store`` jobs of ``--blocks-per-job`` distinct
blocks each, polled with ``get_finished_jobs`` until all end, then ``submit_load`` jobs
reading them back into other chunks of the host buffer. gpupool's ``SnapshotTier``
(``runtime.kvcache.preservation.tier``) is measured the same way, at the first ``--threads``
pair, when it imports; otherwise the output says it was skipped and why (and a failure of its
passes is reported as that row's result, not raised).

Baseline: the same bytes written by one thread to one file in block-sized ``os.write`` calls,
then read back with ``os.readv``, with the ``O_DIRECT`` choice the tier made
(``probe_o_direct``), from the same page-aligned buffer. Every pass is checked byte for byte
(the host buffer holds random bytes; the destination half is zeroed before each read). With
``O_DIRECT`` no read comes from the page cache; without it the files are written back and
dropped from the cache (``fdatasync`` + ``POSIX_FADV_DONTNEED``, untimed) before the reads,
and the output says those reads may still be partly cached.

The machine is shared and noisy: each round times every row next to its own baseline (which
goes first alternates by round), the ratio tier / plain is taken per round, and medians and
ranges over the rounds are reported. Last, what the tier writes in the default policy's
``disruption.snapshot_s`` at the measured rate (bytes, tokens of the default workload's
model, share of its host tier). One JSON line per measurement, then a table.

    python bench/snapshot.py                          # temp dir (its filesystem is printed)
    python bench/snapshot.py --dir /mnt/pvc --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.kv_offload.tiering.fs import io as fs_io

from policy import DEFAULT_POLICY, load_policy
from runtime.vllm import load_model_spec
from tests.harness.offload_tier import build_tier, finished, key, load, store

MB = 10**6
MIB = 2**20
GIB = 2**30
SNAPSHOT_MODULE = "runtime.kvcache.preservation.tier"
_keys = itertools.count()


@dataclass(frozen=True)
class Row:
    """One tier configuration: its name in the table and how to build it."""

    name: str
    block: int
    threads: str
    config: Callable[[str], dict[str, Any]]


@dataclass(frozen=True)
class Pass:
    write_s: float
    read_s: float


def _loadavg() -> str:
    """1, 5 and 15 minute load averages (what else ran while the figures were taken)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def filesystem(path: str) -> tuple[str, str, str]:
    """(type, device, mount point) of the mount holding ``path`` (the longest prefix)."""
    real = os.path.realpath(path)
    best = ("unknown", "unknown", "/")
    length = -1
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 3:
                continue
            device, point, kind = fields[0], fields[1].replace("\\040", " "), fields[2]
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= length:
                best, length = (kind, device, point), len(point)
    return best


def region(nbytes: int) -> NDArray[np.uint8]:
    """Anonymous page-aligned memory, as vLLM's host tier (``O_DIRECT`` needs the alignment)."""
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


def _drop_cache(paths: list[str]) -> None:
    """Write back and drop ``paths`` from the page cache (buffered I/O only; untimed)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _all_files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def _verify(buffer: NDArray[np.uint8], total: int, block: int, what: str) -> None:
    """The destination half must equal the source half, byte for byte."""
    if np.array_equal(buffer[total:], buffer[:total]):
        return
    src, dst = buffer[:total].reshape(-1, block), buffer[total:].reshape(-1, block)
    bad = [i for i in range(len(src)) if not np.array_equal(src[i], dst[i])]
    raise SystemExit(
        f"bench/snapshot.py: {what} read back wrong bytes in {len(bad)} of {len(src)} blocks "
        f"(first: block {bad[0]})"
    )


def plain_pass(buffer: NDArray[np.uint8], total: int, block: int, path: str, direct: bool) -> Pass:
    """One thread, one file: block-sized sequential writes of the source half, then reads
    into the destination half."""
    view = memoryview(buffer)  # type: ignore[arg-type]
    flag = fs_io.O_DIRECT if direct else 0
    buffer[total:] = 0
    start = time.perf_counter()
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | flag, 0o644)
    try:
        for offset in range(0, total, block):
            if os.write(fd, view[offset : offset + block]) != block:
                raise SystemExit(f"bench/snapshot.py: short write to {path}")
    finally:
        os.close(fd)
    write_s = time.perf_counter() - start
    if not direct:
        _drop_cache([path])
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | flag)
    try:
        for offset in range(0, total, block):
            if os.readv(fd, [view[total + offset : total + offset + block]]) != block:
                raise SystemExit(f"bench/snapshot.py: short read from {path}")
    finally:
        os.close(fd)
    read_s = time.perf_counter() - start
    _verify(buffer, total, block, "plain I/O")
    os.remove(path)
    return Pass(write_s, read_s)


def _wait(tier: SecondaryTierManager, ids: set[int], timeout_s: float, what: str) -> None:
    failed = [r.job_id for r in finished(tier, ids, timeout_s).values() if not r.success]
    if failed:
        raise SystemExit(f"bench/snapshot.py: {what}: {len(failed)} of {len(ids)} jobs failed")


def tier_pass(
    row: Row, buffer: NDArray[np.uint8], total: int, per_job: int, root: str, direct: bool
) -> Pass:
    """Store every source chunk (distinct keys, ``per_job`` blocks a job), wait, then load them
    into the destination chunks and check the bytes."""
    n = total // row.block
    chunks = buffer.reshape(-1, row.block)  # 2n chunks: n sources, then n destinations
    keys = [key(next(_keys)) for _ in range(n)]
    timeout = max(60.0, total / (5 * MB))  # fails below 5 MB/s rather than hanging
    buffer[total:] = 0
    tier = build_tier(row.config(root), chunks, block_bytes=row.block)
    try:
        start = time.perf_counter()
        ids = {
            store(tier, keys[i : i + per_job], list(range(i, min(i + per_job, n))))
            for i in range(0, n, per_job)
        }
        _wait(tier, ids, timeout, f"{row.name} store")
        write_s = time.perf_counter() - start
        if not direct:
            _drop_cache(_all_files(root))
        start = time.perf_counter()
        ids = {
            load(tier, keys[i : i + per_job], list(range(n + i, n + min(i + per_job, n))))
            for i in range(0, n, per_job)
        }
        _wait(tier, ids, timeout, f"{row.name} load")
        read_s = time.perf_counter() - start
    finally:
        tier.shutdown()
    _verify(buffer, total, row.block, row.name)
    shutil.rmtree(root)
    return Pass(write_s, read_s)


def pair(
    row: Row,
    order: int,
    buffer: NDArray[np.uint8],
    total: int,
    options: argparse.Namespace,
    root: str,
    direct: bool,
) -> tuple[Pass, Pass]:
    """The tier's pass and its baseline's, which goes first alternating with ``order``."""
    plain_file = root + ".plain"

    def tier() -> Pass:
        return tier_pass(row, buffer, total, options.blocks_per_job, root, direct)

    def plain() -> Pass:
        return plain_pass(buffer, total, row.block, plain_file, direct)

    if order % 2:
        first = tier()
        return first, plain()
    first = plain()
    return tier(), first


def snapshot_tier() -> str | None:
    """Why gpupool's SnapshotTier cannot be measured (None: it can)."""
    try:
        module = importlib.import_module(SNAPSHOT_MODULE)
    except Exception as error:  # any import-time failure means: not measurable here
        return f"import {SNAPSHOT_MODULE} failed: {type(error).__name__}: {error}"
    if not hasattr(module, "SnapshotTier"):
        return f"{SNAPSHOT_MODULE} has no SnapshotTier"
    return None


def rows(blocks: list[int], threads: list[tuple[int, int]], snapshot: bool) -> list[Row]:
    out: list[Row] = []
    for block in blocks:
        for reads, writes in threads:

            def fs(root: str, r: int = reads, w: int = writes) -> dict[str, Any]:
                return {"type": "fs", "root_dir": root, "n_read_threads": r, "n_write_threads": w}

            out.append(Row("fs", block, f"{reads}/{writes}", fs))
        if snapshot:  # at the first thread pair only (vLLM's default 16/16): keeps it short
            reads, writes = threads[0]

            def snap(root: str, r: int = reads, w: int = writes) -> dict[str, Any]:
                return {
                    "type": "SnapshotTier",
                    "module_path": SNAPSHOT_MODULE,
                    "root_dir": root,
                    "flush_budget_s": 10,
                    "identity": {},
                    "n_read_threads": r,
                    "n_write_threads": w,
                }

            out.append(Row("SnapshotTier", block, f"{reads}/{writes}", snap))
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values)


def summarize(measured: list[dict[str, Any]], row: Row) -> dict[str, Any]:
    mine = [m for m in measured if m["row"] == row.name and m["block_kib"] == row.block // 1024]
    mine = [m for m in mine if m["threads"] == row.threads]
    out: dict[str, Any] = {
        "kind": "summary",
        "row": row.name,
        "block_kib": row.block // 1024,
        "threads": row.threads,
        "rounds": len(mine),
    }
    for field in (
        "tier_write_mb_s",
        "tier_read_mb_s",
        "plain_write_mb_s",
        "plain_read_mb_s",
        "write_ratio",
        "read_ratio",
    ):
        values = [m[field] for m in mine]
        out[field] = round(_median(values), 3)
        out[field + "_range"] = [round(min(values), 3), round(max(values), 3)]
    return out


def grace(summary: Mapping[str, Any], policy_file: Path) -> dict[str, Any]:
    """What the tier writes in the policy's snapshot window at its measured write rate."""
    policy = load_policy(policy_file)
    workload = policy.workloads[0]
    model = load_model_spec(policy_file.parent / workload.hf_config)
    kv_dtype = model.dtype if policy.kv_cache.cache_dtype == "auto" else policy.kv_cache.cache_dtype
    per_token = model.kv_bytes_per_token_per_layer(workload.gpus_per_replica, kv_dtype)
    per_token *= model.num_layers
    host = int(policy.kv_cache.offload_host_gib * GIB)
    rate = summary["tier_write_mb_s"] * MB
    written = rate * policy.disruption.snapshot_s
    return {
        "kind": "grace",
        "row": summary["row"],
        "block_kib": summary["block_kib"],
        "threads": summary["threads"],
        "snapshot_s": policy.disruption.snapshot_s,
        "write_mb_s": summary["tier_write_mb_s"],
        "bytes_in_snapshot_s": int(written),
        "model": workload.model,
        "kv_bytes_per_token": per_token,
        "tokens_in_snapshot_s": int(written // per_token),
        "host_tier_bytes": host,
        "host_tier_share": round(written / host, 4),
        "host_tier_flush_s": round(host / rate, 1) if rate else None,
    }


def _sizes(text: str) -> list[int]:
    return [int(v) * 1024 for v in text.split(",")]


def _threads(text: str) -> list[tuple[int, int]]:
    out = []
    for pair in text.split(","):
        reads, _, writes = pair.partition("/")
        out.append((int(reads), int(writes or reads)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", help="where the files go (default: a new temp dir)")
    parser.add_argument("--block-kib", default="256,2048", help="block sizes, KiB (2048: 8B)")
    parser.add_argument("--total-mib", type=int, default=128, help="bytes per pass")
    parser.add_argument("--threads", default="16/16,2/2", help="fs tier read/write threads")
    parser.add_argument("--blocks-per-job", type=int, default=4, help="blocks per store job")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    blocks = _sizes(options.block_kib)
    total = options.total_mib * MIB
    for block in blocks:
        if block <= 0 or block % mmap.PAGESIZE or total % block:
            raise SystemExit(
                f"bench/snapshot.py: block {block // 1024} KiB: expected a multiple of the "
                f"{mmap.PAGESIZE // 1024} KiB page dividing --total-mib {options.total_mib}"
            )
    parent = options.dir or tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="gpupool-snapshot-bench-", dir=parent)
    try:
        run(options, blocks, total, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(options: argparse.Namespace, blocks: list[int], total: int, work: str) -> None:
    load_before = _loadavg()
    kind, device, mount = filesystem(work)
    direct = fs_io.probe_o_direct(work)
    why_not = snapshot_tier()
    table = rows(blocks, _threads(options.threads), why_not is None)
    setup = {
        "kind": "setup",
        "dir": work,
        "fs_type": kind,
        "device": device,
        "mount": mount,
        "o_direct": direct,
        "reads": "O_DIRECT: not from the page cache"
        if direct
        else "buffered: files written back and dropped from the page cache before reading "
        "(fdatasync + POSIX_FADV_DONTNEED); some reads may still be cached, so read ratios "
        "are an upper bound",
        "vllm_fs_io_C": fs_io._HAS_FSIO_C,
        "total_mib": total // MIB,
        "blocks_per_job": options.blocks_per_job,
        "rounds": options.rounds,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "snapshot_tier": "measured" if why_not is None else f"skipped: {why_not}",
    }
    print(json.dumps(setup), flush=True)
    buffer = region(2 * total)
    buffer[:total] = np.frombuffer(np.random.default_rng(options.seed).bytes(total), np.uint8)
    measured: list[dict[str, Any]] = []
    failed: dict[Row, str] = {}
    for round_ in range(options.rounds):
        for index, row in enumerate(table):
            root = os.path.join(work, f"tier-{round_}-{index}")
            plain_file = root + ".plain"
            if row in failed:
                continue
            try:
                tier, plain = pair(row, round_ + index, buffer, total, options, root, direct)
            except Exception as problem:
                if row.name == "fs":  # vLLM's own tier must work: a failure is the result
                    raise
                # gpupool's tier is being written alongside: report it, measure the rest
                failed[row] = f"{type(problem).__name__}: {problem}"
                shutil.rmtree(root, ignore_errors=True)
                print(json.dumps({"kind": "failed", "row": row.name, "error": failed[row]}))
                continue
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(plain_file)
            entry = {
                "kind": "round",
                "round": round_,
                "row": row.name,
                "block_kib": row.block // 1024,
                "threads": row.threads,
                "tier_write_mb_s": round(total / tier.write_s / MB, 1),
                "tier_read_mb_s": round(total / tier.read_s / MB, 1),
                "plain_write_mb_s": round(total / plain.write_s / MB, 1),
                "plain_read_mb_s": round(total / plain.read_s / MB, 1),
                "write_ratio": round(plain.write_s / tier.write_s, 3),
                "read_ratio": round(plain.read_s / tier.read_s, 3),
            }
            measured.append(entry)
            print(json.dumps(entry), flush=True)
    summaries = [summarize(measured, row) for row in table if row not in failed]
    graces = [grace(s, DEFAULT_POLICY) for s in summaries]
    for line in (*summaries, *graces):
        print(json.dumps(line))
    load_after = _loadavg()
    print(json.dumps({"kind": "done", "load_after": load_after}))
    _print_table(setup, summaries, graces, load_after)
    for row, error in failed.items():
        print(f"{row.name} {row.block // 1024} KiB {row.threads}: FAILED: {error}")


def _range(summary: Mapping[str, Any], field: str) -> str:
    low, high = summary[field + "_range"]
    return f"{summary[field]:.2f} ({low:.2f}-{high:.2f})"


def _print_table(
    setup: Mapping[str, Any],
    summaries: list[dict[str, Any]],
    graces: list[dict[str, Any]],
    load_after: str,
) -> None:
    print()
    print(
        f"{setup['dir']}: {setup['fs_type']} on {setup['device']} (mount {setup['mount']}), "
        f"O_DIRECT {'yes' if setup['o_direct'] else 'no'}; {setup['total_mib']} MiB per pass, "
        f"{setup['blocks_per_job']} blocks per job, {setup['rounds']} rounds, "
        f"{setup['cpus']} CPUs; load average before {setup['load_before']}, after {load_after}"
    )
    print(f"reads: {setup['reads']}")
    print(f"SnapshotTier: {setup['snapshot_tier']}")
    print(
        "| tier | block | threads R/W | write MB/s | plain write MB/s | write ratio (range) "
        "| read MB/s | plain read MB/s | read ratio (range) |"
    )
    print("|---|---:|---|---:|---:|---|---:|---:|---|")
    for s in summaries:
        print(
            f"| {s['row']} | {s['block_kib']} KiB | {s['threads']} | {s['tier_write_mb_s']:.0f} "
            f"| {s['plain_write_mb_s']:.0f} | {_range(s, 'write_ratio')} "
            f"| {s['tier_read_mb_s']:.0f} | {s['plain_read_mb_s']:.0f} "
            f"| {_range(s, 'read_ratio')} |"
        )
    print()
    if graces:
        first = graces[0]
        print(
            f"In disruption.snapshot_s = {first['snapshot_s']} s (policy/pool.yaml) at the median "
            f"write rate; {first['model']} KV is {first['kv_bytes_per_token']:,} bytes/token, "
            f"host tier {first['host_tier_bytes'] / GIB:g} GiB:"
        )
    print("| tier | block | threads R/W | written in snapshot_s | tokens | share of host tier "
          "| whole host tier takes |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|")
    for g in graces:
        print(
            f"| {g['row']} | {g['block_kib']} KiB | {g['threads']} "
            f"| {g['bytes_in_snapshot_s'] / GIB:.2f} GiB | {g['tokens_in_snapshot_s']:,} "
            f"| {100 * g['host_tier_share']:.1f} % | {g['host_tier_flush_s']} s |"
        )


if __name__ == "__main__":
    main()

"""What one snapshot-GC pass costs against the bare walk of the same tree.

A GC pass (``runtime.kvcache.preservation.gc.SnapshotGc.run_once``) scans every file of the
volume, plans, and deletes. The floor is a plain ``os.walk`` + ``stat`` of the same files,
measured in the same run (interleaved rounds: these machines are noisy). The tree is vLLM's
real layout (``FileMapper`` names, 4096 directories of the hashed fan-out), with sparse files
of the block size, so a million-block volume needs no disk space.

    python bench/snapshot_gc.py [--files 20000,100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry
from vllm.v1.kv_offload.base import make_offload_key
from vllm.v1.kv_offload.file_mapper import FileMapper

from runtime.kvcache.preservation.gc import GcSettings, SnapshotGc
from runtime.kvcache.preservation.identity import IDENTITY_FILE

BLOCK_BYTES = 2 * 1024 * 1024
"""One Llama-3.1-8B block of 16 tokens (bf16, 32 layers)."""


def build(root: Path, files: int) -> None:
    """``files`` sparse block files under one keyed tier, named as vLLM names them."""
    tier = root / "gpupool-kv-0123456789abcdef"
    mapper = FileMapper(str(tier), "meta-llama/Llama-3.1-8B", 16, 1, 1, 1, 1, 1, 0, "bfloat16")
    tier.mkdir(parents=True)
    (tier / IDENTITY_FILE).write_text("{}")
    now = time.time()
    for n in range(files):
        key = make_offload_key(hashlib.sha256(n.to_bytes(8, "big")).digest(), 0)
        path = mapper.get_file_name(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.truncate(BLOCK_BYTES)
        os.utime(path, (now - files + n, now - files + n))


def walk(root: Path) -> int:
    """The floor: every file's stat, nothing else."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default="20000,100000", help="block files per volume")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    print(f"# load {os.getloadavg()[0]:.2f} at start", flush=True)
    results: list[dict[str, Any]] = []
    for files in (int(n) for n in options.files.split(",")):
        with tempfile.TemporaryDirectory(prefix="gpupool-gc-bench-") as work:
            root = Path(work)
            started = time.perf_counter()
            build(root, files)
            built_s = time.perf_counter() - started
            gc = SnapshotGc(root, "bench", CollectorRegistry())
            keep_all = GcSettings(capacity_bytes=2**62, reclaim_after_s=600, interval_s=60)
            walks, passes = [], []
            for _ in range(options.rounds):
                t0 = time.perf_counter()
                walk(root)
                t1 = time.perf_counter()
                decided, _ = gc.run_once(keep_all)
                t2 = time.perf_counter()
                assert not decided.deletions
                walks.append(t1 - t0)
                passes.append(t2 - t1)
            # Just over capacity: one pass deletes down to the low watermark, a tenth of the
            # blocks (the tree is smaller afterwards, so this is measured once).
            tenth = GcSettings(files * BLOCK_BYTES - 1, reclaim_after_s=600, interval_s=60)
            t0 = time.perf_counter()
            _, applied = gc.run_once(tenth)
            delete_s = time.perf_counter() - t0
            row: dict[str, Any] = {
                "files": files,
                "build_s": round(built_s, 1),
                "walk_s": round(statistics.median(walks), 3),
                "gc_pass_s": round(statistics.median(passes), 3),
                "ratio": round(
                    statistics.median(p / w for p, w in zip(passes, walks, strict=True)), 2
                ),
                "ratios": [round(p / w, 2) for p, w in zip(passes, walks, strict=True)],
                "capacity_pass_s": round(delete_s, 3),
                "deleted": applied.deleted_files.get("capacity", 0),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    print(f"# load {os.getloadavg()[0]:.2f} at end")
    print("| files | bare walk s | GC pass s | ratio (rounds) | capacity pass s (deleted) |")
    print("|---:|---:|---:|---|---:|")
    for r in results:
        print(
            f"| {r['files']} | {r['walk_s']} | {r['gc_pass_s']} | {r['ratio']} "
            f"({', '.join(map(str, r['ratios']))}) | {r['capacity_pass_s']} ({r['deleted']}) |"
        )


if __name__ == "__main__":
    main()

"""The GPU check of the KV mover, prepared for a session that has a GPU for a few minutes.

Runs ``bench/compaction.py --device cuda`` (which checks every strategy's result before it
times it) on the layouts vLLM 0.32 gives a layer on a GPU and on two page sizes, with a
sweep of the fused kernel's tile, and prints one line per configuration: the fused
kernel's ratio to a contiguous device copy of the same bytes (goal >= 0.8x on an H200),
its GiB/s and the copy's, the best tile, and the unfused rows for comparison. Needs only
torch and triton (no vLLM); about 2-4 minutes on an H200, each configuration capped at
``--timeout`` seconds. The raw JSON goes to ``$OUT/gpu_check.json`` when ``OUT`` is set.

    python bench/gpu_check.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent / "compaction.py"
GOAL = 0.8
"""The fused kernel's target, as a share of a contiguous device copy's bandwidth."""
TILES = "256,512,2048,4096"
"""Tiles (int64 words per program) tried beside the default (``triton_mover.TILE_WORDS``)."""
CONFIGS = {
    "LBNHC 64 KiB pages, 8 GiB pool (FlashAttention/FlashInfer on Hopper)": [
        "--layout", "LBNHC", "--blocks", "4096", "--tile-words", TILES,
    ],
    "LBHNC 64 KiB pages, 8 GiB pool": ["--layout", "LBHNC", "--blocks", "4096"],
    "BLHNC 64 KiB pages, 8 GiB pool (blocks outermost)": ["--layout", "BLHNC", "--blocks", "4096"],
    "LHBNC 64 KiB pages, 8 GiB pool (a chunk per head)": ["--layout", "LHBNC", "--blocks", "4096"],
    "LBNHC 16 KiB pages, 4 GiB pool (e.g. 8B model at TP 2)": [
        "--layout", "LBNHC", "--page-kib", "16", "--blocks", "8192", "--tile-words", TILES,
    ],
    "LBNHC 64 KiB pages, 1 GiB pool (the CPU default shape)": ["--layout", "LBNHC"],
}  # fmt: skip


def _run(args: list[str], timeout: int) -> dict[str, object] | str:
    """The benchmark's JSON report, or why there is none."""
    command = [sys.executable, str(BENCH), "--device", "cuda", "--repeat", "7", "--json", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _line(name: str, report: dict[str, object]) -> str:
    rows: dict[str, dict[str, float]] = report["strategies"]  # type: ignore[assignment]
    fused = {k: v for k, v in rows.items() if k.startswith("fused")}
    best = max(fused, key=lambda k: fused[k]["ratio_to_copy"])
    ratio = rows["fused"]["ratio_to_copy"]
    verdict = "MET" if ratio >= GOAL else "MISSED"
    others = ", ".join(
        f"{k} {v['ratio_to_copy']:.3f}x" for k, v in rows.items() if k in ("runs", "gather")
    )
    return (
        f"{name}: fused {ratio:.2f}x of copy ({rows['fused']['gib_per_s']:.0f} GiB/s vs copy "
        f"{report['copy_gib_per_s']:.0f} GiB/s; range {rows['fused']['ratio_min']:.2f}-"
        f"{rows['fused']['ratio_max']:.2f}), goal >= {GOAL}x {verdict}; best tile {best} "
        f"{fused[best]['ratio_to_copy']:.2f}x; {others}; {report['moves']} moves, "
        f"{report['moved_mib']:.0f} MiB moved"
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=int, default=90, help="seconds per configuration")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(f"bench/gpu_check.py: no CUDA GPU visible to torch {torch.__version__}")
    import triton

    free, total = torch.cuda.mem_get_info()
    print(
        f"{torch.cuda.get_device_name()}: torch {torch.__version__}, triton {triton.__version__}, "
        f"{free / 2**30:.0f} of {total / 2**30:.0f} GiB free"
    )
    start = time.monotonic()
    reports: dict[str, object] = {}
    for name, config in CONFIGS.items():
        report = _run(config, args.timeout)
        reports[name] = report
        print(_line(name, report) if isinstance(report, dict) else f"{name}: FAILED: {report}")
        sys.stdout.flush()
    print(f"done in {time.monotonic() - start:.0f} s")
    if out := os.environ.get("OUT"):
        Path(out, "gpu_check.json").write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()

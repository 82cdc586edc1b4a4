"""The GPU check of KV compaction, prepared for a session that has a GPU for a few minutes:
one command runs both halves.

1. The mover's kernels: runs ``bench/compaction.py --device cuda`` (which checks every
   strategy's result before it times it) on the layouts vLLM 0.32 gives a layer on a GPU
   and on two page sizes, with a sweep of the fused kernel's tile, and prints one line per
   configuration: the fused kernel's ratio to a contiguous device copy of the same bytes
   (goal >= 0.8x on an H200), its GiB/s and the copy's, the best tile, and the unfused
   rows for comparison. Needs only torch and triton; about 2-4 minutes on an H200, each
   configuration capped at ``--timeout`` seconds.
2. The engine: when a CUDA build of vLLM 0.32 is importable (probed in a child), runs
   ``bench/compaction_gpu.py`` (compaction, shrink and grow mid-generation in a real engine
   on a full device: identical outputs, memory returned, one layer extra at most) within
   the time left, and prints its verdict; otherwise prints why it was skipped.

Everything stays within ``--budget-s`` (570 s: one 10-minute device command); the kernel
configurations leave the engine check at least ``ENGINE_MIN_S``. The raw JSON (each
configuration's report and the engine check's verdict) goes to ``$OUT/gpu_check.json`` when
``OUT`` is set, with the engine check's own ``compaction_gpu.json`` and log beside it.

    python bench/gpu_check.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.device_budget import Budget

BENCH = Path(__file__).resolve().parent / "compaction.py"
ENGINE_CHECK = Path(__file__).resolve().parent / "compaction_gpu.py"
ENGINE_KEY = "engine check (bench/compaction_gpu.py)"
ENGINE_BUDGET_S = 300
"""The engine check's own default bound, and the most it is given here."""
ENGINE_MIN_S = 180
"""Time the kernel configurations leave for the engine check (start-up alone takes ~1 min)."""
VLLM_PROBE = r"""
import json
out = {}
try:
    import vllm
    from vllm.platforms import current_platform
    out = {"vllm": vllm.__version__, "platform": str(current_platform.device_type)}
except Exception as error:
    out = {"error": f"{type(error).__name__}: {error}"}
print(json.dumps(out))
"""
"""Run in a child: importing vLLM here would only slow the kernel half down."""
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


def _engine_blocker(timeout_s: float) -> str | None:
    """Why the engine check cannot run here (None: a CUDA build of vLLM 0.32 imports)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", VLLM_PROBE], capture_output=True, text=True, timeout=timeout_s
        )
        seen: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as error:
        return f"the vLLM probe gave no answer ({type(error).__name__})"
    if "error" in seen:
        return f"import vllm failed: {seen['error']}"
    if not seen["vllm"].startswith("0.32."):
        return f"vLLM {seen['vllm']} is installed; the engine check needs 0.32.x"
    if seen["platform"] != "cuda":
        return f"vLLM {seen['vllm']} runs on platform {seen['platform']!r}, not its CUDA build"
    return None


def _engine_check(left_s: float) -> dict[str, object]:
    """``bench/compaction_gpu.py``'s verdict, run within ``left_s`` seconds."""
    budget = min(ENGINE_BUDGET_S, left_s - 20)
    command = [sys.executable, str(ENGINE_CHECK), "--budget-s", f"{budget:.0f}"]
    print(f"{ENGINE_KEY}: running with a budget of {budget:.0f} s", flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=budget + 15)
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else ""
        _save_log(stdout, "")
        return {"verdict": "FAIL", "reason": f"no verdict within {budget + 15:.0f} s"}
    _save_log(done.stdout, done.stderr)
    try:
        verdict: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"verdict": "FAIL", "reason": f"no verdict (exit {done.returncode}): {tail}"}
    return verdict


def _save_log(stdout: str, stderr: str) -> None:
    if out := os.environ.get("OUT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "compaction_gpu.log").write_text(stdout + "\n--- stderr ---\n" + stderr)


def _engine_line(verdict: dict[str, object]) -> str:
    """One line: the verdict, what vLLM chose, and the figures behind the memory checks."""
    text = f"{ENGINE_KEY}: {verdict.get('verdict')}"
    if verdict.get("reason"):
        text += f" ({verdict['reason']})"
    engine: dict[str, object] = verdict.get("engine") or {}  # type: ignore[assignment]
    if engine:
        kv_bytes: int = engine["kv_bytes"]  # type: ignore[assignment]
        text += (
            f"; backend {engine['attention_backends']}, KV layout {engine['kv_cache_layout']}, "
            f"{engine['blocks']} blocks = {kv_bytes / 2**30:.1f} GiB"
        )
    passes: list[dict[str, object]] = verdict.get("passes") or []  # type: ignore[assignment]
    for record in passes:
        if record["op"] == "shrink":
            returned: int = record["device_returned_bytes"]  # type: ignore[assignment]
            removed: int = record["removed_bytes"]  # type: ignore[assignment]
            text += (
                f"; shrink at step {record['step']}: device got back "
                f"{returned / max(removed, 1):.2f} of {removed / 2**30:.2f} GiB, extra "
                f"{record['extra_in_layers']} layers"
            )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timeout", type=int, default=90, help="seconds per configuration")
    parser.add_argument("--budget-s", type=float, default=570, help="bound on the whole check")
    args = parser.parse_args()
    budget = Budget(args.budget_s)
    if not torch.cuda.is_available():
        raise SystemExit(f"bench/gpu_check.py: no CUDA GPU visible to torch {torch.__version__}")
    import triton

    free, total = torch.cuda.mem_get_info()
    print(
        f"{torch.cuda.get_device_name()}: torch {torch.__version__}, triton {triton.__version__}, "
        f"{free / 2**30:.0f} of {total / 2**30:.0f} GiB free"
    )
    blocker = _engine_blocker(timeout_s=120)
    reserve = 0 if blocker else ENGINE_MIN_S
    reports: dict[str, object] = {}
    for name, config in CONFIGS.items():
        left = int(budget.remaining() - reserve)
        if left < 10:
            reports[name] = "skipped: no time left"
            print(f"{name}: SKIPPED: no time left in the budget")
            continue
        report = _run(config, min(args.timeout, left))
        reports[name] = report
        print(_line(name, report) if isinstance(report, dict) else f"{name}: FAILED: {report}")
        sys.stdout.flush()
    print(f"kernel configurations done in {budget.elapsed():.0f} s")
    engine_left = budget.remaining()
    if blocker is None and engine_left < 60:
        blocker = f"only {engine_left:.0f} s of the budget left"
    if blocker is None:
        engine = _engine_check(engine_left)
        print(_engine_line(engine))
    else:
        engine = {"verdict": "SKIPPED", "reason": blocker}
        print(f"{ENGINE_KEY}: SKIPPED: {blocker}")
    reports[ENGINE_KEY] = engine
    print(f"done in {budget.elapsed():.0f} s")
    if out := os.environ.get("OUT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_check.json").write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()

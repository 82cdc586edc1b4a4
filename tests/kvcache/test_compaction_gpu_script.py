"""The prepared GPU engine check (``bench/compaction_gpu.py``) proven on the CPU build: a
device session has minutes, so the script's own logic (schedule, measures, checks, verdict,
exit codes) must already work before it gets one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness.servers import REPO

pytestmark = pytest.mark.slow  # a fresh interpreter with its own engine (~50 s)

SCRIPT = REPO / "bench" / "compaction_gpu.py"


def _run(args: list[str], out: Path, timeout_s: float) -> tuple[int, dict[str, Any], str]:
    """Exit status, the verdict (last stdout line) and stderr of one run of the script."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-4000:]
    verdict: dict[str, Any] = json.loads(lines[-1])
    return done.returncode, verdict, done.stderr


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("compaction-gpu-cpu")
    code, verdict, _ = _run(["--device", "cpu", "--budget-s", "240"], out, timeout_s=300)
    return code, verdict, out


def test_the_cpu_run_passes_every_check(cpu_run: tuple[int, dict[str, Any], Path]) -> None:
    code, verdict, out = cpu_run
    assert (code, verdict["verdict"]) == (0, "PASS"), verdict
    checks = verdict["checks"]
    assert checks["outputs_identical"] and verdict["outputs"]["differing_requests"] == []
    assert checks["passes_ok"] and checks["every_pass_ran"]
    assert checks["memory_returned_on_shrink"] and checks["memory_retaken_on_grow"]
    assert all(checks.values()), checks
    assert json.loads((out / "compaction_gpu.json").read_text()) == verdict


def test_the_cpu_run_measured_what_the_verdict_claims(
    cpu_run: tuple[int, dict[str, Any], Path],
) -> None:
    """The figures behind the checks: every pass done mid-generation, shrinks to the
    fraction asked, memory back within 10 % of what the KV tensors lost, one layer extra."""
    _, verdict, _ = cpu_run
    passes = verdict["passes"]
    assert [(p["op"], p["outcome"]["status"]) for p in passes] == [
        ("compact", "done"),
        ("shrink", "done"),
        ("grow", "done"),
        ("compact", "done"),
        ("shrink", "done"),
        ("grow", "done"),
    ]
    assert all(p["running_before"] > 0 for p in passes)
    blocks = verdict["engine"]["blocks"]
    assert [p["blocks_after"] for p in passes if p["op"] == "shrink"] == [
        blocks // 4,
        int(blocks * 0.25 * 1.25),
    ]
    for record in passes:
        if record["op"] == "shrink":
            assert record["device_returned_bytes"] >= 0.9 * record["removed_bytes"] > 0
        if record["op"] in ("shrink", "grow"):
            assert record["extra_bytes"] <= 1.5 * record["one_layer_bytes"]
            assert record["worker_peak_extra_bytes"] is not None
    assert verdict["engine"]["kv_cache_layout"] and verdict["engine"]["attention_backends"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_gpu_is_not_run(tmp_path: Path) -> None:
    code, verdict, stderr = _run(["--device", "cuda"], tmp_path, timeout_s=120)
    assert (code, verdict["verdict"]) == (2, "NOT RUN"), verdict
    assert any("CUDA" in reason for reason in verdict["reason"]), verdict
    assert "CUDA" in stderr

"""A sliding-window model through compaction, shrink and grow mid-generation: identical
greedy outputs, and every live block renamed in the worker's tables while the entries the
window freed (vLLM never tells the worker) are left to the rename's null mapping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.harness.servers import REPO

pytestmark = pytest.mark.slow  # a fresh interpreter with its own engine (~40 s)


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-m", "tests.kvcache.sliding_window_probe"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_the_model_runs_one_sliding_window_group(probe: dict[str, Any]) -> None:
    assert (probe["spec"], probe["window"]) == ("SlidingWindowSpec", 64)
    assert probe["freed"] > 0, "the window never freed a block: the case is not exercised"


def test_compaction_shrink_and_grow_keep_outputs(probe: dict[str, Any]) -> None:
    assert [(op, status) for op, status, _ in probe["outcomes"]] == [
        ("shrink", "done"),
        ("compact", "done"),
        ("compact", "done"),
        ("grow", "done"),
    ]
    assert probe["same_tokens"]

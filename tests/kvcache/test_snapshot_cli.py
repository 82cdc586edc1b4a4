"""``gpupool kv-snapshots``: the GC as the sidecar runs it (a real process), and ``show``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from policy import DEFAULT_POLICY, load_policy
from tests.harness.servers import free_port

pytestmark = pytest.mark.process

GPUPOOL = [sys.executable, "-m", "runtime.cli.app"]


def test_the_gc_sidecar_bounds_the_volume_and_serves_metrics(tmp_path: Path) -> None:
    policy = load_policy(DEFAULT_POLICY)
    workload = policy.workloads[0]
    capacity = workload.snapshot_volume.capacity_bytes
    big = capacity // 2  # three of them: over capacity by construction
    tier = tmp_path / "gpupool-kv-0123456789abcdef" / "b"
    tier.mkdir(parents=True)
    (tmp_path / "gpupool-kv-0123456789abcdef" / "gpupool-tier.json").write_text("{}")
    for i in range(3):
        with open(tier / f"{i:064x}.bin", "wb") as out:
            out.truncate(big)  # sparse: the GC counts st_size, as the volume's quota does
        os.utime(tier / f"{i:064x}.bin", (time.time() - 100 + i,) * 2)
    port = free_port()
    proc = subprocess.Popen(
        [
            *GPUPOOL,
            "kv-snapshots",
            "gc",
            "--root",
            str(tmp_path),
            "--capacity-bytes",
            str(capacity),
            "--policy",
            str(DEFAULT_POLICY),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"POD_NAME": "pod-a"},
    )
    try:
        text = ""
        deadline = time.monotonic() + 60
        while "gpupool_kv_tier_gc_last_pass_timestamp_seconds" not in text:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the GC never served a pass"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("gpupool_kv_tier_capacity_bytes", ())] == capacity
    assert samples[("gpupool_kv_tier_deleted_files_total", (("reason", "capacity"),))] == 2
    assert sorted(p.name for p in tier.iterdir()) == [f"{2:064x}.bin"]  # the newest stays


def test_a_capacity_of_nothing_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [*GPUPOOL, "kv-snapshots", "gc", "--root", str(tmp_path), "--capacity-bytes", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "--capacity-bytes: expected a capacity of more than 0 bytes, found 0" in done.stderr


def test_show_reports_the_tiers_and_deletes_nothing(tmp_path: Path) -> None:
    tier = tmp_path / "gpupool-kv-0123456789abcdef"
    (tier / "x").mkdir(parents=True)
    (tier / "gpupool-tier.json").write_text("{}")
    (tier / "x" / "a.bin").write_bytes(b"\0" * 10)
    done = subprocess.run(
        [*GPUPOOL, "kv-snapshots", "show", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["tiers"]["gpupool-kv-0123456789abcdef"]["files"] == 2
    assert report["tiers"]["gpupool-kv-0123456789abcdef"]["bytes"] == 12
    assert (tier / "x" / "a.bin").exists()

"""Against a live kind cluster (infra/kind/create.sh): the rendered bundle applies and schedules.

Skipped, with the reason, when kubectl is missing or the ``kind-gpupool`` context is not
reachable (no API server can run on the CI machines; see docs/infra.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from infra.inputs import load_inputs
from infra.output import write_documents
from infra.render import render_documents
from policy import DEFAULT_POLICY

CONTEXT = "kind-gpupool"


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--context", CONTEXT, "--request-timeout=5s", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _cluster_unreachable() -> str | None:
    if shutil.which("kubectl") is None:
        return "kubectl is not installed"
    probe = _kubectl("get", "--raw", "/readyz")
    if probe.returncode != 0:
        why = probe.stderr.strip()[:200]
        return f"no cluster at kube context {CONTEXT} (run infra/kind/create.sh): {why}"
    return None


UNREACHABLE = _cluster_unreachable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(UNREACHABLE is not None, reason=str(UNREACHABLE)),
]


def test_kind_workers_advertise_pools_and_gpus() -> None:
    nodes = json.loads(_kubectl("get", "nodes", "-l", "gpupool.io/pool", "-o", "json").stdout)
    pools = {n["metadata"]["labels"]["gpupool.io/pool"]: n for n in nodes["items"]}
    assert set(pools) == {"gpu-prod", "gpu-flex"}
    for node in pools.values():
        assert int(node["status"]["capacity"]["nvidia.com/gpu"]) > 0


def test_rendered_bundle_applies_server_side(tmp_path: Path) -> None:
    inputs = load_inputs(DEFAULT_POLICY)
    objects = [
        o
        for o in build_bundle(
            inputs.policy, stack=StackOptions("labels"), vllm_args=inputs.vllm_args
        )
        # prometheus-operator's CRDs are not part of the bare kind cluster
        if not o["apiVersion"].startswith("monitoring.coreos.com/")
    ]
    write_documents(tmp_path, render_documents(objects))
    applied = _kubectl("apply", "--server-side", "--field-manager=gpupool", "-k", str(tmp_path))
    assert applied.returncode == 0, applied.stderr
    flex = _kubectl("get", "node", "gpupool-worker2", "-o", "json")
    taints = json.loads(flex.stdout)["spec"].get("taints", [])
    assert {"key": "gpupool.io/pool", "value": "gpu-flex", "effect": "NoSchedule"} in taints
    pc = _kubectl(
        "get", "priorityclass", inputs.policy.priorities.idle_inference.name, "-o", "json"
    )
    assert json.loads(pc.stdout)["value"] == inputs.policy.priorities.idle_inference.value

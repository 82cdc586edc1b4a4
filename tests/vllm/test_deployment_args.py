"""One source: the flex Deployment's container args are exactly ``gpupool vllm-args`` output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from infra.inputs import load_inputs
from policy import DEFAULT_POLICY
from runtime.cli.app import app
from tests.harness.tiny_engine import TINY_POLICY


@pytest.mark.parametrize("policy_file", [DEFAULT_POLICY, TINY_POLICY], ids=["default", "tiny"])
def test_deployment_args_equal_vllm_args(policy_file: Path) -> None:
    inputs = load_inputs(policy_file)
    bundle = build_bundle(inputs.policy, stack=StackOptions("labels"), vllm_args=inputs.vllm_args)
    names = {w.name for w in inputs.policy.workloads}
    deployments = {
        o["metadata"]["name"]: o
        for o in bundle
        if o["kind"] == "Deployment" and o["metadata"]["name"] in names
    }
    assert set(deployments) == names
    for name, deployment in deployments.items():
        (container,) = [
            c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"
        ]
        result = CliRunner().invoke(
            app, ["vllm-args", "--json", "--policy", str(policy_file), "--workload", name]
        )
        assert result.exit_code == 0, result.output
        assert container["args"] == json.loads(result.stdout)
        # vLLM's start-up check reads it on a GPU only (docs/vllm.md)
        (workload,) = [w for w in inputs.policy.workloads if w.name == name]
        on_gpu = workload.attention_backend != "cpu"
        assert ("--gpu-memory-utilization" in container["args"]) == on_gpu

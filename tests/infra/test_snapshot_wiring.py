"""A flex pod with ``kv_preservation: filesystem``: the volume, the tier's import path, the GC."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy
from runtime.kvcache.in_vllm.plugin import ENABLE_ENV
from tests.harness.servers import free_port
from tests.infra.policies import explicit_args, policy_with

PRESERVING = {"kv_cache.kv_preservation": "filesystem", "workloads.0.kv_compaction": False}


def objects(policy: PoolPolicy) -> list[dict[str, Any]]:
    return build_bundle(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))  # type: ignore[arg-type]


def flex_pod(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (deployment,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    return deployment["spec"]["template"]["spec"]


def test_the_pod_mounts_the_volume_imports_the_tier_and_runs_the_gc() -> None:
    policy = policy_with(PRESERVING)
    workload = policy.workloads[0]
    objs = objects(policy)
    claims = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert [c["metadata"]["name"] for c in claims] == [f"{workload.name}-kv-snapshots"]
    pod = flex_pod(objs, workload.name)
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"vllm", "kv-snapshot-gc"}
    vllm, gc = containers["vllm"], containers["kv-snapshot-gc"]
    env = {e["name"]: e for e in vllm["env"]}
    assert env["PYTHONPATH"]["value"] == "/opt/gpupool/vllm-plugin"  # SnapshotTier's module
    assert ENABLE_ENV not in env  # the compaction plugin stays off
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    mount = workload.snapshot_volume.mount_path
    assert {"name": "kv-snapshots", "mountPath": mount} in vllm["volumeMounts"]
    assert {"name": "kv-snapshots", "mountPath": mount} in gc["volumeMounts"]
    assert gc["command"] == ["gpupool", "kv-snapshots", "gc"]
    args = dict(zip(gc["args"][::2], gc["args"][1::2], strict=True))
    assert args["--root"] == mount
    assert args["--capacity-bytes"] == str(workload.snapshot_volume.capacity_bytes)
    assert args["--listen"].endswith(f":{policy.kv_cache.compaction_sidecar_port}")
    assert [i["name"] for i in pod["initContainers"]] == ["gpupool-plugin"]
    volumes = {v["name"] for v in pod["volumes"]}
    assert {"kv-snapshots", "gpupool-policy", "gpupool-plugin"} <= volumes
    (netpol,) = [
        o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == workload.name
    ]
    ports = [p["port"] for rule in netpol["spec"]["ingress"] for p in rule["ports"]]
    assert "kv-metrics" in ports  # Prometheus scrapes the GC


def test_without_preservation_no_volume_is_claimed_or_mounted() -> None:
    policy = policy_with({"workloads.0.kv_compaction": False})
    objs = objects(policy)
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    pod = flex_pod(objs, policy.workloads[0].name)
    assert "kv-snapshots" not in {v["name"] for v in pod["volumes"]}
    assert [c["name"] for c in pod["containers"]] == ["vllm"]
    assert "initContainers" not in pod


@pytest.mark.parametrize(("seed", "expected"), [(None, None), (0, "0"), (1234, "1234")])
def test_the_hash_seed_reaches_vllm(seed: int | None, expected: str | None) -> None:
    policy = policy_with(PRESERVING | {"kv_cache.python_hash_seed": seed})
    (vllm,) = [
        c
        for c in flex_pod(objects(policy), policy.workloads[0].name)["containers"]
        if c["name"] == "vllm"
    ]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env.get("PYTHONHASHSEED") == expected


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_the_preserving_objects_are_valid_kubernetes(version: str) -> None:
    for obj in objects(policy_with(PRESERVING)):
        if not obj["apiVersion"].startswith(("karpenter.sh/", "monitoring.coreos.com/")):
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.process
def test_the_rendered_gc_runs_on_the_rendered_policy_config_map(tmp_path: Path) -> None:
    """The GC container's own command and arguments, with the ConfigMap it mounts (a policy
    without workloads), run one pass: the pod would start."""
    policy = policy_with(PRESERVING)
    objs = objects(policy)
    (config,) = [
        o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpupool-policy"
    ]
    (gc,) = [
        c
        for c in flex_pod(objs, policy.workloads[0].name)["containers"]
        if c["name"] == "kv-snapshot-gc"
    ]
    policy_dir = tmp_path / "policy"
    policy_dir.mkdir()
    for name, text in config["data"].items():
        (policy_dir / name).write_text(text)
    volume = tmp_path / "volume"
    volume.mkdir()
    args = list(gc["args"])
    args[args.index("--root") + 1] = str(volume)
    args[args.index("--policy") + 1] = str(policy_dir / "pool.yaml")
    args[args.index("--listen") + 1] = f"127.0.0.1:{free_port()}"
    assert gc["command"][0] == "gpupool"
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli.app", *gc["command"][1:], *args, "--passes", "1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"used_bytes": 0' in done.stderr

"""Every flex pod runs the KV compaction sidecar and loads the plugin; the switch removes both.

What the pod must satisfy comes from ``infra.builders.compaction_sidecar`` (same user for the 0600
socket, the plugin tree on ``PYTHONPATH``) and from Pod Security ``restricted``, which the
namespaces enforce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.builders.compaction_sidecar import (
    CONTROL_DIR,
    PLUGIN_TREE,
    PLUGIN_VOLUME,
    POLICY_CONFIGMAP,
    POLICY_DIR,
    POLICY_FILE,
    SOCKET_PATH,
    compaction_sidecar,
    compaction_volumes,
    plugin_installer,
    token_secret_name,
)
from infra.builders.meta import Manifest
from infra.builders.pod import NON_ROOT_UID
from infra.builders.policy_config import policy_text
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy, load_policy, parse_policy
from runtime.kvcache.in_vllm.plugin import ENABLE_ENV, SOCKET_ENV, TOKEN_FILE_ENV
from tests.infra.policies import edited, explicit_args, policy_with, two_workloads

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "infra" / "images" / "runtime.Dockerfile"
PLUGIN_ENV = {ENABLE_ENV, SOCKET_ENV, TOKEN_FILE_ENV, "PYTHONPATH", "VLLM_USE_V2_MODEL_RUNNER"}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
"""Volume types Pod Security ``restricted`` allows."""


def _bundle(policy: PoolPolicy) -> list[Manifest]:
    return build_bundle(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))


def _pod(objs: list[Manifest], name: str) -> Manifest:
    (dep,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    pod: Manifest = dep["spec"]["template"]["spec"]
    return pod


def _container(pod: Manifest, name: str) -> Manifest:
    (found,) = [c for c in pod["containers"] if c["name"] == name]
    return found


def _env(container: Manifest) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _mounts(container: Manifest) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container["volumeMounts"]}


def restricted_violations(pod: Manifest) -> list[str]:
    """What Pod Security ``restricted`` (v1.30 rules) would refuse in ``pod``."""
    found = []
    pod_sc = pod.get("securityContext", {})
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: allowPrivilegeEscalation must be false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            found.append(f"{c['name']}: capabilities must drop ALL")
        if sc.get("capabilities", {}).get("add", []) not in ([], ["NET_BIND_SERVICE"]):
            found.append(f"{c['name']}: only NET_BIND_SERVICE may be added")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            found.append(f"{c['name']}: runAsNonRoot must be true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            found.append(f"{c['name']}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{c['name']}: seccompProfile must be RuntimeDefault")
        if sc.get("privileged"):
            found.append(f"{c['name']}: privileged")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)} not allowed")
    return found


def test_every_flex_pod_runs_the_sidecar_and_loads_the_plugin() -> None:
    policy = two_workloads()
    objs = _bundle(policy)
    kv = policy.kv_cache
    for workload in policy.workloads:
        pod = _pod(objs, workload.name)
        assert [c["name"] for c in pod["containers"]] == ["vllm", "kv-compaction"]
        sidecar = _container(pod, "kv-compaction")
        assert sidecar == compaction_sidecar(policy, workload)
        assert sidecar["image"] == policy.cluster.runtime_image
        assert sidecar["command"] == ["gpupool", "kv-sidecar", "run"]
        args = dict(zip(sidecar["args"][::2], sidecar["args"][1::2], strict=True))
        assert args == {
            "--policy": f"{POLICY_DIR}/{POLICY_FILE}",
            "--metrics-url": f"http://127.0.0.1:{workload.port}/metrics",
            "--socket": SOCKET_PATH,
            "--token-file": _env(_container(pod, "vllm"))[TOKEN_FILE_ENV],
            "--listen": f"0.0.0.0:{kv.compaction_sidecar_port}",
            "--workload": workload.name,
            "--compaction-token-file": f"/etc/gpupool/compaction-token/"
            f"{policy.tuner.compaction_token_key}",
        }
        (port,) = sidecar["ports"]
        assert (port["name"], port["containerPort"]) == ("kv-metrics", kv.compaction_sidecar_port)
        assert sidecar["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "kv-metrics"}
        # a sidecar that is not ready must never take the serving pod out of its Service
        assert "readinessProbe" not in sidecar and "startupProbe" not in sidecar

        # volumes: every compaction volume declared once; every mount names a declared volume
        names = [v["name"] for v in pod["volumes"]]
        assert len(names) == len(set(names))
        for volume in compaction_volumes(policy, workload):
            assert volume in pod["volumes"]
        secret = next(v for v in pod["volumes"] if "secret" in v)["secret"]
        assert secret["secretName"] == token_secret_name(workload) == f"{workload.name}-kv-token"
        for c in [*pod["initContainers"], *pod["containers"]]:
            assert set(_mounts(c)) <= set(names), c["name"]

        # the plugin: an initContainer copies the tree, vLLM mounts it and imports from it
        assert pod["initContainers"] == [plugin_installer(policy)]
        (init,) = pod["initContainers"]
        assert init["image"] == sidecar["image"]  # plugin and worker: one gpupool version
        assert init["command"][:3] == ["cp", "-R", f"{PLUGIN_TREE}/."]
        assert _mounts(init)[PLUGIN_VOLUME]["mountPath"] == init["command"][-1]
        vllm = _container(pod, "vllm")
        env = _env(vllm)
        assert env["PYTHONPATH"] == PLUGIN_TREE
        assert (env[ENABLE_ENV], env["VLLM_USE_V2_MODEL_RUNNER"]) == ("1", "0")
        assert env[SOCKET_ENV] == SOCKET_PATH
        plugin_mount = _mounts(vllm)[PLUGIN_VOLUME]
        assert (plugin_mount["mountPath"], plugin_mount["readOnly"]) == (PLUGIN_TREE, True)
        # both ends of the socket see the same directory
        for c in (vllm, sidecar):
            assert any(m["mountPath"] == CONTROL_DIR for m in c["volumeMounts"]), c["name"]


def test_one_user_for_every_container_and_pod_security_restricted() -> None:
    policy = two_workloads()
    objs = _bundle(policy)
    for workload in policy.workloads:
        pod = _pod(objs, workload.name)
        assert pod["securityContext"]["runAsUser"] == NON_ROOT_UID
        for c in [*pod["initContainers"], *pod["containers"]]:
            assert "runAsUser" not in c.get("securityContext", {}), c["name"]
        assert restricted_violations(pod) == []
    for dep in (o for o in objs if o["kind"] == "Deployment"):
        assert restricted_violations(dep["spec"]["template"]["spec"]) == [], dep["metadata"]
    for ns in (o for o in objs if o["kind"] == "Namespace"):
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_restricted_check_has_teeth() -> None:
    pod = _pod(_bundle(load_policy()), load_policy().workloads[0].name)
    sidecar = _container(pod, "kv-compaction")
    del sidecar["securityContext"]["capabilities"]
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert restricted_violations(pod) == [
        "kv-compaction: capabilities must drop ALL",
        "volume host: ['hostPath'] not allowed",
    ]


@pytest.mark.parametrize("policy", [load_policy(), two_workloads()], ids=["default", "two"])
def test_policy_config_map_loads_back_into_an_equal_policy(
    policy: PoolPolicy, tmp_path: Path
) -> None:
    objs = _bundle(policy)
    (config,) = [
        o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == POLICY_CONFIGMAP
    ]
    assert config["metadata"]["namespace"] == policy.cluster.flex_namespace
    path = tmp_path / POLICY_FILE
    path.write_text(config["data"][POLICY_FILE])
    loaded = load_policy(path)
    # everything but the workloads list (no trigger reads it; the ConfigMap stays small)
    assert loaded == policy.model_copy(update={"workloads": []})
    assert (loaded.kv_cache, loaded.alerting) == (policy.kv_cache, policy.alerting)
    assert policy_text(loaded) == config["data"][POLICY_FILE]
    # the sidecar reads exactly this file: the ConfigMap's volume mounted at POLICY_DIR
    pod = _pod(objs, policy.workloads[0].name)
    volume = next(v for v in pod["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == POLICY_CONFIGMAP
    mount = _mounts(_container(pod, "kv-compaction"))[volume["name"]]
    assert (mount["mountPath"], mount["readOnly"]) == (POLICY_DIR, True)


def test_switch_off_removes_sidecar_plugin_and_policy_copy() -> None:
    policy = policy_with({"workloads.0.kv_compaction": False})
    objs = _bundle(policy)
    pod = _pod(objs, policy.workloads[0].name)
    assert [c["name"] for c in pod["containers"]] == ["vllm"]
    assert "initContainers" not in pod
    compaction_names = {v["name"] for v in compaction_volumes(policy, policy.workloads[0])}
    assert not compaction_names & {v["name"] for v in pod["volumes"]}
    (vllm,) = pod["containers"]
    assert not PLUGIN_ENV & set(_env(vllm))
    assert not compaction_names & set(_mounts(vllm))
    assert not [o for o in objs if o["metadata"]["name"] == POLICY_CONFIGMAP]
    assert restricted_violations(pod) == []


def _with_second_workload(*, kv_compaction: bool) -> PoolPolicy:
    """The default policy plus a second workload ``plain-flex``."""
    doc = edited()
    second = dict(doc["workloads"][0], name="plain-flex", port=8001, kv_compaction=kv_compaction)
    doc["workloads"].append(second)
    return parse_policy(doc)


def test_switch_is_per_workload() -> None:
    policy = _with_second_workload(kv_compaction=False)
    objs = _bundle(policy)
    on, off = (_pod(objs, w.name) for w in policy.workloads)
    assert [c["name"] for c in on["containers"]] == ["vllm", "kv-compaction"]
    assert [c["name"] for c in off["containers"]] == ["vllm"]
    assert [o["kind"] for o in objs if o["metadata"]["name"] == POLICY_CONFIGMAP] == ["ConfigMap"]


def test_policy_copy_does_not_grow_with_the_workloads() -> None:
    def text(policy: PoolPolicy) -> str:
        (config,) = [o for o in _bundle(policy) if o["metadata"]["name"] == POLICY_CONFIGMAP]
        return str(config["data"][POLICY_FILE])

    assert text(_with_second_workload(kv_compaction=True)) == text(load_policy())
    assert "workloads: []" in text(load_policy())


def test_runtime_image_carries_the_plugin_tree_where_the_pod_copies_it_from() -> None:
    """The Dockerfile and the initContainer agree on the tree's path and the non-root user."""
    text = DOCKERFILE.read_text()
    assert "FROM python:3.11-slim" in text
    assert f"--no-deps --target {PLUGIN_TREE} ." in text
    assert f"USER {NON_ROOT_UID}" in text
    assert "git" in text  # the tuner clones the policy repository

"""Security and first-run safety of the bundle: no API tokens or Roles nobody uses, Secrets as
files only, NetworkPolicies in front of every port, pinned images, pull secrets, the model
cache, and the objects no sync or destroy may delete."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from infra.builders.meta import RETAIN_ANNOTATIONS, RETAINED_KINDS, Manifest
from infra.builders.network import NAMESPACE_NAME_LABEL
from infra.builders.runtime_components import token_secrets, tuner_command
from infra.builders.stack_options import StackOptions
from infra.builders.vllm_container import HF_TOKEN_DIR, MODEL_CACHE_PATH
from infra.bundle import build_bundle
from infra.render import render_documents
from policy import PolicyError, PoolPolicy, load_policy
from policy.loader import policy_warnings
from runtime.cli.app import app
from runtime.cli.secret_files import optional_secret
from tests.infra.policies import edited, explicit_args, policy_with, two_workloads
from tests.infra.test_cli import write_policy

DIGEST = "sha256:" + "0123456789abcdef" * 4
PINNED = {
    "cluster.runtime_image": f"registry.example.invalid:5000/gpupool/gpupool:0.1.0@{DIGEST}",
    "workloads.0.image": f"vllm/vllm-openai:v0.32.0@{DIGEST}",
}
POLICIES: dict[str, Callable[[], PoolPolicy]] = {
    "default": load_policy,
    "two": two_workloads,
    "no-compaction": lambda: policy_with({"workloads.0.kv_compaction": False}),
    "hardened": lambda: policy_with(
        {
            **PINNED,
            "cluster.image_pull_secrets": ["registry-credentials"],
            "network": {"flex_client_namespaces": ["gateway"], "alertmanager_namespace": "alerts"},
            "workloads.0.hf_token_secret": "hf-token",
            "workloads.0.model_cache": {"size": "300Gi", "storage_class": "standard-rwx"},
            "kv_cache.kv_preservation": "filesystem",  # the snapshot claim, GC and tier
            "workloads.0.kv_compaction": False,
        }
    ),
}


def _bundle(policy: PoolPolicy, target: str = "labels") -> list[Manifest]:
    return build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]


def _pods(objs: list[Manifest]) -> dict[str, Manifest]:
    """Deployment name -> pod template."""
    return {o["metadata"]["name"]: o["spec"]["template"] for o in objs if o["kind"] == "Deployment"}


def _containers(pod: Manifest) -> list[Manifest]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def _one(objs: list[Manifest], kind: str, name: str) -> Manifest:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@pytest.fixture(params=list(POLICIES), ids=list(POLICIES))
def policy(request: pytest.FixtureRequest) -> PoolPolicy:
    return POLICIES[request.param]()


def test_no_pod_holds_an_api_token_and_no_role_exists(policy: PoolPolicy) -> None:
    """Neither vLLM, the compaction sidecar nor the tuner calls the Kubernetes API."""
    objs = _bundle(policy)
    accounts = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceAccount"}
    for name, pod in _pods(objs).items():
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False, name
        account = accounts[spec["serviceAccountName"]]
        assert account["automountServiceAccountToken"] is False, name
        assert (
            account["metadata"]["namespace"]
            == _one(objs, "Deployment", name)["metadata"]["namespace"]
        )
    rbac = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    assert not [o["kind"] for o in objs if o["kind"] in rbac]


def test_secrets_reach_containers_as_files_only(policy: PoolPolicy) -> None:
    """No ``secretKeyRef`` / ``secretRef`` anywhere; every file the tuner is told to read is
    the referenced key of a Secret volume mounted where the flag points."""
    objs = _bundle(policy)
    for name, pod in _pods(objs).items():
        for container in _containers(pod):
            for env in container.get("env", []):
                assert "secretKeyRef" not in env.get("valueFrom", {}), (name, env["name"])
            assert not any("secretRef" in e for e in container.get("envFrom", [])), name
    tuner = _pods(objs)["gpupool-tuner"]["spec"]
    (container,) = tuner["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"] for v in tuner["volumes"] if "secret" in v}
    command = container["command"]
    settings = policy.tuner
    flags = {
        "--token-file": (settings.webhook_token_secret, settings.webhook_token_key),
        "--compaction-token-file": (
            settings.compaction_token_secret,
            settings.compaction_token_key,
        ),
    }
    if settings.forge_repo is not None:
        flags["--forge-token-file"] = (settings.forge_token_secret, settings.forge_token_key)
    for flag, (secret, key) in flags.items():
        directory, _, file = command[command.index(flag) + 1].rpartition("/")
        assert file == key, flag
        assert secrets[mounts[directory]]["secretName"] == secret, flag
    assert command == tuner_command(policy)
    optional = {name for volume, name, _, opt in token_secrets(settings) if opt}
    assert optional == {settings.compaction_token_secret}


def test_forge_token_is_a_file_when_pull_requests_are_on() -> None:
    policy = policy_with({"tuner.forge_repo": "acme/policy"})
    (container,) = _pods(_bundle(policy))["gpupool-tuner"]["spec"]["containers"]
    flag = container["command"].index("--forge-token-file")
    assert container["command"][flag + 1] == "/etc/gpupool/forge-token/token"
    assert "GITHUB_TOKEN" not in {e["name"] for e in container["env"]}


@pytest.mark.process
def test_the_hugging_face_token_is_a_file_huggingface_hub_reads(tmp_path: Path) -> None:
    """HF_TOKEN_PATH names the mounted key; huggingface_hub itself (run here) reads it."""
    policy = POLICIES["hardened"]()
    pod = _pods(_bundle(policy))["llama-8b-flex"]["spec"]
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "hf-token"]
    assert volume["secret"]["secretName"] == "hf-token"
    (mount,) = [m for m in vllm["volumeMounts"] if m["name"] == "hf-token"]
    assert (mount["mountPath"], mount["readOnly"]) == (HF_TOKEN_DIR, True)
    assert env["HF_TOKEN_PATH"] == f"{HF_TOKEN_DIR}/token"

    token_file = tmp_path / "token"
    token_file.write_text("hf_test_only_token\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    read = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub; print(huggingface_hub.get_token())"],
        env={**clean, "HF_HOME": str(tmp_path / "home"), "HF_TOKEN_PATH": str(token_file)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert read.stdout.strip() == "hf_test_only_token"
    default = _pods(_bundle(load_policy()))["llama-8b-flex"]["spec"]
    assert not any(v["name"] == "hf-token" for v in default["volumes"])


def test_every_pod_pulls_with_the_configured_secrets(policy: PoolPolicy) -> None:
    expected = [{"name": n} for n in policy.cluster.image_pull_secrets]
    for name, pod in _pods(_bundle(policy)).items():
        assert pod["spec"].get("imagePullSecrets", []) == expected, name


def test_model_cache_is_bounded_per_pod_or_a_shared_claim() -> None:
    default = load_policy()
    pod = _pods(_bundle(default))["llama-8b-flex"]["spec"]
    (models,) = [v for v in pod["volumes"] if v["name"] == "models"]
    assert models == {"name": "models", "emptyDir": {"sizeLimit": "200Gi"}}
    for volume in pod["volumes"]:
        if "emptyDir" in volume and volume["emptyDir"].get("medium") != "Memory":
            assert "sizeLimit" in volume["emptyDir"], volume["name"]
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env["HF_HOME"].startswith(MODEL_CACHE_PATH + "/")
    assert {"name": "models", "mountPath": MODEL_CACHE_PATH} in vllm["volumeMounts"]

    shared = POLICIES["hardened"]()
    objs = _bundle(shared)
    claim = _one(objs, "PersistentVolumeClaim", "llama-8b-flex-model-cache")
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "standard-rwx",
        "resources": {"requests": {"storage": "300Gi"}},
    }
    pod = _pods(objs)["llama-8b-flex"]["spec"]
    (models,) = [v for v in pod["volumes"] if v["name"] == "models"]
    assert models["persistentVolumeClaim"] == {"claimName": "llama-8b-flex-model-cache"}


def _admits(rule: Manifest, namespace: str, labels: dict[str, str], own: str) -> bool:
    """Whether a NetworkPolicy ingress rule admits a pod (namespace, labels); ``own`` is the
    policy's namespace (a peer without namespaceSelector means it)."""
    for peer in rule["from"]:
        ns_sel = peer.get("namespaceSelector")
        ns_ok = (
            namespace == own
            if ns_sel is None
            else ns_sel["matchLabels"] == {NAMESPACE_NAME_LABEL: namespace}
        )
        pods = peer.get("podSelector", {}).get("matchLabels", {})
        if ns_ok and pods.items() <= labels.items():
            return True
    return False


def test_every_open_port_admits_only_its_clients(policy: PoolPolicy) -> None:
    objs = _bundle(policy)
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    prometheus = (policy.network.monitoring_namespace, policy.network.prometheus_pod_labels)
    alertmanager = (
        policy.network.alertmanager_home,
        policy.network.alertmanager_pod_labels,
    )
    tuner_pod = _pods(objs)["gpupool-tuner"]["metadata"]["labels"]
    stranger = ("default", {"app": "curl"})
    for name, pod in _pods(objs).items():
        namespace = _one(objs, "Deployment", name)["metadata"]["namespace"]
        (np,) = [
            p
            for p in policies
            if p["metadata"]["namespace"] == namespace
            and p["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        ]
        assert np["spec"]["policyTypes"] == ["Ingress"]
        rules = {r["ports"][0]["port"]: r for r in np["spec"]["ingress"]}
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        compacts = any(c["name"] == "kv-compaction" for c in pod["spec"]["containers"])
        assert set(rules) == ports, name  # every listening port has exactly its rule
        for port, rule in rules.items():
            allowed = {
                "http": [prometheus, (namespace, {})]
                + [(ns, {}) for ns in policy.network.flex_client_namespaces]
                if name != "gpupool-tuner"
                else [alertmanager],  # the webhook: Alertmanager only
                # /healthz and /metrics (no token): Prometheus only, the kubelet from the node
                "ops": [prometheus],
                # the tuner posts compaction requests; a snapshot GC serves Prometheus only
                "kv-metrics": [prometheus]
                + [(policy.cluster.system_namespace, tuner_pod)] * compacts,
            }[port]
            if name == "gpupool-tuner":  # neither client reaches the other's port
                refused = {"http": prometheus, "ops": alertmanager}[port]
                assert not _admits(rule, *refused, namespace), (name, port)
            for ns, labels in allowed:
                assert _admits(rule, ns, labels, namespace), (name, port, ns)
                if labels:  # only those pods of that namespace
                    assert not _admits(rule, ns, {"app": "other"}, namespace), (name, port, ns)
            assert not _admits(rule, *stranger, namespace), (name, port)
            if name == "gpupool-tuner" or port == "kv-metrics":
                # not even a pod of the same namespace: only the named clients
                assert not _admits(rule, namespace, {"app": "other"}, namespace), (name, port)
            if port == "kv-metrics" and not compacts:
                assert not _admits(rule, policy.cluster.system_namespace, tuner_pod, namespace)


def test_images_may_be_pinned_by_digest_and_tags_warn() -> None:
    assert [path for path, _ in policy_warnings_of(load_policy())] == [
        "cluster.runtime_image",
        "workloads.0.image",
    ]
    pinned = policy_with(PINNED)
    assert policy_warnings_of(pinned) == []
    objs = _bundle(pinned)
    images = {c["image"] for pod in _pods(objs).values() for c in _containers(pod)}
    assert images == set(PINNED.values())


def policy_warnings_of(policy: PoolPolicy) -> list[tuple[str, str]]:
    """The image warnings among ``validate``'s warnings, as ``(path, message)``."""
    return [
        (p.path, p.message)
        for p in policy_warnings(policy)
        if p.path.endswith("image") and "by tag only" in p.message
    ]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (f"vllm/vllm-openai@sha256:{'0' * 63}", "sha256: and 64 lower-case hex digits"),
        (f"vllm/vllm-openai@sha256:{'A' * 64}", "sha256: and 64 lower-case hex digits"),
        (f"vllm/vllm-openai@md5:{'0' * 32}", "sha256: and 64 lower-case hex digits"),
        ("Vllm/Vllm-OpenAI:v0.32.0", "expected an image reference"),
        ("vllm/vllm-openai:v0.32.0 ", "expected an image reference"),
        ("vllm/vllm-openai::v0.32.0", "expected an image reference"),
        ("", "expected an image reference"),
    ],
)
def test_a_bad_image_is_a_located_error_and_nothing_is_rendered(
    tmp_path: Path, image: str, expected: str
) -> None:
    bad = write_policy(tmp_path, edited({"cluster.runtime_image": image}))
    lines = bad.read_text().splitlines()
    (line,) = [i + 1 for i, t in enumerate(lines) if t.startswith("  runtime_image:")]
    with pytest.raises(PolicyError) as caught:
        load_policy(bad)
    (problem,) = caught.value.problems
    assert (problem.file, problem.line, problem.path) == (str(bad), line, "cluster.runtime_image")
    assert expected in problem.message
    out = tmp_path / "build"
    result = CliRunner().invoke(app, ["render", str(bad), "--out", str(out)])
    assert result.exit_code == 1
    assert f"{bad}:{line}: cluster.runtime_image: " in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_namespaces_and_claims_survive_any_sync_or_delete() -> None:
    """Argo CD (Prune=false, Delete=false) and Flux (prune: disabled) keep them, in the
    rendered YAML too; the other objects of gpupool's namespaces follow the policy."""
    policy = POLICIES["hardened"]()
    objs = _bundle(policy)
    kept = {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in RETAINED_KINDS}
    assert kept == {
        ("Namespace", policy.cluster.flex_namespace),
        ("Namespace", policy.cluster.system_namespace),
        ("PersistentVolumeClaim", "llama-8b-flex-kv-snapshots"),
        ("PersistentVolumeClaim", "llama-8b-flex-model-cache"),
    }
    own = {policy.cluster.flex_namespace, policy.cluster.system_namespace}
    yaml = YAML(typ="safe")
    documents = render_documents(objs)
    for obj in objs:
        annotations = obj["metadata"].get("annotations", {})
        if obj["kind"] in RETAINED_KINDS:
            assert annotations.items() >= RETAIN_ANNOTATIONS.items(), obj["metadata"]["name"]
        elif obj["metadata"].get("namespace") in own:
            assert not set(annotations) & set(RETAIN_ANNOTATIONS), obj["metadata"]["name"]
    rendered: Any = yaml.load(documents[f"_cluster/namespace-{policy.cluster.flex_namespace}.yaml"])
    assert rendered["metadata"]["annotations"] == {
        "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
        "kustomize.toolkit.fluxcd.io/prune": "disabled",
    }
    claim: Any = yaml.load(
        documents[
            f"{policy.cluster.flex_namespace}/persistentvolumeclaim-llama-8b-flex-kv-snapshots.yaml"
        ]
    )
    assert claim["metadata"]["annotations"] == rendered["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "--forge-token-file {path}: "), ("\n", "--open-pr needs a GitHub token")],
    ids=["missing-file", "empty-file"],
)
def test_the_tuner_reads_the_forge_token_file_before_any_side_effect(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "forge-token" / "token"
    if content is not None:
        path.parent.mkdir()
        path.write_text(content)
    args = ["tune", "--prometheus", "http://127.0.0.1:9", "--repo", str(tmp_path), "--once"]
    args += ["--open-pr", "--forge-repo", "acme/policy", "--forge-token-file", str(path)]
    result = CliRunner().invoke(app, args, env={"GITHUB_TOKEN": "from-env-unused"})
    assert result.exit_code == 1
    assert expected.format(path=path) in result.output
    assert "Traceback" not in result.output


def test_the_optional_compaction_token_may_appear_after_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing file is no token (its Secret not created yet); once the kubelet writes it,
    the next read returns it; without a file flag the environment still works."""
    path = tmp_path / "compaction-token" / "token"
    env = "GPUPOOL_TEST_COMPACTION_TOKEN"
    assert optional_secret("--compaction-token-file", path, env) is None
    path.parent.mkdir()
    path.write_text("s3cret\n")
    assert optional_secret("--compaction-token-file", path, env) == "s3cret"
    monkeypatch.setenv(env, "from-env")
    assert optional_secret("--compaction-token-file", None, env) == "from-env"


@pytest.mark.parametrize(
    ("labels", "found", "expected"),
    [
        ({"app.kubernetes.io/name": "bad value!"}, "bad value!", "expected a label value"),
        ({"Bad Key": "prometheus"}, "Bad Key", "expected a label key"),
    ],
)
def test_a_bad_peer_label_is_a_located_error(
    tmp_path: Path, labels: dict[str, str], found: str, expected: str
) -> None:
    """The NetworkPolicy's pod selector would be refused by the API server: refused here."""
    path = write_policy(tmp_path, edited({"network": {"prometheus_pod_labels": labels}}))
    (line,) = [i + 1 for i, t in enumerate(path.read_text().splitlines()) if found in t]
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    (problem,) = caught.value.problems
    assert (problem.file, problem.line) == (str(path), line)
    assert problem.path.startswith("network.prometheus_pod_labels.")
    assert expected in problem.message and repr(found) in problem.message

"""The Pulumi program under Pulumi's mocks registers exactly the rendered object set.

Pulumi's mock contract (``pulumi.runtime.set_mocks``): set the mocks before the program
module is imported; ``@pulumi.runtime.test`` functions return an Output that the decorator
awaits. The recorder keeps every registration.
"""

from __future__ import annotations

import runpy
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pulumi
import pytest
from pulumi.runtime.mocks import MockMonitor
from ruamel.yaml import YAML


class Recorder(pulumi.runtime.Mocks):
    """Keeps (type token, logical name, inputs) of every resource the program registers, and
    (through ``RecordingMonitor``) the names registered with ``retain_on_delete``."""

    def __init__(self) -> None:
        self.registered: list[tuple[str, str, dict[str, Any]]] = []
        self.retained: set[tuple[str, str]] = set()

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.registered.append((args.typ, args.name, dict(args.inputs)))
        return f"{args.name}-id", dict(args.inputs)

    def call(
        self, args: pulumi.runtime.MockCallArgs
    ) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


class RecordingMonitor(MockMonitor):
    """Pulumi's mock monitor, noting the resource options mocks do not see."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__(recorder)
        self.recorder = recorder

    def RegisterResource(self, request: Any) -> Any:
        if request.retainOnDelete:
            self.recorder.retained.add((request.type, request.name))
        return super().RegisterResource(request)  # type: ignore[no-untyped-call]


F = TypeVar("F", bound=Callable[..., Any])


def pulumi_test(fn: F) -> F:
    """``pulumi.runtime.test`` with its type kept (the decorator itself is untyped)."""
    return cast(F, pulumi.runtime.test(fn))  # type: ignore[no-untyped-call]


RECORDER = Recorder()
pulumi.runtime.set_mocks(RECORDER, preview=False, monitor=RecordingMonitor(RECORDER))

from infra.builders.meta import RETAINED_KINDS, Manifest  # noqa: E402 (after set_mocks)
from infra.builders.stack_options import StackOptions  # noqa: E402
from infra.bundle import (  # noqa: E402
    INFERENCE_WORKLOAD,
    DuplicateObject,
    ObjectGroup,
    build_bundle,
    build_groups,
    check_unique,
)
from infra.program import (  # noqa: E402
    PROJECT_ROOT,
    InferenceWorkload,
    StackSettings,
    declare_groups,
    read_settings,
    run,
)
from infra.render import KUSTOMIZATION, render_documents  # noqa: E402
from policy import PoolPolicy, load_policy  # noqa: E402
from tests.infra.policies import explicit_args, two_workloads  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_recorder() -> Recorder:
    """Other test modules may install their own mocks: reinstall ours, emptied, per test."""
    RECORDER.registered.clear()
    RECORDER.retained.clear()
    pulumi.runtime.set_mocks(RECORDER, preview=False, monitor=RecordingMonitor(RECORDER))
    return RECORDER


def token(obj: Manifest) -> str:
    """The pulumi-kubernetes type token an object must be registered under."""
    api = obj["apiVersion"] if "/" in obj["apiVersion"] else f"core/{obj['apiVersion']}"
    kind = f"{obj['kind']}Patch" if obj["kind"] == "Node" else obj["kind"]
    return f"kubernetes:{api}:{kind}"


def identity(typ: str, inputs: dict[str, Any]) -> tuple[str, str | None, str]:
    return typ, inputs["metadata"].get("namespace"), inputs["metadata"]["name"]


def kubernetes_registrations() -> dict[tuple[str, str | None, str], dict[str, Any]]:
    found = {}
    for typ, _name, inputs in RECORDER.registered:
        if typ.startswith("kubernetes:"):
            key = identity(typ, inputs)
            assert key not in found, f"registered twice: {key}"
            found[key] = inputs
    return found


SECRET_SIG = ("4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270")
"""Pulumi's marker of a secret value in serialized inputs (``pulumi.runtime.rpc``)."""


def unsecret(value: Any) -> tuple[Any, bool]:
    """The value with Pulumi secret markers removed, and whether any was found."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG[0]) == SECRET_SIG[1]:
            return unsecret(value["value"])[0], True
        pairs = {k: unsecret(v) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(s for _, s in pairs.values())
    if isinstance(value, list):
        items = [unsecret(v) for v in value]
        return [v for v, _ in items], any(s for _, s in items)
    return value, False


def rendered_objects(objects: list[Manifest]) -> list[Manifest]:
    """What ``gpupool render`` writes for ``objects``, parsed back (kustomization aside)."""
    documents = render_documents(objects)
    return [
        YAML(typ="safe").load(text) for name, text in documents.items() if name != KUSTOMIZATION
    ]


def check_registered_equals_bundle(policy: PoolPolicy, target: str) -> None:
    objects = build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]
    registered = kubernetes_registrations()
    rendered = Counter(identity(token(o), o) for o in rendered_objects(objects))
    registrations = Counter(
        identity(typ, inputs)
        for typ, _, inputs in RECORDER.registered
        if typ.startswith("kubernetes:")
    )
    # one multiset, each object once: what GitOps applies is what Pulumi declares
    assert registrations == rendered
    assert set(rendered.values()) == {1}
    expected = {identity(token(o), o): o for o in objects}
    assert set(registered) == set(expected)
    assert {(t, n) for t, n, _ in RECORDER.registered if t.startswith("kubernetes:")} >= (
        RECORDER.retained
    )
    retained = {identity(t, i) for t, n, i in RECORDER.registered if (t, n) in RECORDER.retained}
    assert retained == {k for k, o in expected.items() if o["kind"] in RETAINED_KINDS}
    # The default claims no volume (no KV preservation, a per-pod model cache); the line above
    # retains every RETAINED_KINDS object, claims included where a policy renders them (their
    # rendered annotations: tests/infra/test_security.py).
    assert {k[0] for k in retained} == {"kubernetes:core/v1:Namespace"}
    for key, obj in expected.items():
        fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        got, secret = unsecret(
            {k: v for k, v in registered[key].items() if k not in ("apiVersion", "kind")}
        )
        assert got == fields, key
        # pulumi-kubernetes keeps Secret payloads out of plain state
        assert secret == (obj["kind"] == "Secret"), key


def _declare(policy: PoolPolicy, target: str) -> pulumi.Output[list[str]]:
    groups = build_groups(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]
    components = declare_groups(groups)
    urns = [r.urn for c in components for r in c.resources.values()]
    return pulumi.Output.all(*urns)


@pytest.mark.parametrize("target", ["labels", "karpenter"])
@pulumi_test
def test_program_registers_exactly_the_bundle(target: str) -> pulumi.Output[None]:
    policy = two_workloads()
    return _declare(policy, target).apply(lambda _: check_registered_equals_bundle(policy, target))


def _object(kind: str, name: str, namespace: str | None) -> Manifest:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "data": {}}


@pytest.mark.parametrize(
    ("first", "second", "what"),
    [
        (("monitoring", "a", "ns1"), ("runtime", "a", "ns1"), "are the same object"),
        (("monitoring", "a", "ns1"), ("monitoring", "a", "ns2"), "are the same Pulumi URN"),
    ],
    ids=["same-kind-namespace-name", "same-logical-name-in-one-component-type"],
)
def test_two_objects_with_one_identity_cannot_be_declared(
    first: tuple[str, str, str], second: tuple[str, str, str], what: str
) -> None:
    """The bundle refuses what the API server would merge (one kind, namespace and name) and
    what Pulumi would refuse (one URN: component type, resource type, logical name); the
    program declares nothing then."""
    groups = [
        ObjectGroup(f"gpupool:test:{group}", f"{group}-{i}", (_object("ConfigMap", name, ns),))
        for i, (group, name, ns) in enumerate((first, second))
    ]
    with pytest.raises(DuplicateObject, match=what) as caught:
        check_unique(groups)
    assert str(caught.value).count("ConfigMap") == 2
    with pytest.raises(DuplicateObject, match=what):
        declare_groups(groups)
    assert RECORDER.registered == []
    # a different kind or namespace (in different components) is a different object
    check_unique(
        [groups[0], ObjectGroup("gpupool:test:other", "x", (_object("Secret", "a", "ns1"),))]
    )


def test_builders_cannot_produce_a_duplicate() -> None:
    """A workload whose Service would take the name of another's headless Service: the
    policy refuses it, and the bundle refuses it even without that check."""
    policy = two_workloads()
    clash = policy.workloads[1].model_copy(
        update={"name": f"{policy.workloads[0].name}-kv-compaction"}
    )
    unchecked = policy.model_copy(update={"workloads": [policy.workloads[0], clash]})
    with pytest.raises(DuplicateObject, match="Service gpupool-flex/llama-8b-flex-kv-compaction"):
        build_bundle(unchecked, stack=StackOptions("labels"), vllm_args=explicit_args(unchecked))


@pulumi_test
def test_workloads_are_components_with_named_children() -> pulumi.Output[None]:
    policy = two_workloads()
    groups = build_groups(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))
    components = declare_groups(groups)
    workloads = {
        c.group_name: c for c in components if c.group_name in {"llama-8b-flex", "qwen-14b-flex"}
    }

    def check(args: list[Any]) -> None:
        urns, url = args[:-1], args[-1]
        for suffix, typ in (
            ("pdb", "kubernetes:policy/v1:PodDisruptionBudget"),
            ("hpa", "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"),
            ("deployment", "kubernetes:apps/v1:Deployment"),
            ("svc", "kubernetes:core/v1:Service"),
        ):
            assert any(
                u.endswith(f"{INFERENCE_WORKLOAD}${typ}::qwen-14b-flex-{suffix}") for u in urns
            ), suffix
        assert url == "http://qwen-14b-flex.gpupool-flex.svc:8001"
        components_registered = [
            (t, n) for t, n, _ in RECORDER.registered if not t.startswith("kubernetes:")
        ]
        assert (INFERENCE_WORKLOAD, "qwen-14b-flex") in components_registered
        assert ("gpupool:cluster:Scheduling", "scheduling") in components_registered

    qwen = workloads["qwen-14b-flex"]
    assert isinstance(qwen, InferenceWorkload)
    return pulumi.Output.all(*[r.urn for r in qwen.resources.values()], qwen.service_url).apply(
        check
    )


@pytest.mark.parametrize("target", ["labels", "karpenter"])
@pulumi_test
def test_key_fields_as_registered(target: str) -> pulumi.Output[None]:
    policy = load_policy()

    def check(_: Any) -> None:
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for typ, _name, inputs in RECORDER.registered:
            by_kind.setdefault(typ.rsplit(":", 1)[-1], []).append(inputs)
        values = {p["metadata"]["name"]: p["value"] for p in by_kind["PriorityClass"]}
        assert values == {
            "gpupool-production": 1_000_000,
            "gpupool-training": 100_000,
            "gpupool-idle-inference": -1,
        }
        (hpa,) = [
            h
            for h in by_kind["HorizontalPodAutoscaler"]
            if h["metadata"]["namespace"] == policy.cluster.flex_namespace
        ]
        assert hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 180
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
        flex = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "llama-8b-flex")
        pod = flex["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == policy.disruption.termination_grace_s >= 30
        assert pod["priorityClassName"] == "gpupool-idle-inference"
        affinity = pod["affinity"]
        (spread,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert spread["podAffinityTerm"]["topologyKey"] == "topology.kubernetes.io/zone"
        (pack,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert pack["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        # the shipped gpu-prod lends: flex may land there, its own gpu-flex preferred
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        label = policy.cluster.pool_label
        if target == "karpenter":  # the lending pool only where Karpenter launched a node
            assert terms == [
                {"matchExpressions": [{"key": label, "operator": "In", "values": ["gpu-flex"]}]},
                {
                    "matchExpressions": [
                        {"key": label, "operator": "In", "values": ["gpu-prod"]},
                        {"key": "karpenter.sh/initialized", "operator": "In", "values": ["true"]},
                    ]
                },
            ]
            assert len(by_kind["NodePool"]) == len(policy.node_pools)
        else:
            assert terms == [
                {
                    "matchExpressions": [
                        {"key": label, "operator": "In", "values": ["gpu-flex", "gpu-prod"]}
                    ]
                }
            ]
            assert len(by_kind["NodePatch"]) == sum(len(p.nodes) for p in policy.node_pools)
        (prefer,) = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert prefer["preference"]["matchExpressions"][0]["values"] == ["gpu-flex"]
        assert {t.get("value") for t in pod["tolerations"]} >= {"gpu-flex", "gpu-prod"}
        (pdb,) = by_kind["PodDisruptionBudget"]
        assert pdb["spec"]["minAvailable"] == policy.disruption.pdb_min_available
        assert pdb["spec"]["selector"] == flex["spec"]["selector"]
        assert hpa["spec"]["maxReplicas"] == policy.replica_bound(policy.workloads[0]) == 96

    return _declare(policy, target).apply(check)


class FakeConfig:
    """``pulumi.Config``'s ``get``, from a dict (read_settings takes the config as a parameter)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str) -> str | None:
        return self.values.get(key)


def test_settings_resolve_the_policy_against_the_project_root() -> None:
    settings = read_settings(FakeConfig({"policy": "policy/pool.yaml", "target": "karpenter"}))  # type: ignore[arg-type]
    assert settings.policy_path == PROJECT_ROOT / "policy/pool.yaml"
    assert settings.options.target == "karpenter"
    assert (PROJECT_ROOT / "Pulumi.yaml").is_file()
    defaults = read_settings(FakeConfig({}))  # type: ignore[arg-type]
    assert (defaults.options.target, defaults.policy_path.name) == ("labels", "pool.yaml")
    with pytest.raises(pulumi.RunError, match="gpupool:target must be one of"):
        read_settings(FakeConfig({"target": "gke"}))  # type: ignore[arg-type]
    assert defaults.options == StackOptions()
    assert defaults.options.hpa_tolerance == "cluster"
    tolerant = read_settings(FakeConfig({"hpaTolerance": "behavior"}))  # type: ignore[arg-type]
    assert tolerant.options.hpa_tolerance == "behavior"
    with pytest.raises(pulumi.RunError, match="gpupool:hpaTolerance must be one of"):
        read_settings(FakeConfig({"hpaTolerance": "0.05"}))  # type: ignore[arg-type]


@pulumi_test
def test_main_program_reads_stack_config_and_declares_the_policy() -> pulumi.Output[None]:
    """``infra/__main__.py`` end to end: stack config -> policy file -> vLLM args -> resources."""
    pulumi.runtime.set_all_config(
        {"gpupool:policy": "policy/pool.yaml", "gpupool:target": "karpenter"}
    )
    try:
        program = runpy.run_path(str(PROJECT_ROOT / "infra" / "__main__.py"), run_name="__main__")
    finally:
        pulumi.runtime.set_all_config({})
    policy = load_policy()

    def check(_: Any) -> None:
        types = [t for t, _, _ in RECORDER.registered]
        assert types.count("kubernetes:karpenter.sh/v1:NodePool") == len(policy.node_pools)
        flex = next(
            i
            for t, _, i in RECORDER.registered
            if t == "kubernetes:apps/v1:Deployment" and i["metadata"]["name"] == "llama-8b-flex"
        )
        args = flex["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:2] == ["--model", policy.workloads[0].model]
        assert "--block-size" in args and "--shutdown-timeout" in args

    urns = [r.urn for c in program["components"] for r in c.resources.values()]
    return pulumi.Output.all(*urns).apply(check)


def test_a_bad_policy_stops_the_program_with_located_problems(tmp_path: Path) -> None:
    bad = tmp_path / "pool.yaml"
    bad.write_text(
        PROJECT_ROOT.joinpath("policy/pool.yaml").read_text().replace("value: -1", "value: 5")
    )
    with pytest.raises(pulumi.RunError) as caught:
        run(StackSettings(bad, StackOptions("labels")))
    assert str(caught.value).startswith(f"{bad}:")
    assert "priorities.idle_inference.value" in str(caught.value)
    assert RECORDER.registered == []


def test_generic_mapping_covers_built_ins_patches_and_crds() -> None:
    from pulumi_kubernetes.apiextensions import CustomResource
    from pulumi_kubernetes.core.v1 import ConfigMap, NodePatch
    from pulumi_kubernetes.networking.v1 import NetworkPolicy

    from infra.resources import resource_class

    assert resource_class("v1", "ConfigMap") is ConfigMap
    assert resource_class("networking.k8s.io/v1", "NetworkPolicy") is NetworkPolicy
    assert resource_class("v1", "Node") is NodePatch
    assert resource_class("monitoring.coreos.com/v1", "PrometheusRule") is None
    assert resource_class("karpenter.sh/v1", "NodePool") is None
    assert issubclass(CustomResource, pulumi.CustomResource)


@pulumi_test
def test_a_new_group_of_any_objects_needs_no_program_change() -> pulumi.Output[None]:
    """How monitoring objects will join: an ObjectGroup with a CRD object and a built-in one."""
    from infra.bundle import ObjectGroup

    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "gpupool", "namespace": "gpupool-system"},
        "spec": {"groups": [{"name": "g", "rules": [{"record": "r", "expr": "1"}]}]},
    }
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "dashboards", "namespace": "gpupool-system"},
        "data": {"gpupool.json": "{}"},
    }
    (component,) = declare_groups(
        [ObjectGroup("gpupool:monitoring:Rules", "monitoring", (rule, config))]
    )

    def check(_: Any) -> None:
        registered = {(t, n): i for t, n, i in RECORDER.registered}
        crd = registered[
            ("kubernetes:monitoring.coreos.com/v1:PrometheusRule", "gpupool-prometheusrule")
        ]
        assert crd["spec"] == rule["spec"]
        cm = registered[("kubernetes:core/v1:ConfigMap", "dashboards-configmap")]
        assert cm["data"] == config["data"]

    return pulumi.Output.all(*[r.urn for r in component.resources.values()]).apply(check)

"""The serving layer's objects: built-ins valid Kubernetes (strict), pools over the right pods,
the endpoint picker configured from the policy's own numbers, RBAC and NetworkPolicies as
narrow as they can be, the plain-Services fallback, ``off`` rendering what gpupool rendered
before, and the ``render``/``diff`` options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from infra.builders.endpoint_picker import DETECTOR, endpoint_picker_config
from infra.builders.meta import Manifest
from infra.builders.serving_options import (
    DISTRIBUTIONS,
    OBJECTIVE_APIS,
    OBJECTIVE_HEADER,
    ObjectiveApi,
    ServingOptions,
)
from infra.builders.serving_pools import MODEL_LABEL, ServingProblem
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy, load_policy, parse_policy
from policy.serving import ENGINE_METRICS
from runtime.cli.app import app
from runtime.metrics import catalogue
from tests.infra.policies import edited, explicit_args, policy_with
from tests.infra.test_cli import write_policy
from tests.infra.test_kubernetes_schemas import VERSIONS
from tests.infra.test_security import _admits
from tests.infra.test_serving_schemas import CRD_GROUPS, served_doc, served_policy, serving_objects

runner = CliRunner()

PLUGIN_TYPES = {
    "single-profile-handler",
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "prefix-cache-scorer",
    "max-score-picker",
    "utilization-detector",
}
"""Plugin types documented for both GIE v1.5 and llm-d-router (docs/serving.md, sources)."""


def _bundle(
    policy: PoolPolicy, mode: str = "inference-extension", api: str = OBJECTIVE_APIS[1]
) -> list[Manifest]:
    options = ServingOptions(mode, api)  # type: ignore[arg-type]
    return build_bundle(
        policy, stack=StackOptions("labels", serving=options), vllm_args=explicit_args(policy)
    )


def _one(objs: list[Manifest], kind: str, name: str) -> Manifest:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("mode", ["inference-extension", "services"])
@pytest.mark.parametrize("api", OBJECTIVE_APIS)
def test_built_in_objects_are_valid_kubernetes(version: str, mode: str, api: str) -> None:
    """Every built-in object of a serving bundle (the pickers' Deployments, Services,
    ConfigMaps, RBAC, NetworkPolicies, and the relabelled flex Deployment) passes strict."""
    objs = [
        o
        for o in _bundle(served_policy(), mode, api)
        if not o["apiVersion"].startswith((*CRD_GROUPS, "karpenter.sh/", "monitoring.coreos.com/"))
    ]
    kinds = {o["kind"] for o in objs}
    if mode == "inference-extension":
        assert {"Role", "RoleBinding", "ServiceAccount", "ConfigMap", "NetworkPolicy"} <= kinds
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


def test_off_renders_what_gpupool_rendered_before() -> None:
    """The default mode: the same objects as a policy without a serving section (the sidecars'
    policy ConfigMap aside, which restates the policy)."""
    with_serving = load_policy()
    without = with_serving.model_copy(update={"serving": None})
    a = build_bundle(
        with_serving, stack=StackOptions("labels"), vllm_args=explicit_args(with_serving)
    )
    b = build_bundle(without, stack=StackOptions("labels"), vllm_args=explicit_args(without))
    assert [o for o in a if o["kind"] != "ConfigMap"] == [o for o in b if o["kind"] != "ConfigMap"]
    assert [o["metadata"]["name"] for o in a] == [o["metadata"]["name"] for o in b]


def test_a_serving_mode_needs_a_serving_section() -> None:
    policy = load_policy().model_copy(update={"serving": None})
    for mode in ("inference-extension", "services"):
        with pytest.raises(ServingProblem, match="gpupool:serving"):
            _bundle(policy, mode)


def test_each_pool_selects_its_tiers_pods_on_their_port_and_nothing_else() -> None:
    policy = served_policy()
    objs = _bundle(policy)
    flex = _one(objs, "Deployment", "llama-8b-flex")
    pod_labels = flex["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[MODEL_LABEL] == "llama-8b"
    assert MODEL_LABEL not in flex["spec"]["selector"]["matchLabels"]  # the selector is immutable
    pool = _one(objs, "InferencePool", "llama-8b-flex")
    assert pool["metadata"]["namespace"] == policy.cluster.flex_namespace
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (port,) = flex["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert pool["spec"]["targetPorts"] == [{"number": port["containerPort"]}]
    prod = _one(objs, "InferencePool", "llama-70b-production")
    production = policy.serving.models[1].production  # type: ignore[union-attr]
    assert production is not None
    assert prod["metadata"]["namespace"] == production.namespace == "inference"
    assert prod["spec"]["selector"]["matchLabels"] == production.pod_labels
    assert prod["spec"]["targetPorts"] == [{"number": production.port}]
    for picker in [
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-epp")
    ]:
        labels = picker["spec"]["template"]["metadata"]["labels"]
        for p in (pool, prod):
            assert not p["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("api", OBJECTIVE_APIS)
def test_pools_pickers_objectives_and_routes_point_at_each_other(api: ObjectiveApi) -> None:
    policy = served_policy()
    objs = serving_objects(policy, api)
    by_kind: dict[str, list[Manifest]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    for pool in by_kind["InferencePool"]:
        ns, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
        ref = pool["spec"]["endpointPickerRef"]
        service = _one(objs, "Service", ref["name"])
        assert service["metadata"]["namespace"] == ns
        assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
        picker = _one(objs, "Deployment", ref["name"])
        assert (
            service["spec"]["selector"].items()
            <= picker["spec"]["template"]["metadata"]["labels"].items()
        )
        args = picker["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--pool-name") + 1] == name
        assert args[args.index("--pool-namespace") + 1] == ns
        image = picker["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == getattr(
            policy.serving.endpoint_picker.images, DISTRIBUTIONS[api].image_field
        )  # type: ignore[union-attr]
        route = _one(objs, "HTTPRoute", name)
        objectives = [
            o
            for o in by_kind["InferenceObjective"]
            if o["spec"]["poolRef"]["name"] == name and o["metadata"]["namespace"] == ns
        ]
        assert objectives
        rules = route["spec"]["rules"]
        assert len(rules) == len(objectives)
        for rule, objective in zip(rules, objectives, strict=True):
            assert rule["backendRefs"] == [
                {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name}
            ]
            (match,) = rule["matches"]
            assert match["headers"] == [
                {"type": "Exact", "name": OBJECTIVE_HEADER, "value": objective["metadata"]["name"]}
            ]
            (modifier,) = rule["filters"]
            set_headers = modifier["requestHeaderModifier"]["set"]
            assert {h["name"] for h in set_headers} == set(DISTRIBUTIONS[api].objective_headers)
            assert {h["value"] for h in set_headers} == {objective["metadata"]["name"]}
        assert route["spec"]["parentRefs"] == [
            {
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": "inference-gateway",
                "namespace": "gateway-system",
            }
        ]


def test_objectives_carry_the_class_priorities_and_tiers_serve_only_their_classes() -> None:
    objs = serving_objects(served_policy())
    priorities = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["priority"]
        for o in objs
        if o["kind"] == "InferenceObjective"
    }
    # production traffic reaches the production pods only; batch (sheddable) the flex pods only
    assert priorities == {
        ("inference", "llama-70b-production"): 100,
        ("gpupool-flex", "llama-8b-batch"): -10,
    }


@pytest.mark.parametrize("api", OBJECTIVE_APIS)
def test_picker_config_comes_from_the_policy(api: ObjectiveApi) -> None:
    policy = load_policy()
    config = endpoint_picker_config(policy, api)
    assert config["apiVersion"] == DISTRIBUTIONS[api].config_api
    assert {p["type"] for p in config["plugins"]} <= PLUGIN_TYPES
    (detector,) = [p for p in config["plugins"] if p["type"] == DETECTOR]
    picker = policy.serving.endpoint_picker  # type: ignore[union-attr]
    # one number, one meaning: the KV share at which an instance counts as full everywhere
    assert detector["parameters"] == {
        "queueDepthThreshold": picker.queue_depth_max,
        "kvCacheUtilThreshold": policy.kv_cache.page_table_max_usage,
        "metricsStalenessThreshold": f"{picker.metrics_staleness_ms}ms",
    }
    assert config["saturationDetector"] == {"pluginRef": DETECTOR}
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights == {
        "queue-scorer": 2,
        "kv-cache-utilization-scorer": 2,
        "prefix-cache-scorer": 3,
        "max-score-picker": None,
    }
    changed = policy_with(
        {"kv_cache.page_table_max_usage": 0.9, "serving.endpoint_picker.queue_scorer_weight": 0}
    )
    changed_config = endpoint_picker_config(changed, api)
    (detector,) = [p for p in changed_config["plugins"] if p["type"] == DETECTOR]
    assert detector["parameters"]["kvCacheUtilThreshold"] == 0.9
    assert "queue-scorer" not in {p["type"] for p in changed_config["plugins"]}
    configmap = _one(_bundle(policy, api=api), "ConfigMap", "llama-8b-flex-epp")
    assert YAML(typ="safe").load(configmap["data"]["config.yaml"]) == config


def test_the_metrics_contract_is_what_the_catalogue_reads() -> None:
    """The picker's vLLM series are the ones the catalogue (alerts, tuner, HPA) queries."""
    exprs = " ".join(q.expr for q in catalogue.build_catalogue(load_policy()).queries)
    for metric in ENGINE_METRICS:
        if metric != "vllm:num_requests_running":  # read by the picker only (so far)
            assert metric in exprs, metric


def test_picker_rbac_reads_its_own_namespace_only() -> None:
    for api in OBJECTIVE_APIS:
        objs = serving_objects(served_policy(), api)
        assert not [o for o in objs if o["kind"].startswith("Cluster")]
        for role in [o for o in objs if o["kind"] == "Role"]:
            groups = {g for r in role["rules"] for g in r["apiGroups"]}
            assert groups == {
                "",
                "inference.networking.k8s.io",
                *DISTRIBUTIONS[api].objective_groups,
            }
            assert all(r["verbs"] == ["get", "list", "watch"] for r in role["rules"])
            name, ns = role["metadata"]["name"], role["metadata"]["namespace"]
            binding = _one(objs, "RoleBinding", name)
            assert binding["roleRef"]["name"] == name
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": name, "namespace": ns}
            ]
            account = _one(objs, "ServiceAccount", name)
            assert account["automountServiceAccountToken"] is True
            pod = _one(objs, "Deployment", name)["spec"]["template"]["spec"]
            assert pod["serviceAccountName"] == name


def test_network_policies_admit_the_gateway_and_prometheus_only() -> None:
    policy = served_policy()
    objs = _bundle(policy)
    gateway = (policy.serving.gateway.namespace, {})  # type: ignore[union-attr]
    prometheus = (policy.network.monitoring_namespace, policy.network.prometheus_pod_labels)
    stranger = ("default", {"app": "curl"})
    for np in [
        o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-epp")
    ]:
        ns = np["metadata"]["namespace"]
        pods = _one(objs, "Deployment", np["metadata"]["name"])["spec"]["template"]["metadata"][
            "labels"
        ]
        assert np["spec"]["podSelector"]["matchLabels"].items() <= pods.items()
        rules = {r["ports"][0]["port"]: r for r in np["spec"]["ingress"]}
        assert set(rules) == {"grpc", "metrics"}
        assert _admits(rules["grpc"], *gateway, ns) and not _admits(rules["grpc"], *prometheus, ns)
        assert _admits(rules["metrics"], *prometheus, ns) and not _admits(
            rules["metrics"], *gateway, ns
        )
        for rule in rules.values():
            assert not _admits(rule, *stranger, ns)
            assert not _admits(rule, ns, {"app": "other"}, ns)
    flex = policy.cluster.flex_namespace
    picker_pod = _one(objs, "Deployment", "llama-8b-flex-epp")["spec"]["template"]["metadata"][
        "labels"
    ]
    for mode, gateway_admitted in (
        ("inference-extension", True),
        ("services", False),
        ("off", False),
    ):
        np = _one(_bundle(policy, mode), "NetworkPolicy", "llama-8b-flex")
        (http,) = [r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == "http"]
        assert _admits(http, *gateway, flex) is gateway_admitted, mode
        assert _admits(http, flex, picker_pod, flex)  # the picker scrapes vLLM's /metrics
        assert not _admits(http, *stranger, flex)


def test_plain_services_select_the_pods_that_may_serve_each_class() -> None:
    policy = served_policy()
    objs = _bundle(policy, "services")
    services = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o
        for o in objs
        if o["kind"] == "Service"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "serving"
    }
    assert set(services) == {
        ("gpupool-flex", "llama-8b-batch"),
        ("inference", "llama-70b-production"),
    }
    assert not [o for o in objs if o["apiVersion"].startswith(CRD_GROUPS)]
    flex = _one(objs, "Deployment", "llama-8b-flex")["spec"]["template"]
    batch = services[("gpupool-flex", "llama-8b-batch")]["spec"]
    assert batch["selector"].items() <= flex["metadata"]["labels"].items()
    assert (
        batch["ports"][0]["targetPort"]
        == flex["spec"]["containers"][0]["ports"][0]["containerPort"]
    )
    # membership follows readiness (vLLM's probe); no gate nobody would ever set
    assert "readinessProbe" in flex["spec"]["containers"][0]
    assert "readinessGates" not in flex["spec"]
    prod = services[("inference", "llama-70b-production")]["spec"]
    assert prod["selector"] == {"app": "llama-70b"} and prod["ports"][0]["port"] == 8000


def test_a_model_without_instances_or_classes_for_a_tier_gets_no_pool() -> None:
    doc: Any = edited()
    doc["serving"]["traffic_classes"] = [{"name": "batch", "priority": -1, "served_by": "flex"}]
    objs = serving_objects(parse_policy(doc))
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "InferencePool"] == [
        "llama-8b-flex"
    ]
    doc["workloads"][0]["model"] = "someone/else"
    assert serving_objects(parse_policy(doc)) == []


def test_render_and_diff_take_the_serving_options(tmp_path: Path) -> None:
    source = write_policy(tmp_path, served_doc())
    out = tmp_path / "build"
    args = ["render", str(source), "--out", str(out), "--serving", "inference-extension"]
    result = runner.invoke(app, [*args, "--inference-objective-api", OBJECTIVE_APIS[0]])
    assert result.exit_code == 0, result.output
    objective = YAML(typ="safe").load(
        (out / "gpupool-flex" / "inferenceobjective-llama-8b-batch.yaml").read_text()
    )
    assert objective["apiVersion"] == OBJECTIVE_APIS[0]
    assert (out / "inference" / "inferencepool-llama-70b-production.yaml").is_file()
    kustomization = (out / "kustomization.yaml").read_text()
    assert "gpupool-flex/httproute-llama-8b-flex.yaml" in kustomization
    diff = runner.invoke(app, ["diff", str(source), str(source), "--serving", "services"])
    assert diff.exit_code == 0 and diff.output == "no differences\n", diff.output
    bad = runner.invoke(app, [*args[:4], "--serving", "gateway"])
    assert bad.exit_code == 2 and "gateway" in bad.output
    bad_api = runner.invoke(app, [*args, "--inference-objective-api", "llm-d.ai/v1"])
    assert bad_api.exit_code == 2 and "llm-d.ai/v1" in bad_api.output
    doc = edited()
    del doc["serving"]
    (tmp_path / "bare").mkdir()
    bare = write_policy(tmp_path / "bare", doc)
    missing = runner.invoke(
        app, ["render", str(bare), "--out", str(tmp_path / "b2"), "--serving", "services"]
    )
    assert missing.exit_code == 1, missing.output
    assert f"{bare}:1: serving: the stack option gpupool:serving" in missing.output
    assert "Traceback" not in missing.output
    assert not (tmp_path / "b2").exists()

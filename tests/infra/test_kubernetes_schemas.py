"""Every rendered built-in object passes kubernetes-validate in strict mode (1.30 and newest)."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from infra.builders.meta import Manifest
from infra.builders.stack_options import HpaTolerance, StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy, load_policy
from tests.infra.policies import explicit_args, policy_with, two_workloads

VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
CRD_GROUPS = ("karpenter.sh/", "monitoring.coreos.com/")  # checked by their own schema tests


def built_in(policy: PoolPolicy, target: str) -> list[Manifest]:
    objs = build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]
    return [o for o in objs if not o["apiVersion"].startswith(CRD_GROUPS)]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", ["labels", "karpenter"])
@pytest.mark.parametrize(
    "policy",
    [load_policy(), two_workloads(), policy_with({"workloads.0.kv_compaction": False})],
    ids=["default", "two", "no-compaction"],
)
def test_objects_are_valid_kubernetes(policy: PoolPolicy, target: str, version: str) -> None:
    objs = built_in(policy, target)
    assert {"Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Namespace"} <= {
        o["kind"] for o in objs
    }
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_strict_validation_catches_a_misspelled_field(version: str) -> None:
    """The check above has teeth: a typo in a Deployment spec is rejected."""
    (deployment,) = [
        o
        for o in built_in(load_policy(), "labels")
        if o["kind"] == "Deployment" and o["metadata"]["name"] != "gpupool-tuner"
    ]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def _flex_hpas(hpa_tolerance: HpaTolerance) -> list[Manifest]:
    policy = load_policy()
    objs = build_bundle(
        policy,
        stack=StackOptions("labels", hpa_tolerance=hpa_tolerance),
        vllm_args=explicit_args(policy),
    )
    return [
        o
        for o in objs
        if o["kind"] == "HorizontalPodAutoscaler"
        and o["metadata"]["namespace"] == policy.cluster.flex_namespace
    ]


def test_behavior_tolerance_is_valid_where_the_api_has_it_and_nowhere_else() -> None:
    """``gpupool:hpaTolerance: behavior`` sets ``tolerance`` on both rules: valid on the
    newest API (HPAConfigurableTolerance, 1.33+), rejected by 1.30's, hence a stack option."""
    (hpa,) = _flex_hpas("behavior")
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleUp"]["tolerance"] == behavior["scaleDown"]["tolerance"] == "0"
    kubernetes_validate.validate(hpa, kubernetes_validate.latest_version(), strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, "1.30.0", strict=True)
    (default,) = _flex_hpas("cluster")
    assert "tolerance" not in default["spec"]["behavior"]["scaleUp"]

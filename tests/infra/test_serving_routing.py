"""Where each traffic class's requests can land, read from the rendered objects of generated
policies: a class reaches flex pods only when the policy puts it there, and the policy puts
only sheddable classes there; a request that names no class, or an unknown one, matches no
route. Generated over classes, priorities, tiers and which models have which instances, in
both serving modes, so the guarantee is the renderer's and not the shipped example's."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.builders.meta import Manifest
from infra.builders.serving_options import OBJECTIVE_APIS, OBJECTIVE_HEADER, ServingOptions
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy, parse_policy
from policy.loader import PolicyError
from tests.infra.policies import edited, explicit_args
from tests.infra.test_serving_schemas import PRODUCTION_MODEL

FLEX_MODEL_PRODUCTION = {"namespace": "inference", "pod_labels": {"app": "llama-8b"}, "port": 8000}
"""Production instances of the flex workload's own model (``llama-8b``): a model with both
tiers, each in its own pool."""


@dataclass(frozen=True)
class Class:
    name: str
    priority: int
    served_by: str


@st.composite
def class_lists(draw: st.DrawFn, valid: bool = True) -> list[Class]:
    """1-5 classes; with ``valid``, those served by flex have a negative priority."""
    out = []
    for i in range(draw(st.integers(1, 5))):
        served_by = draw(st.sampled_from(["production", "flex"]))
        high = -1 if valid and served_by == "flex" else 1000
        out.append(Class(f"c{i}", draw(st.integers(-1000, high)), served_by))
    return out


def _doc(classes: list[Class], flex_has_production: bool, with_70b: bool) -> Any:
    doc = edited()
    serving = doc["serving"]
    serving["traffic_classes"] = [c.__dict__ for c in classes]
    if flex_has_production:
        serving["models"][0]["production"] = copy.deepcopy(FLEX_MODEL_PRODUCTION)
    if with_70b:
        serving["models"].append(copy.deepcopy(PRODUCTION_MODEL))
    return doc


def _objects(policy: PoolPolicy, mode: str, api: str) -> list[Manifest]:
    options = ServingOptions(mode, api)  # type: ignore[arg-type]
    return build_bundle(
        policy, stack=StackOptions("labels", serving=options), vllm_args=explicit_args(policy)
    )


def _flex_pod_templates(objs: list[Manifest], flex_namespace: str) -> list[dict[str, str]]:
    """Labels of every flex vLLM pod (the endpoint pickers run beside them)."""
    return [
        o["spec"]["template"]["metadata"]["labels"]
        for o in objs
        if o["kind"] == "Deployment"
        and o["metadata"]["namespace"] == flex_namespace
        and not _serving(o)
    ]


def _serving(obj: Manifest) -> bool:
    return bool(obj["metadata"]["labels"].get("app.kubernetes.io/component") == "serving")


Flex = tuple[str, list[dict[str, str]]]
"""The flex namespace and the labels of its vLLM pods."""


def _selects_flex(namespace: str, selector: dict[str, str], flex: Flex) -> bool:
    """Whether a selector in ``namespace`` takes any flex pod (a selector sees its own
    namespace only)."""
    ns, templates = flex
    return namespace == ns and any(selector.items() <= t.items() for t in templates)


def _reach(objs: list[Manifest], flex_namespace: str) -> Iterator[tuple[str | None, bool]]:
    """``(objective a request must name, whether it can land on a flex pod)`` for every way
    in: each HTTPRoute rule (through its InferencePool) and each plain Service."""
    flex: Flex = (flex_namespace, _flex_pod_templates(objs, flex_namespace))
    pools = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["selector"]["matchLabels"]
        for o in objs
        if o["kind"] == "InferencePool"
    }
    for route in (o for o in objs if o["kind"] == "HTTPRoute"):
        namespace = route["metadata"]["namespace"]
        for rule in route["spec"]["rules"]:
            headers = [h for m in rule["matches"] for h in m.get("headers", [])]
            named = [h["value"] for h in headers if h["name"] == OBJECTIVE_HEADER]
            assert len(rule["matches"]) == 1 and len(named) == 1, rule  # no catch-all rule
            assert headers[0]["type"] == "Exact"
            for ref in rule["backendRefs"]:
                assert ref["kind"] == "InferencePool" and "namespace" not in ref
                selector = pools[(namespace, ref["name"])]
                yield named[0], _selects_flex(namespace, selector, flex)
    for svc in (o for o in objs if o["kind"] == "Service"):
        if not _serving(svc):
            continue
        meta = svc["metadata"]
        if meta["name"].endswith("-epp"):  # the picker's own Service selects the picker
            assert not _selects_flex(meta["namespace"], svc["spec"]["selector"], flex)
            continue
        yield meta["name"], _selects_flex(meta["namespace"], svc["spec"]["selector"], flex)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    classes=class_lists(),
    flex_has_production=st.booleans(),
    with_70b=st.booleans(),
    mode=st.sampled_from(["inference-extension", "services"]),
    api=st.sampled_from(OBJECTIVE_APIS),
)
def test_only_sheddable_classes_the_policy_puts_on_flex_can_reach_flex_pods(
    classes: list[Class], flex_has_production: bool, with_70b: bool, mode: str, api: str
) -> None:
    policy = parse_policy(_doc(classes, flex_has_production, with_70b))
    assert policy.serving is not None
    objs = _objects(policy, mode, api)
    by_objective = {
        policy.serving.objective_name(m, c): c
        for m in policy.serving.models
        for c in policy.serving.traffic_classes
    }
    reached: dict[str, set[bool]] = {}
    for objective, on_flex in _reach(objs, policy.cluster.flex_namespace):
        assert objective in by_objective, objective  # every way in names a declared class
        reached.setdefault(objective, set()).add(on_flex)
        c = by_objective[objective]
        assert on_flex == (c.served_by == "flex"), (objective, c)
        assert not on_flex or c.sheddable, (objective, c)
    # a class reaches every model that has instances of its tier, and nothing else
    for m in policy.serving.models:
        has = {"flex": any(w.model == m.model for w in policy.workloads)}
        has["production"] = m.production is not None
        for c in policy.serving.traffic_classes:
            objective = policy.serving.objective_name(m, c)
            assert (objective in reached) == has[c.served_by], objective
    priorities = {
        (o["metadata"]["namespace"], o["spec"]["priority"])
        for o in objs
        if o["kind"] == "InferenceObjective"
    }
    assert all(p < 0 for ns, p in priorities if ns == policy.cluster.flex_namespace)


@settings(max_examples=25, deadline=None)
@given(classes=class_lists(valid=False))
def test_the_policy_refuses_every_unsheddable_class_on_flex(classes: list[Class]) -> None:
    wrong = [i for i, c in enumerate(classes) if c.served_by == "flex" and c.priority >= 0]
    doc = _doc(classes, flex_has_production=True, with_70b=False)
    if not wrong:
        parse_policy(doc)
        return
    with pytest.raises(PolicyError) as raised:
        parse_policy(doc)
    located = re.findall(r"serving\.traffic_classes\.(\d+)\.priority: class", str(raised.value))
    assert sorted(map(int, located)) == wrong, raised.value

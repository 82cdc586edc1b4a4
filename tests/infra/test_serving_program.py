"""The serving layer under Pulumi's mocks: the program registers exactly the rendered serving
objects (CRD kinds as CustomResources of their group, RBAC as typed resources), in one
component per pool, from the stack options; bad option values stop it with their names."""

from __future__ import annotations

import runpy
from collections import Counter
from typing import Any

import pulumi
import pytest

from infra.builders.serving_options import OBJECTIVE_APIS, ObjectiveApi, ServingOptions
from infra.builders.stack_options import StackOptions
from infra.bundle import SERVING, build_bundle, build_groups
from infra.program import PROJECT_ROOT, declare_groups, read_settings
from policy import load_policy
from tests.infra.policies import explicit_args
from tests.infra.test_program import (
    RECORDER,
    FakeConfig,
    fresh_recorder,  # noqa: F401 - autouse: test_program's recorder, emptied, per test
    identity,
    pulumi_test,
    rendered_objects,
    token,
    unsecret,
)
from tests.infra.test_serving_schemas import served_policy


def _kubernetes() -> list[tuple[str, str, dict[str, Any]]]:
    return [r for r in RECORDER.registered if r[0].startswith("kubernetes:")]


@pytest.mark.parametrize("mode", ["inference-extension", "services"])
@pytest.mark.parametrize("api", OBJECTIVE_APIS)
@pulumi_test
def test_program_registers_exactly_the_rendered_serving_objects(
    mode: str, api: ObjectiveApi
) -> pulumi.Output[None]:
    policy = served_policy()
    options = ServingOptions(mode, api)  # type: ignore[arg-type]
    args = explicit_args(policy)
    components = declare_groups(
        build_groups(policy, stack=StackOptions("labels", serving=options), vllm_args=args)
    )
    objects = build_bundle(policy, stack=StackOptions("labels", serving=options), vllm_args=args)

    def check(_: Any) -> None:
        registered = Counter(identity(t, i) for t, _, i in _kubernetes())
        assert registered == Counter(identity(token(o), o) for o in rendered_objects(objects))
        by_identity = {identity(t, i): i for t, _, i in _kubernetes()}
        for obj in objects:
            fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
            inputs = by_identity[identity(token(obj), obj)]
            got = unsecret({k: v for k, v in inputs.items() if k not in ("apiVersion", "kind")})
            assert got[0] == fields, identity(token(obj), obj)
        types = {t for t, _, _ in _kubernetes()}
        if mode == "inference-extension":
            assert {
                "kubernetes:inference.networking.k8s.io/v1:InferencePool",
                f"kubernetes:{api}:InferenceObjective",
                "kubernetes:gateway.networking.k8s.io/v1:HTTPRoute",
                "kubernetes:rbac.authorization.k8s.io/v1:Role",
                "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
            } <= types
        else:
            assert not [t for t in types if "inference" in t or "gateway" in t]
        serving = [(t, n) for t, n, _ in RECORDER.registered if t == SERVING[mode]]
        expected = (
            {
                ("gpupool:serving:InferencePool", n)
                for n in ("llama-8b-flex", "llama-70b-production")
            }
            if mode == "inference-extension"
            else {("gpupool:serving:TrafficClassServices", "traffic-class-services")}
        )
        assert set(serving) == expected

    urns = [r.urn for c in components for r in c.resources.values()]
    return pulumi.Output.all(*urns).apply(check)


@pulumi_test
def test_main_program_reads_the_serving_options() -> pulumi.Output[None]:
    """``infra/__main__.py`` with ``gpupool:serving`` and ``gpupool:inferenceObjectiveApi``."""
    pulumi.runtime.set_all_config(
        {
            "gpupool:policy": "policy/pool.yaml",
            "gpupool:serving": "inference-extension",
            "gpupool:inferenceObjectiveApi": "inference.networking.x-k8s.io/v1alpha2",
        }
    )
    try:
        program = runpy.run_path(str(PROJECT_ROOT / "infra" / "__main__.py"), run_name="__main__")
    finally:
        pulumi.runtime.set_all_config({})

    def check(_: Any) -> None:
        types = [t for t, _, _ in _kubernetes()]
        # the shipped policy serves llama-8b on flex: one pool, one (batch) objective
        objective = "kubernetes:inference.networking.x-k8s.io/v1alpha2:InferenceObjective"
        assert types.count(objective) == 1
        (picker,) = [
            i
            for t, _, i in _kubernetes()
            if t == "kubernetes:apps/v1:Deployment" and i["metadata"]["name"] == "llama-8b-flex-epp"
        ]
        image = picker["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == load_policy().serving.endpoint_picker.images.gie  # type: ignore[union-attr]

    urns = [r.urn for c in program["components"] for r in c.resources.values()]
    return pulumi.Output.all(*urns).apply(check)


def test_settings_default_to_off_and_refuse_unknown_values() -> None:
    defaults = read_settings(FakeConfig({}))  # type: ignore[arg-type]
    assert defaults.options.serving == ServingOptions("off", "llm-d.ai/v1alpha2")
    chosen = read_settings(
        FakeConfig({"serving": "services", "inferenceObjectiveApi": OBJECTIVE_APIS[0]})  # type: ignore[arg-type]
    )
    assert chosen.options.serving == ServingOptions("services", OBJECTIVE_APIS[0])
    with pytest.raises(pulumi.RunError) as caught:
        read_settings(FakeConfig({"serving": "gie"}))  # type: ignore[arg-type]
    assert str(caught.value) == (
        "gpupool:serving must be one of ['inference-extension', 'services', 'off'], found 'gie'"
    )
    with pytest.raises(pulumi.RunError) as caught:
        read_settings(FakeConfig({"inferenceObjectiveApi": "llm-d.ai/v1alpha1"}))  # type: ignore[arg-type]
    assert str(caught.value) == (
        "gpupool:inferenceObjectiveApi must be one of ['inference.networking.x-k8s.io/v1alpha2', "
        "'llm-d.ai/v1alpha2'], found 'llm-d.ai/v1alpha1'"
    )

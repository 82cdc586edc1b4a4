"""The Pulumi program: stack config -> bundle -> one typed resource per object.

Objects are grouped in ComponentResources: one ``gpupool:flex:InferenceWorkload`` per flex
workload and one component per cluster-wide group. Everything that is not Pulumi (policy,
builders, vLLM args) is computed before any resource is declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import pulumi
from pulumi_kubernetes.core.v1 import Service

from infra.builders.serving_options import OBJECTIVE_APIS, SERVING_MODES, ServingOptions
from infra.builders.stack_options import DEFAULT_STACK, HPA_TOLERANCES, TARGETS, StackOptions
from infra.bundle import (
    INFERENCE_WORKLOAD,
    SCHEDULING,
    ObjectGroup,
    build_groups,
    check_unique,
    logical_name,
)
from infra.inputs import load_inputs
from infra.resources import declare
from policy import PolicyError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""Directory of Pulumi.yaml; ``gpupool:policy`` is relative to it."""


@dataclass(frozen=True)
class StackSettings:
    """Stack config, read once (``Pulumi.<stack>.yaml``)."""

    policy_path: Path
    """``gpupool:policy``: the policy file (relative to the project root)."""
    options: StackOptions
    """``gpupool:target``, ``gpupool:hpaTolerance``, ``gpupool:serving`` and
    ``gpupool:inferenceObjectiveApi`` (``infra.builders.stack_options``)."""


Choice = TypeVar("Choice", bound=str)


def _choice(
    config: pulumi.Config, key: str, allowed: tuple[Choice, ...], default: Choice
) -> Choice:
    """``gpupool:<key>``, or ``default`` when unset; a value outside ``allowed`` stops the
    program with the option's name and the allowed values."""
    value = config.get(key) or default
    for choice in allowed:
        if choice == value:
            return choice
    raise pulumi.RunError(f"gpupool:{key} must be one of {list(allowed)}, found {value!r}")


def read_settings(config: pulumi.Config, root: Path = PROJECT_ROOT) -> StackSettings:
    """Typed settings from the ``gpupool`` config namespace; a bad value stops the program."""
    default = DEFAULT_STACK
    options = StackOptions(
        _choice(config, "target", TARGETS, default.target),
        _choice(config, "hpaTolerance", HPA_TOLERANCES, default.hpa_tolerance),
        ServingOptions(
            _choice(config, "serving", SERVING_MODES, default.serving.mode),
            _choice(config, "inferenceObjectiveApi", OBJECTIVE_APIS, default.serving.objective_api),
        ),
    )
    policy = Path(config.get("policy") or "policy/pool.yaml")
    return StackSettings(policy if policy.is_absolute() else root / policy, options)


class BundleComponent(pulumi.ComponentResource):
    """A group of objects; its outputs name each child's URN."""

    def __init__(self, group: ObjectGroup, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(group.component, group.name, None, opts)
        self.group_name = group.name
        self.objects = group.objects
        child = pulumi.ResourceOptions(parent=self)
        self.resources = {logical_name(obj): declare(obj, child) for obj in group.objects}
        self.register_outputs(self.outputs())

    def outputs(self) -> dict[str, pulumi.Input[str]]:
        return {name: res.urn for name, res in self.resources.items()}


class InferenceWorkload(BundleComponent):
    """One flex vLLM workload: Deployment, PVC(s), Service, PDB, HPA and NetworkPolicy (and,
    with compaction, the sidecars' headless Service)."""

    service_url: pulumi.Output[str]
    """In-cluster URL of the workload's Service, from the Service resource's outputs."""

    def outputs(self) -> dict[str, pulumi.Input[str]]:
        (name,) = (
            logical_name(o)
            for o in self.objects
            if o["kind"] == "Service" and o["spec"].get("clusterIP") != "None"
        )
        service = cast(Service, self.resources[name])
        self.service_url = pulumi.Output.all(service.metadata, service.spec).apply(_service_url)
        return super().outputs() | {"service_url": self.service_url}


def _service_url(args: list[Any]) -> str:
    meta, spec = args
    return f"http://{meta['name']}.{meta['namespace']}.svc:{spec['ports'][0]['port']}"


def declare_groups(groups: list[ObjectGroup]) -> list[BundleComponent]:
    """One component per group; every other group waits for namespaces and priorities.

    Groups from anywhere (not only ``build_groups``) are checked first: a duplicate would
    otherwise replace a child in its component's ``resources`` or fail at registration."""
    check_unique(groups)
    first = [g for g in groups if g.component == SCHEDULING]
    scheduling = [BundleComponent(g) for g in first]
    components = list(scheduling)
    for group in groups:
        if group.component == SCHEDULING:
            continue
        opts = pulumi.ResourceOptions(depends_on=scheduling)
        cls = InferenceWorkload if group.component == INFERENCE_WORKLOAD else BundleComponent
        components.append(cls(group, opts))
    return components


def run(settings: StackSettings) -> list[BundleComponent]:
    """Declare every object of the policy named by ``settings``.

    A bad policy stops the program before any resource is declared, with the same
    ``FILE:LINE: path: message`` lines ``gpupool validate`` prints (no traceback).
    """
    stack = settings.options
    try:
        inputs = load_inputs(settings.policy_path, serving=stack.serving, target=stack.target)
    except PolicyError as exc:
        raise pulumi.RunError(str(exc)) from None
    groups = build_groups(inputs.policy, stack=stack, vllm_args=inputs.vllm_args)
    components = declare_groups(groups)
    pulumi.export("target", stack.target)
    pulumi.export("serving", stack.serving.mode)
    pulumi.export(
        "flex_endpoints",
        {c.group_name: c.service_url for c in components if isinstance(c, InferenceWorkload)},
    )
    return components

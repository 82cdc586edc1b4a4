"""Edge: the production patch as a Pulumi transformation, for stacks that own the workloads.

A stack that declares the production Deployments/StatefulSets itself (pulumi_kubernetes)
adds gpupool's patch to them with one resource option; the patch is
``infra.builders.production.patch_object``, which merges exactly as the Kustomize component
does (tested equal on the same objects)::

    from infra.production_patch import production_transformation
    from policy import load_policy

    patch = production_transformation(load_policy(Path("pool.yaml")))
    k8s.apps.v1.Deployment("llama-70b-prod", ..., opts=pulumi.ResourceOptions(
        transformations=[patch]))

Given to a ComponentResource (or ``pulumi.runtime.register_stack_transformation``) it reaches
every child; resources that no production reference targets pass through unchanged (the
transformation returns None). ``production_transform`` is the same for the newer
``transforms`` option (``ResourceOptions(transforms=[...])``,
``pulumi.runtime.register_resource_transform``), which the engine runs on serialized
properties.

Matching needs the object's ``metadata`` (kind, namespace, and name or labels) as plain
values when the resource is declared: a name ref needs an explicit ``metadata.name`` (an
auto-named resource is never matched), and a namespace that is an Output cannot be matched,
so the transformation stops the program (``UnresolvedTarget``) instead of skipping a
workload silently. ``default_namespace`` is where the stack's provider puts objects without
``metadata.namespace`` (the provider's ``namespace`` setting; ``default`` unless set). The
pod template may hold Outputs: the patch is then applied inside ``Output.apply``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi import _types

from infra.builders.production import UNSET_NAMESPACE, patch_object
from policy import PoolPolicy

WORKLOAD_TYPES = {
    "kubernetes:apps/v1:Deployment": ("apps/v1", "Deployment"),
    "kubernetes:apps/v1:StatefulSet": ("apps/v1", "StatefulSet"),
}
"""Pulumi type tokens of the kinds a production reference may name."""


class UnresolvedTarget(pulumi.RunError):
    """A Deployment/StatefulSet whose namespace, name or labels are not known at declaration."""


def plain(value: Any) -> Any:
    """``value`` with pulumi input types (``ObjectMetaArgs``, ...) as dicts with Kubernetes
    (camelCase) keys, recursively; Outputs and plain values are kept."""
    if _types.is_input_type(type(value)):
        return {k: plain(v) for k, v in _types.input_type_to_dict(value).items()}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _has_output(value: Any) -> bool:
    if isinstance(value, pulumi.Output):
        return True
    if isinstance(value, Mapping):
        return any(_has_output(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_output(v) for v in value)
    return False


def _identity(type_: str, name: str, metadata: Any) -> Mapping[str, Any]:
    """The plain metadata matching needs; UnresolvedTarget when part of it is an Output."""
    meta = plain(metadata) or {}
    unresolved = [
        key
        for key in ("namespace", "name", "labels")
        if _has_output(meta if not isinstance(meta, Mapping) else meta.get(key))
    ]
    if unresolved:
        raise UnresolvedTarget(
            f"{type_} {name!r}: metadata {', '.join(unresolved)} is a pulumi Output, so "
            "gpupool cannot tell whether a production reference targets it; give plain "
            "values (the production patch must never be skipped silently)"
        )
    assert isinstance(meta, Mapping)
    return meta


def patch_props(
    policy: PoolPolicy,
    type_: str,
    name: str,
    props: Mapping[str, Any],
    *,
    default_namespace: str = UNSET_NAMESPACE,
) -> dict[str, Any] | None:
    """New resource properties with the production patch, or None when nothing targets it.

    ``props`` keyed by the top-level names (``metadata``, ``spec``) as either transformation
    API passes them; other keys are kept as they are.
    """
    api = WORKLOAD_TYPES.get(type_)
    if api is None:
        return None
    meta = _identity(type_, name, props.get("metadata"))
    probe = {"apiVersion": api[0], "kind": api[1], "metadata": meta, "spec": {}}
    if patch_object(policy, probe, default_namespace=default_namespace) is None:
        return None
    spec = plain(props.get("spec")) or {}

    def patched(spec_value: Any) -> Any:
        obj = {**probe, "spec": spec_value or {}}
        out = patch_object(policy, obj, default_namespace=default_namespace)
        assert out is not None  # the probe above matched the same metadata
        return out["spec"]

    new_spec = pulumi.Output.from_input(spec).apply(patched) if _has_output(spec) else patched(spec)
    return {**props, "spec": new_spec}


def production_transformation(
    policy: PoolPolicy, *, default_namespace: str = UNSET_NAMESPACE
) -> pulumi.ResourceTransformation:
    """A ``ResourceOptions(transformations=[...])`` entry applying the production patch."""

    def transformation(
        args: pulumi.ResourceTransformationArgs,
    ) -> pulumi.ResourceTransformationResult | None:
        props = patch_props(
            policy, args.type_, args.name, args.props, default_namespace=default_namespace
        )
        return None if props is None else pulumi.ResourceTransformationResult(props, args.opts)

    return transformation


def production_transform(
    policy: PoolPolicy, *, default_namespace: str = UNSET_NAMESPACE
) -> pulumi.ResourceTransform:
    """A ``ResourceOptions(transforms=[...])`` entry applying the production patch."""

    def transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        props = patch_props(
            policy, args.type_, args.name, args.props, default_namespace=default_namespace
        )
        return None if props is None else pulumi.ResourceTransformResult(props, args.opts)

    return transform

"""Edge: a policy file -> its rendered documents (what ``render``, ``diff`` and the tuner show)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.builders.meta import Manifest
from infra.builders.nodepools import Target
from infra.builders.serving_options import DEFAULT_SERVING, ServingOptions
from infra.builders.workload import HpaTolerance
from infra.bundle import build_bundle
from infra.inputs import BundleInputs, load_inputs
from infra.render import fragment_documents, render_documents


@dataclass(frozen=True)
class Rendered:
    """The objects of one policy and their files (objects plus the fragments beside them)."""

    objects: list[Manifest]
    documents: dict[str, str]


def render_inputs(
    inputs: BundleInputs,
    *,
    target: Target,
    hpa_tolerance: HpaTolerance = "cluster",
    serving: ServingOptions = DEFAULT_SERVING,
) -> Rendered:
    """Every object of validated inputs and the files beside them (the production
    Component, the prometheus-adapter fragment)."""
    objects = build_bundle(
        inputs.policy,
        target=target,
        vllm_args=inputs.vllm_args,
        hpa_tolerance=hpa_tolerance,
        serving=serving,
    )
    return Rendered(objects, render_documents(objects) | fragment_documents(inputs.policy))


def render_policy_file(
    path: Path,
    *,
    target: Target,
    hpa_tolerance: HpaTolerance = "cluster",
    serving: ServingOptions = DEFAULT_SERVING,
) -> dict[str, str]:
    """Load and validate ``path`` (PolicyError on any problem), then render it."""
    inputs = load_inputs(path, serving=serving)
    return render_inputs(
        inputs, target=target, hpa_tolerance=hpa_tolerance, serving=serving
    ).documents

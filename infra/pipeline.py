"""Edge: a policy file -> its rendered documents (what ``render``, ``diff`` and the tuner show)."""

from __future__ import annotations

from pathlib import Path

from infra.builders.nodepools import Target
from infra.builders.workload import HpaTolerance
from infra.bundle import build_bundle
from infra.inputs import load_inputs
from infra.render import fragment_documents, render_documents


def render_policy_file(
    path: Path, *, target: Target, hpa_tolerance: HpaTolerance = "cluster"
) -> dict[str, str]:
    """Load and validate ``path`` (PolicyError on any problem), then render every object and
    the files beside them (the production Component, the prometheus-adapter fragment)."""
    inputs = load_inputs(path)
    objects = build_bundle(
        inputs.policy, target=target, vllm_args=inputs.vllm_args, hpa_tolerance=hpa_tolerance
    )
    return render_documents(objects) | fragment_documents(inputs.policy)

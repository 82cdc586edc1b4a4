"""Edge: a policy file -> its rendered documents (what ``render``, ``diff`` and the tuner show)."""

from __future__ import annotations

from pathlib import Path

from infra.builders.nodepools import Target
from infra.bundle import build_bundle
from infra.inputs import load_inputs
from infra.render import render_documents


def render_policy_file(path: Path, *, target: Target) -> dict[str, str]:
    """Load and validate ``path`` (PolicyError on any problem), then render every object."""
    inputs = load_inputs(path)
    return render_documents(build_bundle(inputs.policy, target=target, vllm_args=inputs.vllm_args))

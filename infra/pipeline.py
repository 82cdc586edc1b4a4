"""Edge: a policy file -> its rendered documents (what ``render``, ``diff`` and the tuner show)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.builders.meta import Manifest
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from infra.inputs import BundleInputs, load_inputs
from infra.render import fragment_documents, render_documents


@dataclass(frozen=True)
class Rendered:
    """The objects of one policy and their files (objects plus the fragments beside them)."""

    objects: list[Manifest]
    documents: dict[str, str]


def render_inputs(inputs: BundleInputs, *, stack: StackOptions) -> Rendered:
    """Every object of validated inputs and the files beside them (the production
    Component, the prometheus-adapter fragment), for the stack's options ``stack``."""
    objects = build_bundle(inputs.policy, stack=stack, vllm_args=inputs.vllm_args)
    return Rendered(objects, render_documents(objects) | fragment_documents(inputs.policy))


def render_policy_file(path: Path, *, stack: StackOptions) -> dict[str, str]:
    """Load and validate ``path`` (PolicyError on any problem; what ``stack.serving`` needs
    is checked, the target's rule on production is not), then render it."""
    inputs = load_inputs(path, serving=stack.serving)
    return render_inputs(inputs, stack=stack).documents

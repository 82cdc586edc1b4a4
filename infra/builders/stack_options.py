"""The stack's options: what the Pulumi stack config chooses beside the policy file
(``gpupool:target``, ``gpupool:hpaTolerance``, ``gpupool:serving`` and
``gpupool:inferenceObjectiveApi``), as one value that ``gpupool render``/``diff``, the Pulumi
program and the what-if all pass on (docs/infra.md "Pulumi")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infra.builders.serving_options import DEFAULT_SERVING, ServingOptions

Target = Literal["labels", "karpenter"]
"""How node pools are declared; chosen in stack config (``gpupool:target``), not in code."""

TARGETS: tuple[Target, ...] = ("labels", "karpenter")
"""Every supported target, in documentation order."""

HpaTolerance = Literal["cluster", "behavior"]
"""Who sets the flex HPAs' tolerance (stack option ``gpupool:hpaTolerance``). ``cluster``: the
controller's ``--horizontal-pod-autoscaler-tolerance`` (10 % by default; every budget step is
sized to pass it, but growth by less than 10 % of the replicas is swallowed). ``behavior``:
``behavior.scaleUp/scaleDown.tolerance: 0`` on each HPA, so every step is taken, the last
replicas of a pool included; needs Kubernetes >= 1.33 with the ``HPAConfigurableTolerance``
feature gate (alpha in 1.33)."""

HPA_TOLERANCES: tuple[HpaTolerance, ...] = ("cluster", "behavior")


@dataclass(frozen=True)
class StackOptions:
    """The stack's options; each default is what a stack that leaves the key unset gets."""

    target: Target = "labels"
    """``gpupool:target``: ``labels`` or ``karpenter`` (``infra.builders.nodepools``)."""
    hpa_tolerance: HpaTolerance = "cluster"
    """``gpupool:hpaTolerance``: ``cluster`` (the controller's flag) or ``behavior``
    (per-HPA tolerance 0; Kubernetes >= 1.33 with HPAConfigurableTolerance)."""
    serving: ServingOptions = DEFAULT_SERVING
    """``gpupool:serving`` (``inference-extension``, ``services`` or ``off``) and
    ``gpupool:inferenceObjectiveApi`` (docs/serving.md "Stack options")."""


DEFAULT_STACK = StackOptions()
"""The options of a stack that sets none: ``labels``, ``cluster``, no serving layer."""

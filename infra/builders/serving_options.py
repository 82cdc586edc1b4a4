"""The serving layer's stack options (``gpupool:serving``, ``gpupool:inferenceObjectiveApi``)
and what each endpoint picker distribution reads (docs/serving.md "Stack options")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ServingMode = Literal["inference-extension", "services", "off"]
"""Stack option ``gpupool:serving`` (``gpupool render --serving``): the Gateway API Inference
Extension, plain Services, or nothing. ``off`` is the default: a stack that upgrades gpupool
renders exactly what it did before, and the other two need components (CRDs, a Gateway) the
cluster may not have."""

SERVING_MODES: tuple[ServingMode, ...] = ("inference-extension", "services", "off")


ObjectiveApi = Literal["inference.networking.x-k8s.io/v1alpha2", "llm-d.ai/v1alpha2"]
"""Stack option ``gpupool:inferenceObjectiveApi``: where InferenceObjective lives, which is
where the endpoint picker that reads it comes from: GIE up to v1.5
(``inference.networking.x-k8s.io``) or llm-d-router, where the picker moved (``llm-d.ai``)."""

OBJECTIVE_APIS: tuple[ObjectiveApi, ...] = (
    "inference.networking.x-k8s.io/v1alpha2",
    "llm-d.ai/v1alpha2",
)


@dataclass(frozen=True)
class ServingOptions:
    """The stack's serving options (docs/serving.md "Stack options")."""

    mode: ServingMode = "off"
    objective_api: ObjectiveApi = "llm-d.ai/v1alpha2"


DEFAULT_SERVING = ServingOptions()
"""The options of a stack that sets neither: nothing is rendered for serving."""


@dataclass(frozen=True)
class Distribution:
    """What one endpoint picker distribution reads and needs."""

    config_api: str
    """``apiVersion`` of its EndpointPickerConfig."""
    objective_groups: tuple[str, ...]
    """API groups in which it watches InferenceObjectives (its Role reads them)."""
    image_field: str
    """The field of ``serving.endpoint_picker.images`` that names its image."""
    objective_headers: tuple[str, ...]
    """Request headers naming the objective that it reads; the route sets them all to one
    value, so a request names one class."""


OBJECTIVE_HEADER = "x-gateway-inference-objective"
"""The header clients name their InferenceObjective in (read by both distributions)."""

DISTRIBUTIONS: dict[ObjectiveApi, Distribution] = {
    "inference.networking.x-k8s.io/v1alpha2": Distribution(
        config_api="inference.networking.x-k8s.io/v1alpha1",
        objective_groups=("inference.networking.x-k8s.io",),
        image_field="gie",
        objective_headers=(OBJECTIVE_HEADER,),
    ),
    # llm-d-router also reads the old group and header (its chart's Role grants both).
    "llm-d.ai/v1alpha2": Distribution(
        config_api="llm-d.ai/v1alpha1",
        objective_groups=("llm-d.ai", "inference.networking.x-k8s.io"),
        image_field="llm_d_router",
        objective_headers=(OBJECTIVE_HEADER, "x-llm-d-inference-objective"),
    ),
}

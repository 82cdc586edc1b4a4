"""The serving layer: which instances serve which model, the traffic classes and their
priorities, and the endpoint picker that routes between them (docs/serving.md).

The scheduling layer decides where instances run; this section decides which requests reach
them. A served model is the pool of its instances: the flex workloads whose ``model`` is the
served model's ``model``, and optionally the owner's production pods of that model. A traffic
class names the tier that serves it and its priority; the endpoint picker sheds the negative
(sheddable) priorities first when the pool saturates. Its saturation thresholds are the
policy's own numbers: KV usage is ``kv_cache.page_table_max_usage``, the number at which an
instance already counts as full everywhere else.

Whether and how this is rendered (the Gateway API Inference Extension, plain Services, or not
at all) is a stack option, not a policy field: it depends on what the cluster runs.
``check_serving`` holds the rules that involve other sections; ``PoolPolicy`` calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from policy.base import (
    DnsLabel,
    DnsSubdomain,
    Invariants,
    LabelKey,
    LabelValue,
    ServiceName,
    StrictModel,
)
from policy.images import ImageReference
from policy.kvcache import KvCache
from policy.priorities import Priorities
from policy.production import ProductionWorkload
from policy.workloads import ModelName, Resources

Tier = Literal["production", "flex"]
"""Which instances serve a traffic class: the owner's production pods or gpupool's flex pods."""

FailureMode = Literal["FailClose", "FailOpen"]
"""What the gateway does while the endpoint picker does not answer (InferencePool
``endpointPickerRef.failureMode``)."""

MODEL_NAME_MAX = 40
"""Longest served-model name: the objects derived from it (``<model>-production-epp``, the
Service ``<model>-<class>`` of the plain-Services mode) must stay DNS labels of 63."""

CLASS_NAME_MAX = 22
"""Longest traffic-class name (``<model>-<class>`` is a Service name in the plain-Services mode:
40 + 1 + 22 = 63)."""

MAX_TRAFFIC_CLASSES = 16
"""Most traffic classes: each is one rule of a pool's HTTPRoute, which holds at most 16."""

INT32 = 2**31
"""InferenceObjective ``priority`` is an int32 (``format: int32`` in llm-d's CRD)."""

ENGINE_METRICS = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
)
"""The metrics contract between the instances and the endpoint picker: what every member of a
pool must export on its serving port's ``/metrics`` (the endpoint picker's defaults for
vLLM; the metric catalogue reads the same waiting-queue and KV-usage series). The queue depth
and KV usage feed the saturation detector and the scorers; an endpoint without them counts as
stale."""


class ServingGateway(StrictModel):
    """The Gateway (Gateway API) the HTTPRoutes attach to; yours, gpupool does not create it."""

    name: DnsSubdomain
    """Gateway name; cluster-specific (``kubectl get gateways -A``)."""
    namespace: DnsLabel
    """Gateway namespace. Its pods (the proxy) call the endpoint picker and then the chosen
    instance, so the NetworkPolicies admit this namespace; its listener must allow routes
    from the flex namespace and from the production namespaces that serve
    (``allowedRoutes.namespaces``)."""
    section_name: DnsSubdomain | None = None
    """Listener of the Gateway the routes attach to (``parentRefs[].sectionName``); unset:
    every listener that admits them."""


class EndpointPickerImages(StrictModel):
    """The endpoint picker image of each distribution; the stack option
    ``gpupool:inferenceObjectiveApi`` selects which one runs."""

    gie: ImageReference = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    """The Gateway API Inference Extension's endpoint picker (v1.5.0, the last release that
    ships it), for ``inference.networking.x-k8s.io/v1alpha2``. Pin it by digest."""
    llm_d_router: ImageReference = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
    """llm-d-router's endpoint picker (where the picker moved after GIE v1.5), for
    ``llm-d.ai/v1alpha2``. Pin it by digest."""


class EndpointPicker(StrictModel):
    """The endpoint picker (EPP) of every pool: its image, size and scheduling configuration."""

    images: EndpointPickerImages = EndpointPickerImages()
    """Image per distribution."""
    resources: Resources = Resources(cpu="1", memory="2Gi")
    """CPU and memory requests and limits of the endpoint picker container."""
    failure_mode: FailureMode = "FailClose"
    """``FailClose``: while the picker is down the gateway rejects the pool's requests (no
    request reaches an instance unscheduled). ``FailOpen``: the gateway picks an instance
    itself, without priorities or shedding."""
    queue_scorer_weight: int = Field(2, ge=0, le=100)
    """Weight of ``queue-scorer`` (prefers instances with fewer waiting requests); 0 leaves it
    out. Defaults are the upstream chart's (2, 2, 3)."""
    kv_cache_scorer_weight: int = Field(2, ge=0, le=100)
    """Weight of ``kv-cache-utilization-scorer`` (prefers instances with free KV blocks)."""
    prefix_cache_scorer_weight: int = Field(3, ge=0, le=100)
    """Weight of ``prefix-cache-scorer`` (prefers the instance that likely holds the prompt's
    prefix in its KV cache); needs ``kv_cache.prefix_caching``."""
    queue_depth_max: int = Field(5, ge=1, le=10_000)
    """Waiting requests (``vllm:num_requests_waiting``) above which an instance counts as
    saturated: the saturation detector's ``queueDepthThreshold``. With every instance of a
    pool saturated, sheddable requests are refused. The policy's one queue-depth threshold:
    the serving layer's alerts are to read it too."""
    metrics_staleness_ms: int = Field(200, ge=10, le=60_000)
    """An instance whose metrics the picker last read longer ago than this counts as
    saturated (fail closed): ``metricsStalenessThreshold``. The picker polls every 50 ms."""

    @model_validator(mode="after")
    def _scores(self) -> EndpointPicker:
        found = Invariants()
        weights = (
            self.queue_scorer_weight,
            self.kv_cache_scorer_weight,
            self.prefix_cache_scorer_weight,
        )
        found.require(
            any(weights),
            "queue_scorer_weight",
            "every scorer weight is 0: the picker would choose instances blindly; expected at "
            "least one weight above 0",
        )
        found.raise_if_any()
        return self


class ProductionInstances(StrictModel):
    """The owner's production pods that serve a model (gpupool does not deploy or relabel
    them: the pool selects them by their own labels)."""

    namespace: DnsLabel
    """Their namespace; one of the ``production`` workloads' namespaces (their pods carry the
    production PriorityClass through gpupool's patch)."""
    pod_labels: dict[LabelKey, LabelValue] = Field(min_length=1)
    """Labels of their pods (the pod template's, not the Deployment's): the pool's selector."""
    port: int = Field(ge=1, le=65535)
    """Port of their OpenAI-compatible server, which also serves ``/metrics`` (vLLM does)."""


class ServedModel(StrictModel):
    """One model and the instances that serve it."""

    name: ServiceName = Field(max_length=MODEL_NAME_MAX)
    """Name of its pools and objects (``<name>-flex``, ``<name>-production``); a DNS-1035
    label of at most 40 characters."""
    model: ModelName
    """The model id requests name; the flex workloads whose ``model`` equals it serve it."""
    production: ProductionInstances | None = None
    """Its production pods, if the owner runs some; unset: served by flex instances only."""


class TrafficClass(StrictModel):
    """A class of requests: who serves it and how important it is."""

    name: DnsLabel = Field(max_length=CLASS_NAME_MAX)
    """Class name; the InferenceObjective of model M is ``<M>-<name>``, which clients name
    in the ``x-gateway-inference-objective`` header."""
    priority: int = Field(ge=-INT32, lt=INT32)
    """InferenceObjective priority: higher is served first; negative is sheddable (refused
    first when the pool saturates). Production traffic is above 0."""
    served_by: Tier
    """The instances that serve it: ``production`` (the owner's pods) or ``flex`` (evicted
    whenever production needs the GPUs, so only for sheddable classes)."""

    @property
    def sheddable(self) -> bool:
        """Whether the endpoint picker refuses this class first when its pool saturates: a
        negative priority (the picker's ``IsSheddable``)."""
        return self.priority < 0


def _default_classes() -> list[TrafficClass]:
    return [
        TrafficClass(name="production", priority=100, served_by="production"),
        TrafficClass(name="batch", priority=-10, served_by="flex"),
    ]


class Serving(StrictModel):
    """The serving layer: models, traffic classes, the gateway and the endpoint picker."""

    gateway: ServingGateway
    """The Gateway the routes attach to (cluster-specific)."""
    endpoint_picker: EndpointPicker = EndpointPicker()
    """The endpoint picker of every pool."""
    models: list[ServedModel] = Field(min_length=1)
    """The served models."""
    traffic_classes: list[TrafficClass] = Field(
        default_factory=_default_classes, min_length=1, max_length=MAX_TRAFFIC_CLASSES
    )
    """Traffic classes; default ``production`` (100, production pods) and ``batch`` (-10,
    flex pods)."""
    retry_after_s: int | None = Field(None, ge=1, le=3600)
    """``Retry-After`` (seconds) the routes of sheddable classes set on their responses:
    rendered as the HTTPRoute's ``ResponseHeaderModifier`` filter, which Gateway API marks
    Extended (a gateway without it rejects the route), so it is off by default. It reaches what
    the instances answer; on Envoy-based gateways it does not reach the endpoint picker's own
    429 at saturation, an immediate response that Envoy sends as a local reply without route
    response headers, and neither picker sets the header itself (docs/serving.md, "What a
    client gets"). Every response of those routes carries it, 2xx included, where clients
    ignore it."""

    def objective_name(self, model: ServedModel, traffic_class: TrafficClass) -> str:
        """The InferenceObjective (and plain-mode Service) of one class of one model."""
        return f"{model.name}-{traffic_class.name}"

    @model_validator(mode="after")
    def _names(self) -> Serving:
        found = Invariants()
        for field, items in (("models", self.models), ("traffic_classes", self.traffic_classes)):
            names = [item.name for item in items]
            for i, name in enumerate(names):
                found.require(
                    name not in names[:i], f"{field}.{i}.name", f"name {name!r} is repeated"
                )
        ids = [m.model for m in self.models]
        for i, model in enumerate(ids):
            found.require(
                model not in ids[:i],
                f"models.{i}.model",
                f"model {model!r} is served twice; expected one entry per model id",
            )
        owner: dict[str, str] = {}
        for m in self.models:
            for c in self.traffic_classes:
                name = self.objective_name(m, c)
                other = owner.setdefault(name, f"{m.name}/{c.name}")
                found.require(
                    other == f"{m.name}/{c.name}",
                    "traffic_classes",
                    f"model {m.name!r} and class {c.name!r} give the InferenceObjective name "
                    f"{name!r}, which {other} already has; expected names whose "
                    "'<model>-<class>' differ",
                )
        found.raise_if_any()
        return self


def check_serving(
    serving: Serving | None,
    priorities: Priorities,
    kv: KvCache,
    production: Sequence[ProductionWorkload],
    found: Invariants,
) -> None:
    """Add to ``found`` every broken serving rule that involves another section (the
    sections as arguments, so this module needs none of ``PoolPolicy``).

    None reads ``workloads``: the sidecars' policy ConfigMap drops them and must still load.
    What a serving mode needs of the workloads (one port per pool) is checked where the mode
    is known, by ``infra.inputs.load_inputs``."""
    if serving is None:
        return
    idle = priorities.idle_inference
    for i, c in enumerate(serving.traffic_classes):
        found.require(
            c.served_by != "flex" or c.sheddable,
            f"serving.traffic_classes.{i}.priority",
            f"class {c.name!r} is served only by flex instances, which run as PriorityClass "
            f"{idle.name!r} ({idle.value}) and are evicted whenever production needs the "
            f"GPUs, but its priority {c.priority} is not sheddable; expected a negative "
            "priority, or served_by: production",
        )
    # page_table_max_usage, the picker's kvCacheUtilThreshold, lies in (0, 1] as it requires:
    # KvCache keeps it above compaction_usage_below >= 0.
    picker = serving.endpoint_picker
    found.require(
        picker.prefix_cache_scorer_weight == 0 or kv.prefix_caching,
        "serving.endpoint_picker.prefix_cache_scorer_weight",
        f"prefix_cache_scorer_weight is {picker.prefix_cache_scorer_weight} but "
        "kv_cache.prefix_caching is off: no instance keeps a prefix to find; expected weight "
        "0 or prefix_caching: true",
    )
    _check_production(production, serving, found)


def _check_production(
    production: Sequence[ProductionWorkload], serving: Serving, found: Invariants
) -> None:
    """Production instances are production workloads' pods, and no pool takes another's."""
    production_namespaces = sorted({w.namespace for w in production})
    for i, m in enumerate(serving.models):
        if m.production is None:
            continue
        at, mine = f"serving.models.{i}.production", m.production
        found.require(
            mine.namespace in production_namespaces,
            f"{at}.namespace",
            f"namespace {mine.namespace!r} holds no production workload (namespaces of "
            f"production: {production_namespaces}): production instances are the owner's "
            "pods that gpupool's patch gives the production PriorityClass; expected one of "
            "those namespaces",
        )
        for k, other in enumerate(serving.models[:i]):
            theirs = other.production
            found.require(
                theirs is None
                or theirs.namespace != mine.namespace
                or not (
                    theirs.pod_labels.items() <= mine.pod_labels.items()
                    or mine.pod_labels.items() <= theirs.pod_labels.items()
                ),
                f"{at}.pod_labels",
                f"models {other.name!r} (serving.models.{k}) and {m.name!r} select production "
                f"pods in {mine.namespace!r} with labels one of which contains the other: the "
                "pool of one would take the other's pods; expected labels that tell them apart",
            )

"""The serving layer's pools: per served model and tier, the instances one InferencePool
(or one Service per traffic class) routes to, and what keeps a policy from being served."""

from __future__ import annotations

from dataclasses import dataclass

from infra.builders.meta import Manifest, metadata
from infra.builders.serving_options import ServingOptions
from policy import PoolPolicy
from policy.serving import ServedModel, Serving, Tier, TrafficClass
from policy.workloads import FlexWorkload

COMPONENT = "serving"
"""``app.kubernetes.io/component`` of the serving objects."""

MODEL_LABEL = "gpupool.io/model"
"""Pod label of the flex pods of a served model (value: ``serving.models[].name``); the flex
pool selects it. Production pods are selected by their own labels (``pod_labels``)."""


class ServingProblem(ValueError):
    """The policy cannot be served in the stack's serving mode (``serving_problems`` says
    why; ``infra.inputs.load_inputs`` reports the same at the policy's lines first)."""


@dataclass(frozen=True)
class Pool:
    """The instances of one tier that serve one model, in one namespace."""

    name: str
    namespace: str
    tier: Tier
    model: ServedModel
    selector: dict[str, str]
    """Pod labels every member carries (the InferencePool's and the Services' selector)."""
    port: int
    """The members' serving port (InferencePool ``targetPorts``)."""
    classes: tuple[TrafficClass, ...]
    """The traffic classes this tier serves."""

    @property
    def picker(self) -> str:
        """Name of the pool's endpoint picker (Deployment, Service, ConfigMap, RBAC)."""
        return f"{self.name}-epp"


def served_model(policy: PoolPolicy, workload: FlexWorkload) -> ServedModel | None:
    """The served model ``workload`` is an instance of, if any."""
    serving = policy.serving
    models = serving.models if serving is not None else []
    return next((m for m in models if m.model == workload.model), None)


def flex_pod_labels(policy: PoolPolicy, workload: FlexWorkload) -> dict[str, str]:
    """The pod label that puts ``workload``'s pods in their model's flex pool (none if the
    model is not served)."""
    model = served_model(policy, workload)
    return {MODEL_LABEL: model.name} if model is not None else {}


def pools(policy: PoolPolicy) -> list[Pool]:
    """Every pool: per served model, its flex instances and its production instances, each
    where some traffic class is served by that tier (a pool nobody routes to is left out)."""
    serving = policy.serving
    if serving is None:
        return []
    out = []
    for model in serving.models:
        flex = [w for w in policy.workloads if w.model == model.model]
        members: list[tuple[Tier, str, dict[str, str], int]] = []
        if flex:
            ns = policy.cluster.flex_namespace
            members.append(("flex", ns, {MODEL_LABEL: model.name}, flex[0].port))
        if model.production is not None:
            prod = model.production
            members.append(("production", prod.namespace, dict(prod.pod_labels), prod.port))
        for tier, namespace, selector, port in members:
            classes = tuple(c for c in serving.traffic_classes if c.served_by == tier)
            if classes:
                name = f"{model.name}-{tier}"
                out.append(Pool(name, namespace, tier, model, selector, port, classes))
    return out


NOT_CONFIGURED = (
    "the stack option gpupool:serving (gpupool render --serving) asks for a serving layer but "
    "the policy has no serving section; expected one (docs/serving.md) or serving off"
)


def serving_problems(policy: PoolPolicy, options: ServingOptions) -> list[tuple[str, str]]:
    """``(field path, message)`` for what keeps ``policy`` from being served in
    ``options.mode``: no ``serving`` section, or flex workloads of one model on different
    ports (a pool, and a class's Service, send to one port on every member). Nothing when
    off: these rules involve the workloads, so they cannot be policy invariants (the
    sidecars' policy ConfigMap drops the workloads and must still load)."""
    if options.mode == "off":
        return []
    if policy.serving is None:
        return [("serving", NOT_CONFIGURED)]
    found: list[tuple[str, str]] = []
    first: dict[str, tuple[str, int]] = {}
    for i, w in enumerate(policy.workloads):
        model = served_model(policy, w)
        if model is None:
            continue
        name, port = first.setdefault(model.name, (w.name, w.port))
        if port != w.port:
            found.append(
                (
                    f"workloads.{i}.port",
                    f"workload {w.name!r} serves model {model.name!r} on port {w.port} and "
                    f"workload {name!r} on {port}: a pool sends to one port on every member "
                    f"(InferencePool targetPorts); expected port {port}",
                )
            )
    return found


def require_serving(policy: PoolPolicy) -> Serving:
    """The policy's ``serving`` section; ServingProblem when it has none."""
    if policy.serving is None:
        raise ServingProblem(NOT_CONFIGURED)
    return policy.serving


def serving_meta(name: str, namespace: str) -> Manifest:
    """Metadata of a serving object: its own name as the instance, component ``serving``."""
    return metadata(name, COMPONENT, namespace=namespace, instance=name)

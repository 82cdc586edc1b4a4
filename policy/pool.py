"""The root policy: every section plus the rules that span sections."""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from policy.alerting import Alerting
from policy.base import DnsLabel, Invariants, StrictModel
from policy.disruption import Disruption
from policy.elastic import Autoscaling, ElasticThresholds
from policy.kvcache import KvCache
from policy.metrics import MetricSources
from policy.nodepools import NodePool
from policy.priorities import Priorities
from policy.production import ProductionWorkload
from policy.tuner import Tuner
from policy.workloads import FlexWorkload

_LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A Kubernetes label key: optional DNS-subdomain prefix and ``/``, then a name."""


class Cluster(StrictModel):
    """Names that tie the bundle to one cluster."""

    name: DnsLabel
    """Cluster name; a label on every alert so multi-cluster Alertmanagers can tell them apart."""
    flex_namespace: DnsLabel = "gpupool-flex"
    """Namespace of the flex vLLM workloads."""
    system_namespace: DnsLabel = "gpupool-system"
    """Namespace of the tuner and the monitoring objects (compaction runs inside flex pods)."""
    pool_label: str = Field("gpupool.io/pool", pattern=_LABEL_KEY)
    """Node label (and taint key) whose value is the node pool's name."""
    runtime_image: str = Field("gpupool/gpupool:0.1.0", min_length=1)
    """Image of gpupool's own runtime components (the tuner); it contains the ``gpupool`` CLI."""
    prometheus_url: str = Field(
        "http://prometheus-operated.monitoring.svc:9090", pattern=r"^https?://\S+$"
    )
    """Prometheus the tuner queries (in-cluster URL; prometheus-operator's default Service)."""
    tuner_port: int = Field(9095, ge=1024, le=65535)
    """Port of the tuner's HTTP listener (Alertmanager webhook, metrics) and of its Service."""


class PoolPolicy(StrictModel):
    """gpupool's single source of truth; every manifest, rule and argument is derived from it."""

    cluster: Cluster
    """Cluster identity and namespaces."""
    node_pools: list[NodePool] = Field(min_length=2)
    """Exactly one ``prod`` pool and at least one ``flex`` pool."""
    priorities: Priorities = Priorities()
    """The three PriorityClasses."""
    elastic: ElasticThresholds = ElasticThresholds()
    """Grow / shed band on cluster GPU utilization."""
    autoscaling: Autoscaling = Autoscaling()
    """HPA behaviour of flex workloads."""
    disruption: Disruption = Disruption()
    """PDB, spreading and the termination budget of flex pods."""
    kv_cache: KvCache = KvCache()
    """Paged KV cache of flex vLLM instances."""
    alerting: Alerting
    """Alert thresholds and Alertmanager routing."""
    metrics: MetricSources = MetricSources()
    """Label names and windows of the metric sources the catalogue queries."""
    tuner: Tuner = Tuner()
    """The in-cluster tuner's policy repository, forge and Secret references."""
    workloads: list[FlexWorkload] = Field(default_factory=list)
    """Flex inference workloads."""
    production: list[ProductionWorkload] = Field(default_factory=list)
    """The cluster owner's production workloads, by reference (gpupool does not deploy them):
    what they need to take GPUs back from flex is rendered for them (docs/infra.md
    "Production workloads")."""

    @property
    def prod_pool(self) -> NodePool:
        """The guaranteed pool (validation ensures there is exactly one)."""
        return next(p for p in self.node_pools if p.role == "prod")

    @property
    def flex_pools(self) -> list[NodePool]:
        """The elastic pools flex workloads may use."""
        return [p for p in self.node_pools if p.role == "flex"]

    def pool_of(self, workload: FlexWorkload) -> NodePool:
        """The flex pool ``workload`` runs on (validation ensures it exists and is flex)."""
        return next(p for p in self.flex_pools if p.name == workload.pool)

    @model_validator(mode="after")
    def _consistent(self) -> PoolPolicy:
        found = Invariants()
        names = [p.name for p in self.node_pools]
        roles = [p.role for p in self.node_pools]
        found.require(
            roles.count("prod") == 1,
            "node_pools",
            f"expected exactly one pool with role prod, found {roles.count('prod')}",
        )
        found.require(
            roles.count("flex") >= 1, "node_pools", "expected at least one pool with role flex"
        )
        for i, name in enumerate(names):
            found.require(
                name not in names[:i], f"node_pools.{i}.name", f"pool name {name!r} is repeated"
            )
        for i, pool in enumerate(self.node_pools):
            pool.check(f"node_pools.{i}", found)
        flex_names = {p.name for p in self.node_pools if p.role == "flex"}
        seen: set[str] = set()
        for i, w in enumerate(self.workloads):
            at = f"workloads.{i}"
            found.require(w.name not in seen, f"{at}.name", f"workload name {w.name!r} is repeated")
            seen.add(w.name)
            found.require(
                w.pool in flex_names,
                f"{at}.pool",
                f"workload {w.name!r} names pool {w.pool!r}, which is not a flex pool "
                f"(flex pools: {sorted(flex_names)})",
            )
            found.require(
                self.disruption.pdb_min_available < w.max_replicas,
                f"{at}.max_replicas",
                f"workloads[{w.name}].max_replicas ({w.max_replicas}) <= "
                f"disruption.pdb_min_available ({self.disruption.pdb_min_available}): the PDB "
                "could never allow an eviction; lower pdb_min_available or raise max_replicas",
            )
            host = next((p for p in self.node_pools if p.name == w.pool), None)
            found.require(
                host is None or w.gpus_per_replica <= host.gpus_per_node,
                f"{at}.gpus_per_replica",
                f"workload {w.name!r} needs {w.gpus_per_replica} GPUs per replica but nodes of "
                f"pool {w.pool!r} have {host.gpus_per_node if host else '?'}",
            )
        self._check_production(found)
        found.raise_if_any()
        return self

    def _check_production(self, found: Invariants) -> None:
        """Rules between ``production`` and the pools (the reserve as production's headroom).

        The prod pool's ``reserve_ratio`` is production's burst headroom: the production floor
        (every ``min_replicas * gpus_per_replica``) must fit on the prod pool outside the
        reserve, so scaling up from the floor starts in the reserve with no preemption. (A
        production HPA's duty-cycle target is not tied to it: the reserve counts GPUs, the
        target a GPU's busy time.) The ceiling (every
        ``max_replicas * gpus_per_replica``) must fit on the prod and flex pools together:
        production may only land on gpupool pools, so more could never be scheduled.
        """
        if sum(1 for p in self.node_pools if p.role == "prod") != 1:
            return  # reported above; the capacity rules need the one prod pool
        prod = self.prod_pool
        # The catalogue reserves floor(GPUs x reserve_ratio) of a pool (headroom query).
        reserved_out = prod.gpu_capacity - math.floor(prod.gpu_capacity * prod.reserve_ratio)
        ceiling = prod.gpu_capacity + sum(p.gpu_capacity for p in self.flex_pools)
        system = {self.cluster.flex_namespace, self.cluster.system_namespace}
        refs: set[tuple[str, str, str]] = set()
        hpa_names: dict[str, str] = {}
        floor = peak = 0
        for i, w in enumerate(self.production):
            at = f"production.{i}"
            found.require(
                w.namespace not in system,
                f"{at}.namespace",
                f"production workload {w.ref} is in gpupool's own namespace "
                f"{w.namespace!r} (flex: {self.cluster.flex_namespace!r}, system: "
                f"{self.cluster.system_namespace!r}); production lives in the owner's namespaces",
            )
            key = (w.namespace, w.kind, w.name or "{" + w.label_selector + "}")
            found.require(key not in refs, f"{at}.name", f"production workload {w.ref} is repeated")
            refs.add(key)
            found.require(
                w.gpus_per_replica <= prod.gpus_per_node,
                f"{at}.gpus_per_replica",
                f"production workload {w.ref} needs {w.gpus_per_replica} GPUs per replica but "
                f"nodes of the prod pool {prod.name!r} have {prod.gpus_per_node}",
            )
            if w.renders_hpa and w.name is not None:
                other = hpa_names.setdefault(w.name, w.namespace)
                found.require(
                    other == w.namespace,
                    f"{at}.name",
                    f"production HPAs in {other!r} and {w.namespace!r} are both named "
                    f"{w.name!r}; the Pulumi program names them {w.name}-hpa in one component, "
                    "so production workloads with scale_on: gpu_utilization need distinct names",
                )
            # Each sum is reported once: at the workload that takes it over the limit.
            before, floor = floor, floor + w.min_replicas * w.gpus_per_replica
            found.require(
                floor <= reserved_out or before > reserved_out,
                f"{at}.min_replicas",
                f"production's floor reaches {floor} GPUs (sum of min_replicas x "
                f"gpus_per_replica up to {w.ref}) but the prod pool {prod.name!r} has "
                f"{reserved_out} outside its reserve ({prod.gpu_capacity} GPUs, reserve_ratio "
                f"{prod.reserve_ratio}); lower min_replicas, raise max_nodes or lower "
                "reserve_ratio",
            )
            before, peak = peak, peak + w.max_replicas * w.gpus_per_replica
            found.require(
                peak <= ceiling or before > ceiling,
                f"{at}.max_replicas",
                f"production's ceiling reaches {peak} GPUs (sum of max_replicas x "
                f"gpus_per_replica up to {w.ref}) but the prod and flex pools hold {ceiling}; "
                "replicas beyond that could never be scheduled: lower max_replicas or raise "
                "the pools' max_nodes",
            )

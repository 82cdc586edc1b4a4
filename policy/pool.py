"""The root policy: every section plus the rules that span sections."""

from __future__ import annotations

from collections import Counter

from pydantic import Field, model_validator

from policy.alerting import Alerting
from policy.base import (
    MAX_REPLICAS,
    DnsLabel,
    HttpUrlText,
    Invariants,
    NamespaceName,
    NodeLabelKey,
    StrictModel,
)
from policy.disruption import Disruption
from policy.elastic import Autoscaling, ElasticThresholds
from policy.images import ImageReference
from policy.karpenter import karpenter_seconds
from policy.kvcache import KvCache
from policy.metrics import MetricSources
from policy.network import Network
from policy.nodepools import NodePool, PoolReserve
from policy.priorities import Priorities
from policy.production import ProductionWorkload
from policy.serving import Serving, check_serving
from policy.tuner import Tuner
from policy.workloads import FlexWorkload


class Cluster(StrictModel):
    """Names that tie the bundle to one cluster."""

    name: DnsLabel
    """Cluster name; a label on every alert so multi-cluster Alertmanagers can tell them apart."""
    flex_namespace: NamespaceName = "gpupool-flex"
    """Namespace of the flex vLLM workloads (not ``default`` or ``kube-*``)."""
    system_namespace: NamespaceName = "gpupool-system"
    """Namespace of the tuner and the monitoring objects (compaction runs inside flex pods);
    not ``default`` or ``kube-*``, and not the flex namespace."""
    pool_label: NodeLabelKey = "gpupool.io/pool"
    """Node label (and taint key) whose value is the node pool's name; not under
    ``kubernetes.io``, ``k8s.io`` or ``karpenter.sh`` (reserved)."""
    runtime_image: ImageReference
    """Image of gpupool's own runtime components (the tuner, the KV sidecars); it contains the
    ``gpupool`` CLI. Yours to build (``infra/images/runtime.Dockerfile``) and push, so no
    default. Pin it by digest (``REPOSITORY@sha256:<digest>``): a tag-only image is a warning."""
    image_pull_secrets: list[DnsLabel] = Field(default_factory=list)
    """``imagePullSecrets`` of every pod gpupool renders (private registries); each Secret
    must exist in both gpupool namespaces."""
    prometheus_url: HttpUrlText = "http://prometheus-operated.monitoring.svc:9090"
    """Prometheus the tuner queries (in-cluster URL; prometheus-operator's default Service)."""
    tuner_port: int = Field(9095, ge=1024, le=65535)
    """Port of the tuner's webhook listener (Alertmanager) and of its Service."""
    tuner_ops_port: int = Field(9096, ge=1024, le=65535)
    """Port of the tuner's health and metrics listener (kubelet probes, Prometheus); its own
    port so that no client of the webhook can starve the probes."""

    @model_validator(mode="after")
    def _distinct_ports(self) -> Cluster:
        found = Invariants()
        found.require(
            self.tuner_ops_port != self.tuner_port,
            "tuner_ops_port",
            f"expected a port other than cluster.tuner_port ({self.tuner_port})",
        )
        found.raise_if_any()
        return self


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
    tuner: Tuner
    """The in-cluster tuner's policy repository (``policy_repo_url``: required), forge and
    Secret references."""
    network: Network = Network()
    """Who may reach gpupool's pods (the NetworkPolicies' peers)."""
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
        """The flex pool ``workload`` prefers (validation ensures it exists and is flex)."""
        return next(p for p in self.flex_pools if p.name == workload.pool)

    @property
    def lending_pools(self) -> list[NodePool]:
        """The prod pools that lend their unallocated GPUs beyond the reserve to flex."""
        return [p for p in self.node_pools if p.role == "prod" and p.lend_idle]

    @property
    def harvest_pools(self) -> list[NodePool]:
        """Every pool flex may run on: the flex pools, then the pools that lend."""
        return [*self.flex_pools, *self.lending_pools]

    def pools_for(self, workload: FlexWorkload) -> list[NodePool]:
        """Every pool ``workload``'s replicas may run on, preferred first: its flex pool,
        then each pool that lends. Renderers, the budget and the what-if all read this."""
        return [self.pool_of(workload), *self.lending_pools]

    def sharing(self) -> dict[str, int]:
        """Per flex workload, the workloads (itself included) whose pools overlap its own:
        the budget splits a pool's room over them. With lending every workload shares the
        lending pools. Counted per distinct set of pools, so linear in the workloads."""
        pools = {w.name: frozenset(p.name for p in self.pools_for(w)) for w in self.workloads}
        per_set = Counter(pools.values())
        return {
            name: sum(n for other, n in per_set.items() if mine & other)
            for name, mine in pools.items()
        }

    def replica_capacity(self, workload: FlexWorkload) -> int:
        """Replicas of ``workload`` its pools hold when full: whole replicas per node, every
        pool at ``max_nodes`` (at most ``MAX_REPLICAS``)."""
        g = workload.gpus_per_replica
        fit = sum(p.max_nodes * (p.gpus_per_node // g) for p in self.pools_for(workload))
        return min(fit, MAX_REPLICAS)

    def replica_bound(self, workload: FlexWorkload) -> int:
        """The HPA's ``maxReplicas``: ``max_replicas``, or ``replica_capacity`` for ``auto``
        (at least ``min_replicas``)."""
        if workload.max_replicas != "auto":
            return workload.max_replicas
        return max(self.replica_capacity(workload), workload.min_replicas)

    def reserve_of(self, pool: NodePool) -> PoolReserve:
        """``pool``'s reserve, its slot size resolved from the production workload it names."""
        if pool.reserve is None:
            return PoolReserve(ratio=pool.reserve_ratio)
        slot = next(
            (w.gpus_per_replica for w in self.production if w.slot_ref == pool.reserve.of), 1
        )
        return PoolReserve(slots=pool.reserve.replicas, slot_gpus=slot)

    @model_validator(mode="after")
    def _consistent(self) -> PoolPolicy:
        found = Invariants()
        self._check_roles(found)
        self._check_pool_names(found)
        for i, pool in enumerate(self.node_pools):
            pool.check(f"node_pools.{i}", found)
            self._check_node_pool(i, pool, found)
        self._check_currencies(found)
        self._check_names(found)
        self._check_workloads(found)
        self._check_production(found)
        found.raise_if_any()
        return self

    def _check_roles(self, found: Invariants) -> None:
        """Exactly one guaranteed pool, at least one elastic one."""
        roles = [p.role for p in self.node_pools]
        found.require(
            roles.count("prod") == 1,
            "node_pools",
            f"expected exactly one pool with role prod, found {roles.count('prod')}",
        )
        found.require(
            roles.count("flex") >= 1, "node_pools", "expected at least one pool with role flex"
        )

    def _check_pool_names(self, found: Invariants) -> None:
        """A pool name is the value of the pool label: two pools cannot share it."""
        names = [p.name for p in self.node_pools]
        for i, name in enumerate(names):
            found.require(
                name not in names[:i], f"node_pools.{i}.name", f"pool name {name!r} is repeated"
            )

    def _check_workloads(self, found: Invariants) -> None:
        """Each flex workload against the pools, the disruption budget and the KV cache (the
        rules of one workload reported together, in the order of the workloads)."""
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
            self._check_evictable(at, w, found)
            self._check_compaction_preservation(at, w, found)
            self._check_snapshot_volume(at, w, found)
            self._check_sidecar_port(at, w, found)
            self._check_replica_fits(at, w, found)

    def _check_evictable(self, at: str, w: FlexWorkload, found: Invariants) -> None:
        """At ``min_replicas`` the PDB must still allow one eviction, or drains block."""
        found.require(
            self.disruption.pdb_min_available < w.min_replicas,
            f"{at}.min_replicas",
            f"workloads[{w.name}].min_replicas ({w.min_replicas}) <= "
            f"disruption.pdb_min_available ({self.disruption.pdb_min_available}): at "
            "min_replicas the PDB allows no eviction, so every node drain and Karpenter "
            "disruption blocks (scheduler preemption honours PDBs only best-effort, so it "
            f"does not protect flex either); expected pdb_min_available below "
            f"{w.min_replicas}: lower it or raise min_replicas",
        )

    def _check_compaction_preservation(self, at: str, w: FlexWorkload, found: Invariants) -> None:
        """Compaction and the offloading connector both own block ids: one at a time."""
        found.require(
            not w.kv_compaction or self.kv_cache.kv_preservation == "off",
            f"{at}.kv_compaction",
            f"workload {w.name!r} turns kv_compaction on while kv_cache.kv_preservation is "
            f"{self.kv_cache.kv_preservation!r}: vLLM's OffloadingConnector holds block ids "
            "and the KV buffer, which compaction and shrink change under it (stale blocks "
            "stored under correct prefix hashes); expected kv_compaction: false or "
            "kv_preservation: off",
        )

    def _check_snapshot_volume(self, at: str, w: FlexWorkload, found: Invariants) -> None:
        """The snapshot PVC that ``filesystem`` preservation renders can be bound by every
        replica: it has a StorageClass, and an access mode several nodes may share."""
        if self.kv_cache.kv_preservation != "filesystem":
            return
        found.require(
            w.snapshot_volume.storage_class is not None,
            f"{at}.snapshot_volume.storage_class",
            f"kv_cache.kv_preservation: filesystem gives workload {w.name!r} a snapshot "
            "PersistentVolumeClaim, which needs a StorageClass; expected "
            "snapshot_volume.storage_class (`kubectl get storageclass`)",
        )
        found.require(
            w.max_replicas == 1 or w.snapshot_volume.access_mode == "ReadWriteMany",
            f"{at}.snapshot_volume.access_mode",
            f"workload {w.name!r} shares its snapshot volume ({w.snapshot_volume.access_mode}) "
            f"among up to {w.max_replicas} replicas (auto: as many as the pools hold), "
            "which land on several nodes: "
            "ReadWriteOncePod admits one pod, ReadWriteOnce one node, so the others never "
            "start (Multi-Attach error); expected ReadWriteMany (a storage class such as "
            "NFS, CephFS, EFS, Filestore, Azure Files) or max_replicas: 1",
        )

    def _check_sidecar_port(self, at: str, w: FlexWorkload, found: Invariants) -> None:
        """vLLM and the compaction sidecar share the pod's network: distinct ports."""
        found.require(
            not w.kv_compaction or w.port != self.kv_cache.compaction_sidecar_port,
            f"{at}.port",
            f"workload {w.name!r} serves vLLM on port {w.port}, the port of the KV "
            "compaction sidecar in the same pod (kv_cache.compaction_sidecar_port); "
            "expected a different port",
        )

    def _check_replica_fits(self, at: str, w: FlexWorkload, found: Invariants) -> None:
        """One replica's GPUs fit on one node of its pool."""
        host = next((p for p in self.node_pools if p.name == w.pool), None)
        found.require(
            host is None or w.gpus_per_replica <= host.gpus_per_node,
            f"{at}.gpus_per_replica",
            f"workload {w.name!r} needs {w.gpus_per_replica} GPUs per replica but nodes of "
            f"pool {w.pool!r} have {host.gpus_per_node if host else '?'}",
        )

    def _check_node_pool(self, i: int, pool: NodePool, found: Invariants) -> None:
        """What a pool's node settings must agree with elsewhere in the policy."""
        for j, taint in enumerate(pool.taints):
            found.require(
                taint.key != self.cluster.pool_label,
                f"node_pools.{i}.taints.{j}.key",
                f"taint key {taint.key!r} is cluster.pool_label, the key of the pool taint "
                "gpupool sets itself (a node cannot carry one key and effect twice); expected "
                "another key",
            )
        grace = pool.karpenter.termination_grace_period
        found.require(
            grace is None or karpenter_seconds(grace) >= self.disruption.termination_grace_s,
            f"node_pools.{i}.karpenter.termination_grace_period",
            f"termination_grace_period {grace!r} is shorter than disruption.termination_grace_s "
            f"({self.disruption.termination_grace_s} s): Karpenter would kill draining flex "
            "pods before their preStop, drain and KV snapshot finish; expected at least "
            f"{self.disruption.termination_grace_s}s",
        )

    def _check_names(self, found: Invariants) -> None:
        """Names two objects would share: the namespaces and a node in two pools.

        Names derived from workloads (``<name>-kv-compaction``, ...) are checked against the
        rendered objects by ``infra.inputs``, which knows the builders."""
        cluster = self.cluster
        found.require(
            cluster.flex_namespace != cluster.system_namespace,
            "cluster.system_namespace",
            f"system_namespace equals flex_namespace ({cluster.flex_namespace!r}): the tuner's "
            "and the flex workloads' objects would share names and NetworkPolicies; expected "
            "two different namespaces",
        )
        first: dict[str, tuple[int, int]] = {}  # node -> (pool, entry) listing it first
        for i, pool in enumerate(self.node_pools):
            for j, node in enumerate(pool.nodes):
                other, _ = first.setdefault(node, (i, j))
                name = self.node_pools[other].name
                where = "twice in this pool" if other == i else f"in pool {name!r} too"
                found.require(
                    first[node] == (i, j),
                    f"node_pools.{i}.nodes.{j}",
                    f"node {node!r} is listed {where}: its label and taint have one value, so "
                    "a node belongs to exactly one pool; expected each node once",
                )

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
        self._check_reserves(found)
        refs: set[tuple[str, str, str]] = set()
        hpa_names: dict[str, str] = {}
        floor = peak = 0
        for i, w in enumerate(self.production):
            at = f"production.{i}"
            self._check_production_ref(at, w, refs, found)
            self._check_production_fits(at, w, found)
            self._check_hpa_name(at, w, hpa_names, found)
            # Each sum is reported once: at the workload that takes it over the limit.
            before, floor = floor, floor + w.min_replicas * w.gpus_per_replica
            self._check_production_floor(at, w, before, floor, found)
            before, peak = peak, peak + w.max_replicas * w.gpus_per_replica
            self._check_production_ceiling(at, w, before, peak, found)

    def _check_production_ref(
        self, at: str, w: ProductionWorkload, refs: set[tuple[str, str, str]], found: Invariants
    ) -> None:
        """A production reference lies outside gpupool's namespaces and is given once
        (``refs``: the references seen so far, this one added)."""
        found.require(
            w.namespace not in {self.cluster.flex_namespace, self.cluster.system_namespace},
            f"{at}.namespace",
            f"production workload {w.ref} is in gpupool's own namespace "
            f"{w.namespace!r} (flex: {self.cluster.flex_namespace!r}, system: "
            f"{self.cluster.system_namespace!r}); production lives in the owner's namespaces",
        )
        key = (w.namespace, w.kind, w.name or "{" + w.label_selector + "}")
        found.require(key not in refs, f"{at}.name", f"production workload {w.ref} is repeated")
        refs.add(key)

    def _check_production_fits(self, at: str, w: ProductionWorkload, found: Invariants) -> None:
        """One production replica's GPUs fit on one node of the prod pool."""
        prod = self.prod_pool
        found.require(
            w.gpus_per_replica <= prod.gpus_per_node,
            f"{at}.gpus_per_replica",
            f"production workload {w.ref} needs {w.gpus_per_replica} GPUs per replica but "
            f"nodes of the prod pool {prod.name!r} have {prod.gpus_per_node}",
        )

    def _check_hpa_name(
        self, at: str, w: ProductionWorkload, hpa_names: dict[str, str], found: Invariants
    ) -> None:
        """Rendered production HPAs have distinct names (``hpa_names``: name -> namespace of
        the first one seen)."""
        if not w.renders_hpa or w.name is None:
            return
        other = hpa_names.setdefault(w.name, w.namespace)
        found.require(
            other == w.namespace,
            f"{at}.name",
            f"production HPAs in {other!r} and {w.namespace!r} are both named "
            f"{w.name!r}; the Pulumi program names them {w.name}-hpa in one component, "
            "so production workloads with scale_on: gpu_utilization need distinct names",
        )

    def _check_production_floor(
        self, at: str, w: ProductionWorkload, before: int, floor: int, found: Invariants
    ) -> None:
        """The floor up to ``w`` (``before`` without it) fits the prod pool outside its
        reserve; reported at the workload that crosses the limit."""
        prod = self.prod_pool
        reserve = self.reserve_of(prod)
        reserved_out = prod.gpu_capacity - reserve.gpus(prod.gpu_capacity)
        found.require(
            floor <= reserved_out or before > reserved_out,
            f"{at}.min_replicas",
            f"production's floor reaches {floor} GPUs (sum of min_replicas x "
            f"gpus_per_replica up to {w.ref}) but the prod pool {prod.name!r} has "
            f"{reserved_out} outside its reserve ({prod.gpu_capacity} GPUs, reserve "
            f"{reserve.describe()}); lower min_replicas, raise max_nodes or "
            "lower the reserve",
        )

    def _check_production_ceiling(
        self, at: str, w: ProductionWorkload, before: int, peak: int, found: Invariants
    ) -> None:
        """The ceiling up to ``w`` (``before`` without it) fits the prod and flex pools;
        reported at the workload that crosses the limit."""
        ceiling = self.prod_pool.gpu_capacity + sum(p.gpu_capacity for p in self.flex_pools)
        found.require(
            peak <= ceiling or before > ceiling,
            f"{at}.max_replicas",
            f"production's ceiling reaches {peak} GPUs (sum of max_replicas x "
            f"gpus_per_replica up to {w.ref}) but the prod and flex pools hold {ceiling}; "
            "replicas beyond that could never be scheduled: lower max_replicas or raise "
            "the pools' max_nodes",
        )

    def _check_currencies(self, found: Invariants) -> None:
        """Every priced pool in one currency: reports add their values."""
        first: str | None = None
        for i, pool in enumerate(self.node_pools):
            if pool.cost is None:
                continue
            first = first or pool.cost.currency
            found.require(
                pool.cost.currency == first,
                f"node_pools.{i}.cost.currency",
                f"{pool.cost.currency} differs from the {first} of the first priced pool; price "
                "every pool in one currency",
            )

    @property
    def currency(self) -> str | None:
        """The currency of the priced pools, None when no pool has a ``cost``."""
        return next((p.cost.currency for p in self.node_pools if p.cost is not None), None)

    def _check_reserves(self, found: Invariants) -> None:
        """A slot reserve names a production workload by ``namespace/name``, and its slots fit
        the pool's nodes."""
        refs = {w.slot_ref: w for w in self.production if w.name is not None}
        for i, pool in enumerate(self.node_pools):
            if pool.reserve is None:
                continue
            at = f"node_pools.{i}.reserve"
            target = refs.get(pool.reserve.of)
            found.require(
                target is not None,
                f"{at}.of",
                f"{pool.reserve.of!r} is not a production workload of this policy; expected "
                f"namespace/name of one of: {', '.join(sorted(refs)) or 'none declared'}",
            )
            if target is None:
                continue
            per_node = pool.gpus_per_node // target.gpus_per_replica
            found.require(
                pool.reserve.replicas <= pool.max_nodes * per_node,
                f"{at}.replicas",
                f"{pool.reserve.replicas} slots of {target.gpus_per_replica} GPUs do not fit "
                f"pool {pool.name!r} ({pool.max_nodes} nodes x {per_node} slots); lower "
                "replicas or raise max_nodes",
            )

    serving: Serving | None = None
    """The serving layer: served models, traffic classes, the gateway and the endpoint
    picker (docs/serving.md). Unset: nothing routes to the instances; the stack option
    ``gpupool:serving`` decides whether and how it is rendered."""

    @model_validator(mode="after")
    def _serving_rules(self) -> PoolPolicy:
        found = Invariants()
        check_serving(self.serving, self.priorities, self.kv_cache, self.production, found)
        found.raise_if_any()
        return self

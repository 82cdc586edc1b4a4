"""Pure: the words of the tuning rules, what a reviewer reads in a proposal's title, "Why"
and "Expected effect" and in every no-op's reason.

The rules (``decisions``) decide and pass the numbers they decided on; this module only
phrases them, so a rule reads as its phases and a wording change touches no decision.
``prtext`` lays a finished proposal out as a pull request; this is what it says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policy import PoolPolicy
from runtime.metrics import catalogue, evictions
from runtime.tuner.settings import TunerSettings
from runtime.tuner.snapshot import Unusable, Window


@dataclass(frozen=True)
class ProposalText:
    """A proposal's title, its "Why" and its "Expected effect"."""

    title: str
    why: str
    effect: str


A_PERSON = (
    "run fewer flex replicas (workloads[].max_replicas) where production bursts, or give "
    "production more nodes; a person must look"
)
"""What the eviction-storm rule leaves to a person when every lever is at its bound."""


# --- shared -----------------------------------------------------------------------------


def unusable(u: Unusable, what: str) -> str:
    """A rule's no-op on a window it cannot judge: too short, or fail closed."""
    verb = "not enough history" if u.kind == "short" else "fail closed"
    return f"{verb}: {u.reason}; {what}"


def sustained(share: float, condition: str) -> str:
    """An evidence row's condition: how many of the window's samples met it."""
    return f"{condition} in {share:.0%} of samples"


def deferred(first: str) -> str:
    return f"deferred: {first} goes first"


def cooldown(since: float, cooldown: str) -> str:
    return f"cooldown: last proposal {since:.0f} s ago, cooldown {cooldown}"


def invalid(error: Exception) -> str:
    return f"proposed policy is invalid, not proposed: {error}"


def refused(dotted: str, after: float, error: Exception) -> str:
    """Why a lever's next step is not taken although it is within the tuner's bound."""
    return f"the policy refuses {dotted} {after:g}: {error}"


# --- eviction storm ---------------------------------------------------------------------


def storm_not_sustained(limit: float, above: float, persistence: float) -> str:
    return (
        f"evictions above {limit}/min in {above:.0%} of samples, "
        f"below the {persistence:.0%} needed to call it sustained"
    )


def storm_without_reasons(label: str) -> str:
    return (
        f"sustained evictions, but {catalogue.FLEX_EVICTIONS} has no usable per-"
        f"{label} series: the lever depends on the reason, so none is taken"
    )


def top_reason(led: float) -> str:
    return f"the top reason in {led:.0%} of the storm's samples"


def cause_for_a_person(policy: PoolPolicy, reason: str, led: float, limit: float) -> str:
    """Why an eviction storm of ``reason`` has no pool.yaml lever, and where a person looks
    (the same remedies as docs/runbooks.md, FlexEvictionRateHigh)."""
    shown = repr(reason) if reason else "(no reason label)"
    head = (
        f"sustained flex evictions above {limit}/min, mostly {shown} (the top reason in "
        f"{led:.0%} of the storm's samples)"
    )
    tail = "no pool.yaml threshold changes that, so the tuner proposes nothing; a person must look"
    if reason == evictions.EVICTION_API:
        pools = "; ".join(
            f"node_pools[{p.name}].karpenter: consolidation_policy "
            f"{p.karpenter.consolidation_policy}, consolidate_after "
            f"{p.karpenter.consolidate_after}, disruption_budget_nodes "
            f"{p.karpenter.disruption_budget_nodes}, capacity_types "
            f"{list(p.karpenter.capacity_types)}"
            for p in policy.flex_pools
        )
        hint = ""
        if any(p.karpenter.consolidation_policy != "WhenEmpty" for p in policy.flex_pools):
            hint = (
                " WhenEmptyOrUnderutilized lets Karpenter move running flex pods: WhenEmpty "
                "never does."
            )
        return (
            f"{head}: the Eviction API (kubectl drain or upgrades, Karpenter consolidation, "
            "drift or spot interruption; PodDisruptionBudgets apply, "
            f"disruption.pdb_min_available {policy.disruption.pdb_min_available}). Find which "
            "in Karpenter's events and karpenter_nodeclaims_disrupted_total by reason; "
            f"{pools} (rendered for the karpenter target only).{hint} {tail}"
        )
    if reason == evictions.KUBELET:
        memory = ", ".join(f"{w.name} {w.resources.memory}" for w in policy.workloads)
        return (
            f"{head}: the kubelet evicted pods for node pressure (memory, disk, PIDs) or a "
            "graceful node shutdown. Check the flex nodes' conditions and eviction events "
            "(kubectl describe node), the flex containers' memory against their real use "
            f"(workloads[].resources.memory: {memory or 'none'}; the KV offload's host "
            f"memory, kv_cache.offload_host_gib {policy.kv_cache.offload_host_gib}, counts "
            f"against the pod) and ephemeral storage; {tail}"
        )
    if reason == evictions.NODE:
        return (
            f"{head}: node failures (pods deleted off NotReady or unreachable nodes by the "
            "taint manager, lost or shut-down nodes). Check the flex nodes' health and the "
            f"cloud provider's events; {tail}"
        )
    return (
        f"{head}: a reason without a canonical mapping (NodeAffinity, "
        "UnexpectedAdmissionError or one added to metrics.eviction_reasons / "
        "disruption_reasons); kube_pod_status_reason and kube_pod_status_disruption_reason "
        f"of the flex pods name it; {tail}"
    )


def pending_seen(pending: Window | Unusable, waited: float, persistence: float) -> str:
    """What production-pending data adds to a preemption storm's story (``waited``: the
    share of its samples with a pod pending, when the window is usable)."""
    if isinstance(pending, Unusable):
        return (
            f"production-pending data is unusable ({pending.reason}); this lever keeps "
            "less flex, so it does not need it"
        )
    if waited >= persistence:
        return (
            f"production pods were also pending in {waited:.0%} of the samples: production "
            "bursts collide with flex"
        )
    return (
        f"production pods were pending in {waited:.0%} of the samples; a preemptor is "
        "placed within seconds, so a sample rarely sees it wait"
    )


def raise_reserve(*, reserve: float, after: float, limit: float, seen: str) -> ProposalText:
    return ProposalText(
        f"Raise the production reserve to {after:g} (flex preempted above {limit}/min)",
        "The scheduler preempted flex pods persistently: each preemption is production "
        f"taking GPUs flex held, and {seen}. The budget rule sheds flex whenever the "
        "unallocated GPUs fall under every pool's reserve, ahead of production; a larger "
        "production reserve makes flex give GPUs back earlier, so production finds them "
        "free instead of preempting. (Shedding later, with a higher "
        "shed_while_production_above or a longer HPA scale-down window, would keep flex "
        "on those GPUs longer: more preemption.)",
        f"Fewer flex preemptions; flex loses up to {after - reserve:.0%} of the production "
        "pool as usable headroom.",
    )


def reserve_bound(reserve: float, refusal: str, settings: TunerSettings) -> str:
    """Why the reserve lever took no step: the policy refused it, or the tuner's bound."""
    if refusal:
        return f"reserve_ratio {reserve:g} cannot rise: {refusal}"
    return (
        f"reserve_ratio {reserve:g} is at its bound (reserve_ratio_max "
        f"{settings.reserve_ratio_max:g})"
    )


def shed_needs_utilization(reserve_bound: str) -> str:
    return (
        f"sustained flex preemption, but {reserve_bound} and the shed threshold is only "
        "lowered on production utilization that persisted; " + A_PERSON
    )


def shed_would_not_matter(
    *, reserve_bound: str, band: float, near: float, persistence: float, shed: float
) -> str:
    return (
        f"sustained flex preemption, but {reserve_bound}, and production utilization "
        f"reached shed_while_production_above - margin ({band:g}) in {near:.0%} of "
        f"samples, below the {persistence:.0%} that would make lowering the shed "
        f"threshold ({shed:g}) matter; " + A_PERSON
    )


def every_lever_at_its_bound(
    *,
    reserve_bound: str,
    shed: float,
    refusal: str,
    floor: float,
    grow: float,
    settings: TunerSettings,
) -> str:
    shed_bound = (
        f"shed_while_production_above {shed:g} cannot fall: {refusal}"
        if refusal
        else f"shed_while_production_above {shed:g} is at its bound {floor:g} (the higher "
        f"of shed_threshold_min {settings.shed_threshold_min:g} and "
        f"grow_while_production_below {grow:g} + ratio_margin {settings.ratio_margin:g})"
    )
    return (
        "sustained flex preemption with production utilization near the shed threshold, "
        f"but every lever is at its bound: {reserve_bound}; {shed_bound}; " + A_PERSON
    )


def shed_band(band: float) -> str:
    """The evidence condition of production utilization near the shed threshold."""
    return f">= shed threshold - margin ({band:g})"


def lower_shed_threshold(
    *,
    after: float,
    limit: float,
    reserve_bound: str,
    band: float,
    near: float,
    shed: float,
    seen: str,
    grow: float,
) -> ProposalText:
    return ProposalText(
        f"Lower elastic.shed_while_production_above to {after:g} "
        f"(flex preempted above {limit}/min)",
        f"The scheduler preempted flex pods persistently and {reserve_bound}. Production's "
        f"GPU utilization stayed at or above the shed threshold less the margin ({band:g}) "
        f"in {near:.0%} of the samples: flex kept its GPUs until production crossed "
        f"{shed:g}, and production took them by preemption first. Lowering the threshold "
        f"makes flex shed one HPA step from {after:g}, ahead of production ({seen}). The band "
        f"stays {grow:g}-{after:g}.",
        f"Fewer flex preemptions; flex sheds while production keeps more than {after:g} "
        f"(not {shed:g}) of the pools' GPUs busy.",
    )


# --- idle production with queued flex demand --------------------------------------------


def not_idle_or_not_queued(*, below: float, idle: float, queued: float, persistence: float) -> str:
    return (
        f"production utilization below {below:g} in {idle:.0%} and flex requests queued "
        f"in {queued:.0%} of samples; both must reach {persistence:.0%}"
    )


def flex_vetoed(limit: float) -> str:
    return (
        "production looks idle but production pods were pending or flex evictions "
        f"exceeded {limit}/min in at least one sample (a veto): no more flex"
    )


def no_headroom() -> str:
    return (
        "flex requests queue but the flex pools had no idle GPUs (flex_headroom_gpus) "
        "to grow into; more replicas would stay pending"
    )


def no_replica_step() -> str:
    return (
        "flex demand is queued but every workload's max_replicas is auto or already "
        "fills the GPUs of its pools; add flex nodes (node_pools.*.max_nodes) or lend a "
        "prod pool (node_pools.*.lend_idle)"
    )


def not_widened(workload: str, at_max_share: float, demand: bool) -> str:
    """A workload left at its bound: how often its HPA ran at maxReplicas, whether it queued."""
    return f"{workload} (HPA at maxReplicas in {at_max_share:.0%}, queued: {demand})"


def no_workload_capped(persistence: float, skipped: Sequence[str]) -> str:
    return (
        "flex requests queue, but no workload both ran its HPA at maxReplicas and queued "
        f"requests in {persistence:.0%} of samples ({catalogue.FLEX_HPA_AT_MAX}): "
        f"max_replicas is not what caps them; {', '.join(skipped)}"
    )


def widen_replicas(*, below: float, skipped: Sequence[str], added: int) -> ProposalText:
    return ProposalText(
        "Widen flex replica bounds (idle production, queued flex requests, HPA at its bound)",
        f"Production's GPU utilization stayed below grow_while_production_below - margin "
        f"({below:g}) while flex requests queued and the HPA ran at maxReplicas, no "
        "production pod waited and evictions stayed within the limit: the HPA is capped by "
        "max_replicas, not by the cluster."
        + (f" Not widened: {', '.join(skipped)}." if skipped else ""),
        f"The HPA may add up to {added} more flex replicas; the queue drains.",
    )


# --- KV capacity ------------------------------------------------------------------------


def no_low_hit_instance(*, floor: float, persistence: float, judged: int) -> str:
    return (
        f"no vLLM instance had its hit rate below {floor:g} in {persistence:.0%} of its "
        f"samples ({judged} instances judged)"
    )


def low_hit_but_neither(
    *, low: int, full_at: float, sparse_below: float, persistence: float
) -> str:
    return (
        f"{low} instance(s) had a low hit rate, but none of them was also full "
        f"(>= {full_at:g}) or sparse (< {sparse_below:g}) in {persistence:.0%} of its own "
        "samples"
    )


def compaction_too_soon(ago: float, min_interval: str) -> str:
    return (
        f"compaction requested {ago:.0f} s ago; kv_cache.compaction_min_interval is {min_interval}"
    )


def compact(*, floor: float, sparse_below: float, sparse: int, judged: int) -> str:
    return (
        f"hit rate below {floor:g} with KV usage below compaction_usage_below "
        f"({sparse_below:g}) on the same instance ({sparse} of {judged}): the cache "
        "is sparse, not short; compact instead of adding capacity"
    )


def kv_share_at_its_bound(settings: TunerSettings) -> str:
    return (
        f"an instance is low-hit and full but max_gpu_memory_share is at the tuner's bound "
        f"{settings.kv_share_max:g}"
    )


def no_model_config(workload: str, hf_config: str) -> str:
    return f"{workload}: no model config ({hf_config}) to size its KV cache"


def kv_unsized(workload: str, error: Exception) -> str:
    return f"{workload}: {error}"


def kv_moved(workload: str, before: int, after: int) -> str:
    return f"{workload} {before:,} -> {after:,} bytes ({after / before - 1:+.1%})"


def kv_unmoved(workload: str, before: int) -> str:
    return f"{workload} stays at {before:,} bytes (weights, not the share, bound it)"


def kv_share_moves_nothing(after_share: float, unmoved: Sequence[str]) -> str:
    return (
        f"an instance is low-hit and full, but raising kv_cache.max_gpu_memory_share to "
        f"{after_share:g} changes no workload's --kv-cache-memory-bytes: {'; '.join(unmoved)}"
    )


def raise_kv_share(
    *, after_share: float, floor: float, instances: int, full_at: float, moved: Sequence[str]
) -> ProposalText:
    return ProposalText(
        f"Raise kv_cache.max_gpu_memory_share to {after_share:g} (hit rate below {floor:g})",
        f"On {instances} vLLM instance(s) the prefix-cache hit rate stayed low while that "
        f"same instance's KV usage stayed at or above page_table_max_usage "
        f"({full_at:g}): cached prefixes are evicted for lack of blocks. More "
        "KV memory keeps them.",
        f"--kv-cache-memory-bytes: {'; '.join(moved)}; a higher hit rate, less burst headroom "
        "in GPU memory.",
    )

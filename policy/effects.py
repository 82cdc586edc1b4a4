"""Valid policies that quietly disable the product: warnings that name the field and the effect.

Each rule here is valid (the cluster accepts what it renders) but keeps flex from growing,
sheds it whenever production does anything, reserves nearly every GPU, or keeps production
waiting minutes for the GPUs of a preempted flex pod. ``pool_warnings`` adds them;
``gpupool validate`` prints them and exits 0. The effects are the budget's own arithmetic
(docs/policy.md, "How the flex budget is computed"); tests/policy/test_effects.py measures
each with the what-if engine on the bundled traces.
"""

from __future__ import annotations

from policy.pool import PoolPolicy

GROW_BELOW_MIN = 0.05
"""Below this ``elastic.grow_while_production_below``, flex grows only while production is
all but idle (0: never, production's utilization is never below 0)."""

SHED_ABOVE_MIN = 0.10
"""Below this ``elastic.shed_while_production_above``, flex sheds an HPA step whenever
production keeps a tenth of the pools' GPUs busy."""

RESERVE_SHARE_MAX = 0.5
"""A pool whose reserve keeps at least this share of its GPUs unallocated leaves flex the
rest at most, and sheds flex as soon as production allocates into the reserve."""

PROD_WAIT_MAX_S = 300
"""A flex pod's exit that may take longer than this keeps production pending for minutes:
a preempted pod holds its GPUs until it exits."""


def pool_warnings(policy: PoolPolicy) -> list[tuple[str, str]]:
    """``(field path, message)`` for what is valid but probably not meant (never errors).

    A flex workload whose explicit ``max_replicas`` cannot all be scheduled on the pools it
    may use: the HPA may ask for replicas that stay Pending. Replicas fit per node, so
    3-GPU replicas on 8-GPU nodes count 2 per node. Then the settings that keep flex from
    growing, shed it at once, reserve nearly every GPU or keep production pending for
    minutes (below)."""
    out = effect_warnings(policy)
    for i, w in enumerate(policy.workloads):
        if w.max_replicas == "auto":
            continue
        fit = policy.replica_capacity(w)
        if w.max_replicas > fit:
            names = ", ".join(repr(p.name) for p in policy.pools_for(w))
            out.append(
                (
                    f"workloads.{i}.max_replicas",
                    f"max_replicas ({w.max_replicas}) x gpus_per_replica "
                    f"({w.gpus_per_replica}) exceeds the pools it may use ({names}): at "
                    f"most {fit} such replicas fit there at max_nodes; the rest would stay "
                    "Pending: use max_replicas: auto, lower it or raise the pools' max_nodes",
                )
            )
    return out


def effect_warnings(policy: PoolPolicy) -> list[tuple[str, str]]:
    """``(field path, message)`` for each setting that keeps flex from doing its job, or
    production from getting its GPUs back in seconds."""
    return [
        *_band_warnings(policy),
        *_reserve_warnings(policy),
        *_exit_warnings(policy),
    ]


def _gpus(policy: PoolPolicy) -> int:
    """The pools' GPUs: the denominator of production's utilization."""
    return sum(p.gpu_capacity for p in policy.node_pools)


def _band_warnings(policy: PoolPolicy) -> list[tuple[str, str]]:
    elastic, gpus = policy.elastic, _gpus(policy)
    out = []
    grow = elastic.grow_while_production_below
    if grow == 0:
        out.append(
            (
                "elastic.grow_while_production_below",
                "0 keeps flex from ever growing: flex grows only while production's "
                "utilization is below it, and a utilization is never below 0, so every flex "
                "workload stays at min_replicas on idle GPUs; expected a share such as 0.35",
            )
        )
    elif grow < GROW_BELOW_MIN:
        out.append(
            (
                "elastic.grow_while_production_below",
                f"{grow:g} lets flex grow only while production keeps fewer than "
                f"{grow * gpus:.2g} of the pools' {gpus} GPUs busy (all but idle): flex stays "
                f"near min_replicas whenever production does anything; expected at least "
                f"{GROW_BELOW_MIN:g}, e.g. 0.35",
            )
        )
    shed = elastic.shed_while_production_above
    if shed < SHED_ABOVE_MIN:
        out.append(
            (
                "elastic.shed_while_production_above",
                f"{shed:g} sheds flex one HPA step at every evaluation while production keeps "
                f"more than {shed * gpus:.2g} of the pools' {gpus} GPUs busy: flex is shed "
                f"as soon as production serves anything; expected at least {SHED_ABOVE_MIN:g}, "
                "e.g. 0.65",
            )
        )
    return out


def _reserve_warnings(policy: PoolPolicy) -> list[tuple[str, str]]:
    out = []
    reserved = {p.name: policy.reserve_of(p).gpus(p.gpu_capacity) for p in policy.node_pools}
    total = sum(reserved.values())
    for i, pool in enumerate(policy.node_pools):
        kept, capacity = reserved[pool.name], pool.gpu_capacity
        if kept < RESERVE_SHARE_MAX * capacity:
            continue
        field = "reserve.replicas" if pool.reserve is not None else "reserve_ratio"
        where = (
            f"flex may use at most {capacity - kept} of them"
            if pool.role == "flex" or pool.lend_idle
            else "flex runs on none of them"
        )
        out.append(
            (
                f"node_pools.{i}.{field}",
                f"the reserve ({policy.reserve_of(pool).describe()}) keeps {kept} of the "
                f"{capacity} GPUs of pool {pool.name!r} unallocated ({kept / capacity:.0%}): "
                f"{where}, "
                f"and flex sheds whenever the pools' unallocated GPUs fall below the "
                f"{total} reserved in all; expected a reserve below "
                f"{RESERVE_SHARE_MAX:.0%} of the pool, e.g. reserve_ratio: 0.2",
            )
        )
    return out


def _exit_warnings(policy: PoolPolicy) -> list[tuple[str, str]]:
    disruption = policy.disruption
    budget, grace = disruption.shutdown_budget_s, disruption.termination_grace_s
    if grace <= PROD_WAIT_MAX_S:
        return []
    return [
        (
            "disruption.termination_grace_s",
            f"{grace} s keeps production pending for minutes: a preempted flex pod holds its "
            f"GPUs until it exits, {budget} s ({budget / 60:.0f} min: prestop_delay_s + "
            f"drain_s + snapshot_s) when it drains, up to {grace} s ({grace / 60:.0f} min) "
            f"when it hangs, and production's pods wait that long; expected at most "
            f"{PROD_WAIT_MAX_S} s, e.g. 45",
        )
    ]


def unlabelled_production(policy: PoolPolicy) -> tuple[str, str] | None:
    """``(field path, message)`` when the ``labels`` target would label no prod-pool node
    although production references are declared, else None.

    Their Component requires the pool label on a node (``<pool_label> In [prod, flex...]``)
    and prefers the prod pool; with no prod node labelled, production pods rescheduled after
    it is applied (their next rollout) have nowhere to go but flex, or nowhere at all. The
    order is: list the nodes, apply the bundle (which labels them), then the Component.
    """
    if not policy.production:
        return None
    index, prod = next((i, p) for i, p in enumerate(policy.node_pools) if p.role == "prod")
    if prod.nodes:
        return None
    refs = ", ".join(w.ref for w in policy.production)
    return (
        f"node_pools.{index}.nodes",
        f"the labels target labels no {prod.name} node, yet production ({refs}) will require "
        f"{policy.cluster.pool_label} on its nodes: list the {prod.name} nodes here first, "
        "apply the rendered bundle so they carry the label, and only then add _production to "
        "the production kustomization (or render --target karpenter, whose NodePools label "
        "their nodes)",
    )

"""Harvest on the owner's own cluster: the product's goals, pooled against the fixed topology.

Run: ``python bench/harvest.py [--hours 22.8] [--only NAME] [--hpa-tolerance behavior]``.
Each setting replays a production trace with a batch backlog (request lengths of the bundled
Azure code trace, always queued) on the policy's own pools (the ``policy`` layout), pooled
and as the fixed topology in the same run: the fixed topology is the baseline of every
ratio. Settings:

- ``shipped``: the shipped policy (gpu-prod 64 GPUs lending, gpu-flex 32), the bundled
  Alibaba GenAI production trace (production holds up to 67 GPUs at a 7.5 % duty cycle);
- ``goal``: gpu-flex at 2 nodes (80 GPUs; the fixed topology's duty cycle is about 0.22);
- ``goal, lending off``: the same without lending (gpu-flex alone holds flex);
- ``goal, 2-slot reserve``: gpu-prod keeps room for two production replicas instead of 20 %;
- ``large prod pool``: gpu-prod at 15 nodes (152 GPUs in all), the same trace;
- ``diurnal, 2-GPU flex``: a generated day (production 16-56 GPUs at 30 % duty), flex
  replicas of 2 GPUs, gpu-flex at 2 nodes.

Each line gives the figures the goals are scored on; ``ceiling``, the ratio an ideal
whole-GPU pooler would reach (production's served busy GPU-hours plus the harvest bound, over
the fixed topology's useful GPU-hours); and where the bound's GPU-hours went that flex did
not hold, largest first (``report.HarvestLosses``): GPUs production held beyond its busy
ones (its replicas' own headroom), the reserve kept free, other free GPUs, and flex replicas
starting or stopping. The load
average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

from infra.builders.stack_options import HPA_TOLERANCES, StackOptions
from policy import DEFAULT_POLICY, PoolPolicy, load_policy, parse_policy
from runtime.advise.levers import grid, parse_vary
from runtime.advise.sweep import variant_document
from runtime.sim.replay_model import Settings
from runtime.sim.traces import (
    ProductionTrace,
    bundled,
    diurnal,
    load_flex_trace,
    load_production_trace,
)
from runtime.sim.whatif import Demand, Result, WhatIf, run


@dataclass(frozen=True)
class Setting:
    """Changes of the shipped policy (``gpupool advise --vary`` fields, one value each) and
    the production trace to replay it with."""

    changes: tuple[str, ...] = ()
    production: str = "alibaba"


def _variant(changes: tuple[str, ...]) -> PoolPolicy:
    policy = load_policy()
    variant = grid(policy, [parse_vary(change) for change in changes])[-1]
    return parse_policy(variant_document(policy, variant.edits))


SLOTS = "reserve={replicas: 2, of: inference/llama-70b-prod}"
SETTINGS = {
    "shipped": Setting(),
    "goal": Setting(("gpu-flex.max_nodes=2",)),
    "goal, lending off": Setting(("gpu-flex.max_nodes=2", "gpu-prod.lend_idle=false")),
    "goal, 2-slot reserve": Setting(("gpu-flex.max_nodes=2", SLOTS)),
    "large prod pool": Setting(("gpu-prod.max_nodes=15",)),
    "diurnal, 2-GPU flex": Setting(
        ("gpu-flex.max_nodes=2", "llama-8b-flex.gpus_per_replica=2"), production="diurnal"
    ),
}


def _production(name: str, hours: float) -> ProductionTrace:
    if name == "diurnal":
        return diurnal(hours=hours, peak_gpus=56, trough_gpus=16, duty_cycle=0.3, seed=7)
    return load_production_trace(bundled("alibaba"))


def _line(name: str, result: Result, seconds: float) -> str:
    p, f = result.pooled, result.fixed
    ceiling = (p.prod_served_gpu_h + p.harvest_bound_gpu_h) / f.useful_gpu_h
    pending = ", ".join(f"{k} {v:.1f}" for k, v in p.prod_pending_pod_minutes.items())
    missed = [g.name for g in result.goals if g.met is False]
    efficiency = "n/a" if p.harvest_efficiency is None else f"{p.harvest_efficiency:.2f}"
    return (
        f"{name}: {result.layout.total_gpus} GPUs; useful GPU-h {result.useful_gpu_h_ratio:.2f}x "
        f"({p.useful_gpu_h:,.0f} vs {f.useful_gpu_h:,.0f}; ceiling {ceiling:.2f}x); "
        f"cluster duty {f.cluster_duty_cycle:.2f} -> {p.cluster_duty_cycle:.2f}; harvest "
        f"{p.harvested_gpu_h:,.0f} of {p.harvest_bound_gpu_h:,.0f} GPU-h ({efficiency}); "
        f"bound not harvested, GPU-h: {p.harvest_lost.largest()}; "
        f"production short {p.prod_short_gpu_h:.2f} vs {f.prod_short_gpu_h:.2f} GPU-h, "
        f"pending pod-min {pending}; evictions max {p.evictions_per_minute_max:.2f}/min; "
        f"flex tokens/s {p.flex_tokens_per_s:,.0f} vs {f.flex_tokens_per_s:,.0f}; "
        f"goals missed: {', '.join(missed) or 'none'}; {seconds:.1f} s wall"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hours", type=float, default=22.8)
    parser.add_argument("--only", choices=sorted(SETTINGS), action="append")
    parser.add_argument("--hpa-tolerance", choices=HPA_TOLERANCES, default="cluster")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {os.cpu_count()} CPUs")
    print(f"HPA tolerance: {args.hpa_tolerance}")
    backlog = load_flex_trace(bundled("azure-code"))
    for name in args.only or SETTINGS:
        setting = SETTINGS[name]
        policy = _variant(setting.changes)
        demand = {policy.workloads[0].name: Demand(backlog=backlog)}
        settings = Settings(hours=args.hours, stack=StackOptions(hpa_tolerance=args.hpa_tolerance))
        whatif = WhatIf(_production(setting.production, args.hours), demand, settings)
        start = time.perf_counter()
        result = run(policy, DEFAULT_POLICY.parent, whatif)
        print(_line(name, result, time.perf_counter() - start), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()

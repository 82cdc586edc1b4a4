"""What-if engine cost: simulated hours per wall second at 100, 1,000 and 10,000 GPUs.

Run: ``python bench/whatif.py [--hours 24] [--sizes 100 1000 10000]``. Each cluster is the
default policy scaled: three quarters of the GPUs in gpu-prod, a quarter in gpu-flex, a
diurnal production trace peaking at 70 % of the cluster (duty rule), and a flex backlog
(request lengths of the bundled Azure code trace); gpu-prod lends and the flex bound is
``auto``, as shipped. The
baseline is the same replay at the smallest size in the same run, so the ratios show the
cost's growth on this machine's speed at the time; the load average is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import time

from policy import DEFAULT_POLICY, load_policy, parse_policy
from runtime.sim.production import ProductionRule
from runtime.sim.replay_model import Settings
from runtime.sim.traces import ProductionTrace, bundled, diurnal, load_flex_trace
from runtime.sim.whatif import Demand, WhatIf, run


def scaled(gpus: int):  # type: ignore[no-untyped-def]
    document = load_policy().model_dump(mode="json")
    per_node = document["node_pools"][0]["gpus_per_node"]
    nodes = max(2, gpus // per_node)
    flex_nodes = max(1, nodes // 4)
    document["node_pools"][0]["max_nodes"] = nodes - flex_nodes
    document["node_pools"][0]["nodes"] = []
    document["node_pools"][1]["max_nodes"] = flex_nodes
    document["node_pools"][1]["nodes"] = []
    return parse_policy(document), nodes * per_node


def production(total: int, hours: float) -> ProductionTrace:
    """The diurnal production trace of a ``total``-GPU cluster: peak 70 %, trough 10 %."""
    return diurnal(
        hours=hours,
        peak_gpus=int(total * 0.7),
        trough_gpus=max(1, total // 10),
        seed=1,
        duty_cycle=0.5,
    )


def once(gpus: int, hours: float) -> tuple[float, float]:
    policy, total = scaled(gpus)
    trace = production(total, hours)
    demand = {policy.workloads[0].name: Demand(backlog=load_flex_trace(bundled("azure-code")))}
    settings = Settings(hours=hours, production=ProductionRule("held"))
    start = time.perf_counter()
    result = run(policy, DEFAULT_POLICY.parent, WhatIf(trace, demand, settings))
    return time.perf_counter() - start, result.useful_gpu_h_ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {os.cpu_count()} CPUs")
    base: float | None = None
    for gpus in args.sizes:
        seconds, ratio = once(gpus, args.hours)
        base = base or seconds
        print(
            f"{gpus:>6} GPUs, {args.hours:g} simulated h: {seconds:7.2f} s wall "
            f"({args.hours * 3600 / seconds:,.0f}x real time; {seconds / base:.1f}x the "
            f"{args.sizes[0]}-GPU run); pooled/fixed useful GPU-hours {ratio:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Advisor cost: a 16-variant sweep against one replay of the same cluster, in the same run.

Run: ``python bench/advise.py [--gpus 1000] [--hours 24] [--jobs N]``. The cluster is
``bench/whatif.py``'s (the default policy scaled: three quarters of the GPUs in gpu-prod,
lending, a quarter in gpu-flex; a diurnal production trace peaking at 70 % of the cluster
under the ``held`` rule; a flex backlog with the Azure code trace's lengths), written as a
policy file and a ``timestamp,gpus_demanded,duty_cycle`` trace, as a user would give them.
The baseline is one pooled replay of the current policy in the same run; the sweep is the
grid lending x 4 reserve shares x 2 grow thresholds (16 variants, the current included) on
``--jobs`` processes. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml
from whatif import production, scaled  # bench/whatif.py (the script's folder is on sys.path)

from infra.builders.stack_options import StackOptions
from policy import DEFAULT_POLICY, load_policy
from runtime.advise.levers import grid, parse_vary
from runtime.advise.sweep import run_sweep
from runtime.sim.options import DEMO, Options, build_whatif
from runtime.sim.traces import demand_csv
from runtime.sim.whatif import run_pooled


def _inputs(root: Path, gpus: int, hours: float) -> tuple[Path, Options]:
    policy, total = scaled(gpus)
    shutil.copytree(DEFAULT_POLICY.parent / "models", root / "models")
    (root / "pool.yaml").write_text(yaml.safe_dump(policy.model_dump(mode="json", by_alias=True)))
    trace = production(total, hours)
    samples = [
        (i * trace.step_s, float(h), float(b))
        for i, (h, b) in enumerate(zip(trace.held.tolist(), trace.busy.tolist(), strict=True))
    ]
    (root / "production.csv").write_text(demand_csv(samples, source="bench"))
    options = replace(
        DEMO,
        prod_trace=str(root / "production.csv"),
        hours=hours,
        production_rule="held",
        stack=StackOptions(target="labels"),
    )
    return root / "pool.yaml", options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-advise-") as scratch:
        file, options = _inputs(Path(scratch), args.gpus, args.hours)
        policy = load_policy(file)
        start = time.perf_counter()
        run_pooled(policy, file.parent, build_whatif(options, policy))
        single = time.perf_counter() - start
        print(f"one replay, {args.gpus} GPUs x {args.hours:g} h: {single:.1f} s", flush=True)
        levers = [
            parse_vary("gpu-prod.lend_idle=true,false"),
            parse_vary("gpu-prod.reserve_ratio=0.2,0,0.05,0.1"),
            parse_vary("grow_while_production_below=0.35,0.45"),
        ]
        variants = grid(policy, levers)
        start = time.perf_counter()
        sweep = run_sweep(policy, file.parent, variants, options, jobs=args.jobs, budget_s=3600)
        seconds = time.perf_counter() - start
    replayed = sum(1 for p in sweep.points if p.summary is not None)
    print(
        f"{len(variants)}-variant sweep ({replayed} replayed, the current one also as the fixed "
        f"topology) on {args.jobs} processes: {seconds:.1f} s = {seconds / single:.1f}x one "
        f"replay ({seconds / len(variants) / single * args.jobs:.2f}x per variant per process)"
    )
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()

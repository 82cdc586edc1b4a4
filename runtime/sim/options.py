"""What a replay is asked to do: the trace and loop options of ``whatif``, ``demo`` and the
tuner's pull requests, and the ``WhatIf`` they build (every trace parsed up front)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.builders.stack_options import DEFAULT_STACK, StackOptions
from policy import PoolPolicy
from policy.base import duration_seconds
from runtime.sim.production import ProductionRule, RuleMode
from runtime.sim.replay_model import Settings
from runtime.sim.traces import (
    FlexTrace,
    ProductionTrace,
    bundled,
    diurnal,
    load_flex_trace,
    load_production_trace,
)
from runtime.sim.tuning import TunerConfig
from runtime.sim.whatif import Demand, LayoutMode, WhatIf, WhatIfError
from runtime.tuner.settings import load_settings


@dataclass(frozen=True)
class Options:
    """The replay options shared by ``whatif`` and ``demo``."""

    prod_trace: str | None
    flex_traces: tuple[str, ...]
    backlogs: tuple[str, ...]
    rate_scale: float
    hours: float | None
    seed: int
    layout: LayoutMode
    fit_production: bool
    production_rule: RuleMode
    prod_target_utilization: float
    startup_s: float
    stack: StackOptions
    """The stack's options the replay models (``--target``, ``--hpa-tolerance``)."""
    tuner: bool = False
    """Run the tuner's decisions in the pooled loop (``--tuner``)."""
    tuner_settings: str | None = None
    """The tuner's settings file (``gpupool tune --settings``); None: its defaults."""
    review_delay: str | None = None
    """From a proposal to its merge, a duration (``30m``); None: one tuner interval."""


def input_files(options: Options) -> list[Path]:
    """The files the options name (traces, the tuner's settings): no output may touch them."""
    found = [] if options.prod_trace in (None, "diurnal") else [options.prod_trace]
    for spec in (*options.flex_traces, *options.backlogs):
        _workload, path, _class = _split(spec, "")
        if path not in ("azure-code", "mooncake"):
            found.append(path)
    if options.tuner_settings is not None:
        found.append(options.tuner_settings)
    return [Path(p) for p in found if p is not None]


def _tuner(options: Options) -> TunerConfig | None:
    """The tuner's settings and review delay, read and checked before anything runs."""
    if not options.tuner:
        if options.tuner_settings is not None or options.review_delay is not None:
            raise WhatIfError("--tuner-settings and --review-delay need --tuner")
        return None
    path = None if options.tuner_settings is None else Path(options.tuner_settings)
    delay: float | None = None
    if options.review_delay is not None:
        try:
            delay = duration_seconds(options.review_delay)
        except ValueError as exc:
            raise WhatIfError(f"--review-delay: {exc}") from None
    return TunerConfig(load_settings(path), delay)


def _production(spec: str | None, seed: int, peak: int) -> ProductionTrace:
    if spec is None:
        return load_production_trace(bundled("alibaba"))
    if spec == "diurnal":
        return diurnal(hours=24, peak_gpus=peak, trough_gpus=max(1, peak // 4), seed=seed)
    return load_production_trace(Path(spec))


def _flex(spec: str) -> FlexTrace:
    if spec in ("azure-code", "mooncake"):
        return load_flex_trace(bundled(spec))  # type: ignore[arg-type]
    return load_flex_trace(Path(spec))


def _split(value: str, default: str) -> tuple[str, str, str | None]:
    """``[WORKLOAD=]FILE[:CLASS]`` -> (workload, file, class or None). A colon names a class
    only when what follows it is no path (no ``/``), so ``dir:x/trace.csv`` stays a file."""
    workload, sep, path = value.partition("=")
    if not (sep and "/" not in workload):
        workload, path = default, value
    file, sep, name = path.rpartition(":")
    if sep and file and name and "/" not in name:
        return workload, file, name
    return workload, path, None


def build_whatif(options: Options, policy: PoolPolicy) -> WhatIf:
    """Parse every trace and the tuner's settings before anything runs (bad input fails
    here, nothing written)."""
    tuner = _tuner(options)
    # Without workloads there is nothing to name; ``whatif.run`` refuses such a policy.
    first = policy.workloads[0].name if policy.workloads else ""
    production = _production(options.prod_trace, options.seed, policy.prod_pool.gpu_capacity)
    traces: dict[str, list[tuple[FlexTrace, str | None]]] = {}
    flex_specs = options.flex_traces
    if not flex_specs and not options.backlogs:
        flex_specs = ("azure-code", "mooncake")
    for spec in flex_specs:
        workload, path, name = _split(spec, first)
        traces.setdefault(workload, []).append((_flex(path), name))
    backlog: dict[str, tuple[FlexTrace, str | None]] = {}
    for spec in options.backlogs:
        workload, path, name = _split(spec, first)
        backlog[workload] = (_flex(path), name)
    demand = {
        name: Demand(
            tuple(t for t, _ in traces.get(name, ())),
            backlog[name][0] if name in backlog else None,
            options.rate_scale,
            tuple(c for _, c in traces.get(name, ())),
            backlog[name][1] if name in backlog else None,
        )
        for name in {*traces, *backlog}
    }
    hours = options.hours or min(24.0, production.duration_s / 3600)
    rule = ProductionRule(
        options.production_rule, options.prod_target_utilization, startup_s=options.startup_s
    )
    settings = Settings(
        hours=hours,
        flex_startup_s=options.startup_s,
        production=rule,
        stack=options.stack,
    )
    return WhatIf(production, demand, settings, options.layout, options.fit_production, tuner)


DEMO = Options(
    prod_trace=None,
    flex_traces=(),
    backlogs=("azure-code",),
    rate_scale=1.0,
    hours=None,
    seed=0,
    layout="policy",
    fit_production=False,
    production_rule="policy",
    prod_target_utilization=0.6,
    startup_s=300.0,
    stack=DEFAULT_STACK,
)
"""``gpupool demo`` and the tuner's pull requests: the bundled Alibaba production sample and
a flex backlog (batch work always queued, request lengths of the bundled Azure code trace)
for the policy's first workload, on the policy's pools as declared (docs/whatif.md)."""

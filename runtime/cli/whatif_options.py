"""``whatif``'s options: the typer declarations, and the parsed values grouped by what they
choose (the policy, the replay, the output files), so the command itself stays a dispatch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, cast

import typer

from infra.builders.stack_options import HPA_TOLERANCES, TARGETS, HpaTolerance, StackOptions, Target
from runtime.cli.errors import UsageProblem
from runtime.sim.options import Options
from runtime.sim.production import RuleMode
from runtime.sim.whatif import LayoutMode

BaseOption = Annotated[str | None, typer.Option(help="Git ref of the policy before the change.")]
HeadOption = Annotated[str | None, typer.Option(help="Git ref of the policy after the change.")]
RepoOption = Annotated[Path, typer.Option(help="Policy repository for --base/--head.")]
PolicyPathOption = Annotated[str, typer.Option(help="Policy file inside the repository.")]
FlexTraceOption = Annotated[
    list[str] | None,
    typer.Option(
        help="[WORKLOAD=]FILE[:CLASS] flex requests (Azure CSV or Mooncake JSONL; "
        "'azure-code' and 'mooncake' name the bundled ones); repeatable. CLASS: a traffic "
        "class of the policy's serving section (default: its first class served by flex). "
        "Default: both bundled traces."
    ),
]
BacklogOption = Annotated[
    list[str] | None,
    typer.Option(
        help="[WORKLOAD=]FILE[:CLASS] batch work always available (lengths from FILE); "
        "CLASS: a traffic class served by flex."
    ),
]
RateScaleOption = Annotated[float, typer.Option(min=0.001, help="Multiply flex arrival rates.")]
SeedOption = Annotated[int, typer.Option(help="Seed of the generated production trace.")]
LayoutOption = Annotated[
    str,
    typer.Option(
        help="policy: the pools as declared; trace: resizes the hardware to the trace "
        "(production's peak plus the flex pool), said in the report's assumptions."
    ),
]
FitProductionOption = Annotated[
    bool, typer.Option(help="Scale a production trace larger than the cluster to fit it.")
]
ProductionRuleOption = Annotated[
    str,
    typer.Option(
        help="policy: the policy's production workloads (duty without them); "
        "duty: one-GPU replicas follow busy GPU-equivalents; held: the trace's GPUs."
    ),
]
ProdTargetUtilizationOption = Annotated[
    float,
    typer.Option(
        min=0.05, max=1.0, help="Duty rule and scale_on: external: target duty per replica."
    ),
]
StartupOption = Annotated[
    float, typer.Option(min=0, help="Pod start-up: image pull + model load, seconds.")
]
HpaToleranceOption = Annotated[
    str,
    typer.Option(help="Flex HPA tolerance: cluster (controller flag) or behavior (per-HPA 0)."),
]
JsonOption = Annotated[Path | None, typer.Option("--json", help="Write the result as JSON.")]
PlotsOption = Annotated[Path | None, typer.Option(help="Folder for the PNG plots.")]
MarkdownOption = Annotated[
    Path | None, typer.Option("--markdown", help="Write the report (or PR comment) here.")
]
TunerOption = Annotated[
    bool,
    typer.Option(
        "--tuner",
        help="Run the tuner's decisions in the pooled loop every tuner interval and merge "
        "its proposals after --review-delay.",
    ),
]
TunerSettingsOption = Annotated[
    Path | None,
    typer.Option(help="The tuner's settings file (as gpupool tune --settings)."),
]
ReviewDelayOption = Annotated[
    str | None,
    typer.Option(help="From a proposal to its merge, e.g. 30m (default: one tuner interval)."),
]


@dataclass(frozen=True)
class PolicySource:
    """Which policy to replay: a file (or the packaged example), or two git refs of one."""

    file: Path | None
    example: bool
    base: str | None
    head: str | None
    repo: Path
    policy_path: str

    def refs(self) -> tuple[str, str] | None:
        """``(base, head)`` when two refs are compared, None for one policy file; a
        half-given or mixed choice is a ``UsageProblem``."""
        if (self.base is None) != (self.head is None):
            raise UsageProblem("--base and --head go together")
        if self.base is None or self.head is None:
            return None
        if self.file is not None or self.example:
            raise UsageProblem("use either --policy (or --example) or --base/--head")
        return self.base, self.head


@dataclass(frozen=True)
class OutputPaths:
    """The files a replay may write (``--json``, ``--plots``, ``--markdown``); None: not."""

    json_out: Path | None = None
    plots: Path | None = None
    markdown_out: Path | None = None


def replay_options(
    *,
    prod_trace: str | None,
    flex_trace: Sequence[str] | None,
    backlog: Sequence[str] | None,
    rate_scale: float,
    hours: float | None,
    seed: int,
    layout: str,
    fit_production: bool,
    production_rule: str,
    prod_target_utilization: float,
    startup_s: float,
    target: str,
    hpa_tolerance: str,
    tuner: bool,
    tuner_settings: Path | None,
    review_delay: str | None,
) -> Options:
    """The replay's ``Options`` from the command's values, each choice checked in the order
    of the options (a wrong one is a ``UsageProblem`` naming the option); ``target`` and
    ``hpa_tolerance`` become its one ``StackOptions``."""
    return Options(
        prod_trace,
        tuple(flex_trace or ()),
        tuple(backlog or ()),
        rate_scale,
        hours,
        seed,
        cast(LayoutMode, _choice("--layout", layout, ("policy", "trace"))),
        fit_production,
        cast(RuleMode, _choice("--production-rule", production_rule, ("policy", "duty", "held"))),
        prod_target_utilization,
        startup_s,
        StackOptions(
            cast(Target, _choice("--target", target, TARGETS)),
            cast(HpaTolerance, _choice("--hpa-tolerance", hpa_tolerance, HPA_TOLERANCES)),
        ),
        tuner=tuner,
        tuner_settings=None if tuner_settings is None else str(tuner_settings),
        review_delay=review_delay,
    )


def _choice(option: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise UsageProblem(f"{option} must be one of {', '.join(allowed)}, not {value!r}")
    return value

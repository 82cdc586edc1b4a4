"""``whatif``: replay traces through the closed loop under a policy, or two refs of it."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.progress import Progress as RichProgress

from policy import load_policy
from runtime import atomic_file
from runtime.cli import tables
from runtime.cli.consoles import console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.options import HoursOption, ProdTraceOption, TargetOption
from runtime.cli.policy_commands import ExampleOption, PolicyOption, input_files
from runtime.cli.policy_commands import policy_file as resolve_policy_file
from runtime.cli.whatif_options import (
    BacklogOption,
    BaseOption,
    FitProductionOption,
    FlexTraceOption,
    HeadOption,
    HpaToleranceOption,
    JsonOption,
    LayoutOption,
    MarkdownOption,
    OutputPaths,
    PlotsOption,
    PolicyPathOption,
    PolicySource,
    ProdTargetUtilizationOption,
    ProductionRuleOption,
    RateScaleOption,
    RepoOption,
    ReviewDelayOption,
    SeedOption,
    StartupOption,
    TunerOption,
    TunerSettingsOption,
    replay_options,
)
from runtime.sim import class_text, markdown, output, tuner_text
from runtime.sim.gitrefs import RefError, policy_at
from runtime.sim.options import DEMO, Options, build_whatif
from runtime.sim.options import input_files as replay_inputs
from runtime.sim.service_time import ServiceTimeError
from runtime.sim.traces import TraceError
from runtime.sim.whatif import Result, WhatIfError, run
from runtime.vllm import BackendError, KvPlanError, ModelConfigError

DOMAIN_ERRORS = (
    TraceError,
    WhatIfError,
    ServiceTimeError,
    RefError,
    ModelConfigError,
    KvPlanError,
    BackendError,
)
"""What a replay raises for bad input (traces, refs, the model): one line, not a traceback."""


def replay(policy_file: Path, options: Options, label: str) -> Result:
    """Load the policy and the traces, then run both replays with a progress bar."""
    policy = load_policy(policy_file)
    whatif = build_whatif(options, policy)
    with RichProgress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"replaying {label}", total=whatif.settings.steps)
        return run(
            policy,
            policy_file.parent,
            whatif,
            progress=lambda done, total: bar.update(task, completed=done),
        )


def print_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table whose values stay whole at any width (``tables.print_table``)."""
    tables.print_table(console, headers, rows)


def print_summary(result: Result, title: str) -> None:
    """The pooled-versus-fixed table, then the headline, notes, checks, goals, classes and
    (with ``--tuner``) the tuner's proposals."""
    tables.print_table(
        console,
        ("", "pooled", "fixed topology"),
        markdown.rows(result.pooled, result.fixed),
        title=title,
    )
    console.print(markdown.headline(result).replace("**", ""), markup=False)
    for line in markdown.notable_lines(result):
        console.print(line, markup=False)
    for line in markdown.check_lines(result.pooled):
        console.print(line, markup=False)
    for line in markdown.goal_lines(result):
        console.print(line, markup=False)
    print_classes(result)
    if result.tuner is not None:
        print_tuner(result)


def print_classes(result: Result) -> None:
    """Per traffic class: served, queued, shed (and during production bursts), lost, dropped;
    nothing for a policy without a serving section."""
    rows = class_text.class_rows(result.pooled, result.fixed)
    if not rows:
        return
    head, *_ = class_text.class_lines(result.pooled, result.fixed)
    console.print(head, markup=False)
    # One column per class and replay (the markdown's rows), so ten figures fit 80 columns.
    tables.print_table(
        console,
        ("", *(f"{row[0]} {row[1]}" for row in rows)),
        [
            (figure, *(row[i] for row in rows))
            for i, figure in enumerate(class_text.CLASS_COLUMNS[2:], start=2)
        ],
    )


def print_tuner(result: Result) -> None:
    """The tuner's proposals as a table (when, what, outcome, effect), each one's reason
    below it; without a proposal, the last cycle's reasons."""
    tuner = result.tuner
    assert tuner is not None
    head, *rest = tuner_text.tuner_lines(tuner)
    console.print(head, markup=False)
    if not tuner.proposals:
        for line in rest:
            console.print(line, markup=False)
        return
    tables.print_table(
        console,
        ("proposed", "change", "outcome", "before -> after"),
        [
            (
                tuner_text.clock(p.proposed_at_s),
                tuner_text.change_text(p),
                tuner_text.outcome_text(p),
                tuner_text.effect_text(p),
            )
            for p in tuner.proposals
        ],
    )
    for p in tuner.proposals:
        console.print(f"why ({tuner_text.clock(p.proposed_at_s)}, {p.rule}): {p.why}", markup=False)


def output_files(outputs: OutputPaths, prefixes: list[str]) -> list[Path]:
    """Every file a run writes: the JSON, the markdown and each plot."""
    named = [p for p in (outputs.json_out, outputs.markdown_out) if p is not None]
    if outputs.plots is None:
        return named
    return named + [
        outputs.plots / f"{prefix}{name}" for prefix in prefixes for name in output.PLOTS
    ]


def check_outputs(outputs: list[Path], inputs: list[Path]) -> None:
    """``atomic_file.check_files`` before the replay, its refusal as one line."""
    try:
        atomic_file.check_files(outputs, inputs)
    except atomic_file.OutputError as exc:
        raise UsageProblem(str(exc)) from None


def write_set(files: dict[Path, bytes], inputs: Sequence[Path]) -> None:
    """The run's files as one set (all old or all new), a failure as one line."""
    try:
        atomic_file.write_files(files, inputs)
    except atomic_file.OutputError as exc:
        raise UsageProblem(str(exc)) from None


def write_outputs(result: Result, outputs: OutputPaths, inputs: Sequence[Path] = ()) -> list[str]:
    """Write the JSON, plots and report as one set; return the plots' paths."""
    files: dict[Path, bytes] = {}
    if outputs.plots is not None:
        files |= {outputs.plots / name: data for name, data in output.plots(result).items()}
    written = list(files)
    if outputs.json_out is not None:
        files[outputs.json_out] = output.json_bytes(result)
    if outputs.markdown_out is not None:
        links = output.relative(written, outputs.markdown_out)
        files[outputs.markdown_out] = markdown.report(result, plots=links).encode("utf-8")
    write_set(files, inputs)
    return [str(p) for p in written]


def whatif(
    policy_file: PolicyOption = None,
    example: ExampleOption = False,
    base: BaseOption = None,
    head: HeadOption = None,
    repo: RepoOption = Path("."),
    policy_path: PolicyPathOption = "policy/pool.yaml",
    prod_trace: ProdTraceOption = None,
    flex_trace: FlexTraceOption = None,
    backlog: BacklogOption = None,
    rate_scale: RateScaleOption = 1.0,
    hours: HoursOption = None,
    seed: SeedOption = 0,
    layout: LayoutOption = "policy",
    fit_production: FitProductionOption = False,
    production_rule: ProductionRuleOption = "policy",
    prod_target_utilization: ProdTargetUtilizationOption = 0.6,
    startup_s: StartupOption = 300.0,
    target: TargetOption = "labels",
    hpa_tolerance: HpaToleranceOption = "cluster",
    json_out: JsonOption = None,
    plots: PlotsOption = None,
    markdown_out: MarkdownOption = None,
    tuner: TunerOption = False,
    tuner_settings: TunerSettingsOption = None,
    review_delay: ReviewDelayOption = None,
) -> None:
    """Replay production and flex traces through the closed loop; compare with fixed GPUs."""
    source = PolicySource(policy_file, example, base, head, repo, policy_path)
    outputs = OutputPaths(json_out, plots, markdown_out)
    with reported_errors(), _domain_errors():
        options = replay_options(
            prod_trace=prod_trace,
            flex_trace=flex_trace,
            backlog=backlog,
            rate_scale=rate_scale,
            hours=hours,
            seed=seed,
            layout=layout,
            fit_production=fit_production,
            production_rule=production_rule,
            prod_target_utilization=prod_target_utilization,
            startup_s=startup_s,
            target=target,
            hpa_tolerance=hpa_tolerance,
            tuner=tuner,
            tuner_settings=tuner_settings,
            review_delay=review_delay,
        )
        refs = source.refs()
        if refs is not None:
            _compare(source, refs, options, outputs)
            return
        file, result, names = _replay_file(source, options, outputs)
    print_summary(result, f"What-if: {file}, {result.pooled.hours:g} h")
    for name in names:
        console.print(f"plot: {name}", markup=False)


def _replay_file(
    source: PolicySource, options: Options, outputs: OutputPaths
) -> tuple[Path, Result, list[str]]:
    """One policy file's replay, its outputs checked before and written after; the file, the
    result and the plots' paths."""
    file = resolve_policy_file(source.file, example=source.example)
    inputs = input_files(file, load_policy(file)) + replay_inputs(options)
    check_outputs(output_files(outputs, prefixes=[""]), inputs)
    result = replay(file, options, str(file))
    return file, result, write_outputs(result, outputs, inputs)


def _compare(
    source: PolicySource, refs: tuple[str, str], options: Options, outputs: OutputPaths
) -> None:
    """Replay the policy at both refs, write the comparison (the PR comment) and print both."""
    base, head = refs
    inputs = replay_inputs(options)
    check_outputs(output_files(outputs, prefixes=["head-", "base-"]), inputs)
    with tempfile.TemporaryDirectory(prefix="gpupool-whatif-") as tmp:
        results = {}
        for name, ref in (("base", base), ("head", head)):
            file = policy_at(source.repo, ref, source.policy_path, Path(tmp) / name)
            results[name] = replay(file, options, f"{name} {ref}")
    write_set(_comparison_files(results, refs, outputs), inputs)
    print_summary(results["base"], f"base {base}")
    print_summary(results["head"], f"head {head}")


def _comparison_files(
    results: dict[str, Result], refs: tuple[str, str], outputs: OutputPaths
) -> dict[Path, bytes]:
    """Both refs' plots (``base-``, ``head-``), both results as JSON and the comparison's
    markdown, which links the head's plots."""
    base, head = refs
    files: dict[Path, bytes] = {}
    if outputs.plots is not None:
        for prefix in ("head-", "base-"):
            images = output.plots(results[prefix[:-1]], prefix=prefix)
            files |= {outputs.plots / name: data for name, data in images.items()}
    written = [p for p in files if p.name.startswith("head-")]
    # named from the comment's folder, as the CI artifact holds them
    names = (
        [str(p) for p in written]
        if outputs.markdown_out is None
        else output.relative(written, outputs.markdown_out)
    )
    text = markdown.comparison(
        results["base"], results["head"], base_ref=base, head_ref=head, plots=names
    )
    if outputs.json_out is not None:
        both = {k: output.as_json(v) for k, v in results.items()}
        files[outputs.json_out] = json.dumps(both, indent=1, sort_keys=True).encode("utf-8")
    if outputs.markdown_out is not None:
        files[outputs.markdown_out] = text.encode("utf-8")
    return files


@contextmanager
def _domain_errors() -> Iterator[None]:
    """Turn the replay's domain errors into one line (``UsageProblem``)."""
    try:
        yield
    except DOMAIN_ERRORS as exc:
        raise UsageProblem(str(exc)) from None


def replay_demo(out: Path, policy_file: Path) -> None:
    """The demo's replay of ``policy_file`` on the bundled traces; report, plots and JSON
    under ``out``."""
    with reported_errors(), _domain_errors():
        outputs = OutputPaths(out / "whatif.json", out, out / "report.md")
        inputs = input_files(policy_file, load_policy(policy_file))
        check_outputs(output_files(outputs, prefixes=[""]), inputs)
        result = replay(policy_file, DEMO, "the bundled traces")
        names = write_outputs(result, outputs, inputs)
    print_summary(result, f"What-if on the bundled traces, {result.pooled.hours:g} h")
    console.print(f"{out}: report.md, whatif.json, {len(names)} plots", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(whatif)

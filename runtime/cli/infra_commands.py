"""``render``, ``diff`` and ``demo``: the bundle as reviewable YAML, and what a change changes."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from infra.builders.serving_options import (
    DEFAULT_SERVING,
    ObjectiveApi,
    ServingMode,
    ServingOptions,
)
from infra.builders.stack_options import HpaTolerance, StackOptions, Target
from infra.diff import diff_documents
from infra.inputs import load_inputs
from infra.output import FolderResult, OutputError, write_documents
from infra.pipeline import render_inputs, render_policy_file
from infra.summary import summarize
from runtime.cli import tables
from runtime.cli.consoles import console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.policy_commands import (
    ExampleOption,
    PolicyFile,
    PolicyOption,
    input_files,
    policy_file,
    print_warnings,
)
from runtime.cli.whatif_commands import replay_demo

TargetOption = Annotated[
    Target,
    typer.Option("--target", "-t", help="Node-pool target: labels (existing nodes) or karpenter."),
]
ToleranceOption = Annotated[
    HpaTolerance,
    typer.Option(
        "--hpa-tolerance",
        help="Flex HPA tolerance: cluster (controller flag) or behavior (per-HPA 0, k8s >= 1.33).",
    ),
]
OutOption = Annotated[Path, typer.Option("--out", "-o", help="Directory to write the YAML into.")]
ServingOption = Annotated[
    ServingMode,
    typer.Option(
        "--serving",
        help="Serving layer (stack option gpupool:serving): inference-extension, services or off.",
    ),
]
ObjectiveApiOption = Annotated[
    ObjectiveApi,
    typer.Option(
        "--inference-objective-api",
        help="InferenceObjective group/version (gpupool:inferenceObjectiveApi): "
        "inference.networking.x-k8s.io/v1alpha2 (GIE <= v1.5) or llm-d.ai/v1alpha2 (llm-d-router).",
    ),
]


def render(
    file: PolicyFile = None,
    out: OutOption = Path("build"),
    target: TargetOption = "labels",
    hpa_tolerance: ToleranceOption = "cluster",
    serving: ServingOption = DEFAULT_SERVING.mode,
    objective_api: ObjectiveApiOption = DEFAULT_SERVING.objective_api,
    example: ExampleOption = False,
) -> None:
    """Write every object as YAML, one file each, byte-identical for the same policy; the
    directory is replaced whole (files gpupool did not write are kept)."""
    stack = StackOptions(target, hpa_tolerance, ServingOptions(serving, objective_api))
    path = policy_file(file, example=example)
    with reported_errors():
        inputs = load_inputs(path, serving=stack.serving, target=stack.target)
        documents = render_inputs(inputs, stack=stack).documents
        result = _write(out, documents, input_files(path, inputs.policy))
    print_warnings(inputs)
    console.print(
        f"{out}: {len(documents)} files ({len(result.written)} written, "
        f"{len(result.unchanged)} unchanged, {len(result.removed)} stale removed)",
        markup=False,
    )


def diff(
    old: Annotated[Path, typer.Argument(help="Policy before the change.")],
    new: Annotated[
        Path | None,
        typer.Argument(
            help="Policy after the change (default: ./policy/pool.yaml).",
            show_default=False,
        ),
    ] = None,
    target: TargetOption = "labels",
    hpa_tolerance: ToleranceOption = "cluster",
    serving: ServingOption = DEFAULT_SERVING.mode,
    objective_api: ObjectiveApiOption = DEFAULT_SERVING.objective_api,
    exit_code: Annotated[
        bool, typer.Option("--exit-code", help="Exit 1 when the renders differ (like git diff).")
    ] = False,
    example: Annotated[
        bool, typer.Option("--example", help="NEW is the packaged example policy.")
    ] = False,
) -> None:
    """Render both policies and print the object-level difference (exit 0 unless --exit-code)."""
    stack = StackOptions(target, hpa_tolerance, ServingOptions(serving, objective_api))
    new_file = policy_file(new, example=example)
    with reported_errors():
        text = diff_documents(
            render_policy_file(old, stack=stack), render_policy_file(new_file, stack=stack)
        )
    typer.echo(text or "no differences", nl=not text)
    if text and exit_code:
        raise typer.Exit(1)


def demo(
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Directory (default: a new temp dir).")
    ] = None,
    target: TargetOption = "labels",
    whatif_out: Annotated[
        Path, typer.Option("--whatif-out", help="Folder of the what-if report, plots and JSON.")
    ] = Path("build/whatif"),
    file: PolicyOption = None,
    example: ExampleOption = False,
) -> None:
    """Validate and render the policy (./policy/pool.yaml, or the packaged example with
    --example), summarise what it declares, and replay the bundled traces through its closed
    loop (pooled vs fixed topology)."""
    stack = StackOptions(target)
    path = policy_file(file, example=example)
    with reported_errors():
        inputs = load_inputs(path, serving=stack.serving, target=stack.target)
        rendered = render_inputs(inputs, stack=stack)
        objects = rendered.objects
        folder = out or Path(tempfile.mkdtemp(prefix="gpupool-demo-"))
        _write(folder, rendered.documents, input_files(path, inputs.policy))
    print_warnings(inputs)
    for table in summarize(inputs.policy, objects):
        tables.print_table(console, table.columns, table.rows, title=table.title)
    console.print(
        f"{path}: valid; {len(objects)} objects ({target} target) rendered to {folder}",
        markup=False,
    )
    replay_demo(whatif_out, path)


def _write(out: Path, documents: dict[str, str], inputs: list[Path]) -> FolderResult:
    """``write_documents``, its refusal reported as one line like every domain error."""
    try:
        return write_documents(out, documents, inputs)
    except OutputError as exc:
        raise UsageProblem(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.command()(render)
    app.command()(diff)
    app.command()(demo)

"""``gpupool init``: a short, commented policy for the owner's cluster, from flags or from
questions on a terminal; validated as ``gpupool validate`` would, then the next commands."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import typer

from infra.inputs import BundleInputs, load_inputs
from policy import PolicyError, PoolPolicy, Problem
from policy.effects import unlabelled_production
from policy.placeholders import placeholder_warnings
from runtime.atomic_file import OutputError, write_files
from runtime.cli.consoles import console, err_console
from runtime.cli.errors import reported_errors
from runtime.cli.init_answers import Asker, answers_from, checked, refuse
from runtime.cli.init_options import (
    AlertWebhookOption,
    ClusterNameOption,
    FlexConfigOption,
    FlexGpuMemoryOption,
    FlexGpuModelOption,
    FlexGpusPerNodeOption,
    FlexModelOption,
    FlexNodesOption,
    FlexTpOption,
    ForceOption,
    GpuMemoryOption,
    GpuModelOption,
    GpusPerNodeOption,
    InitFlags,
    LendIdleOption,
    ModelFlags,
    NonInteractiveOption,
    OutOption,
    OwnerFlags,
    PoolFlags,
    ProdNodesOption,
    ProductionFlags,
    ProductionOption,
    ProductionScalingOption,
    RepoUrlOption,
    RuntimeImageOption,
)
from runtime.cli.policy_commands import LOCAL_POLICY
from runtime.init.writer import Answers, InitError, Model, Written, decide
from runtime.vllm.model_spec import ModelSpec, parse_model_config

WHATIF_COMMAND = "gpupool whatif --hours 24 --fit-production"
"""The first replay init suggests: ``--fit-production`` scales the bundled production sample
down to a cluster smaller than its peak (67 GPUs), and changes nothing on a larger one."""

COMMIT_COMMAND = 'git add policy build && git commit -m "gpupool policy"'


def stdin_is_terminal() -> bool:
    """Whether ``init`` may ask questions (tests replace it to answer them)."""
    return sys.stdin.isatty()


def init(
    out: OutOption = Path("."),
    non_interactive: NonInteractiveOption = False,
    force: ForceOption = False,
    cluster_name: ClusterNameOption = None,
    gpu_model: GpuModelOption = None,
    gpus_per_node: GpusPerNodeOption = 8,
    gpu_memory_gib: GpuMemoryOption = None,
    prod_nodes: ProdNodesOption = None,
    flex_gpu_model: FlexGpuModelOption = None,
    flex_gpus_per_node: FlexGpusPerNodeOption = None,
    flex_gpu_memory_gib: FlexGpuMemoryOption = None,
    flex_nodes: FlexNodesOption = None,
    flex_model: FlexModelOption = None,
    flex_config: FlexConfigOption = None,
    flex_tp: FlexTpOption = None,
    production: ProductionOption = None,
    production_scaling: ProductionScalingOption = "gpu_utilization",
    lend_idle: LendIdleOption = None,
    repo_url: RepoUrlOption = None,
    runtime_image: RuntimeImageOption = None,
    alert_webhook: AlertWebhookOption = None,
) -> None:
    """Write policy/pool.yaml for your cluster (about 40 commented lines) and the flex
    model's config.json, validate them, and print the next commands.

    Flags answer the questions; on a terminal init asks for what they leave out.

    Values only you know and did not give (runtime image, repository URL, alert
    receiver) become placeholders marked TODO; `gpupool validate` warns until you
    replace them."""
    flags = InitFlags(
        cluster_name=cluster_name,
        prod=PoolFlags(gpu_model, gpus_per_node, gpu_memory_gib, prod_nodes),
        flex=PoolFlags(
            flex_gpu_model, flex_gpus_per_node or gpus_per_node, flex_gpu_memory_gib, flex_nodes
        ),
        model=ModelFlags(flex_model, flex_config, flex_tp),
        production=ProductionFlags(production, production_scaling, lend_idle),
        owner=OwnerFlags(repo_url, runtime_image, alert_webhook),
    )
    ask = Asker(interactive=not non_interactive and stdin_is_terminal())
    if not ask.interactive:
        _require(flags)
    _check_target(out, force)
    answers = answers_from(ask, out, flags)
    written, inputs = _write_checked(out, answers)
    _report(out, answers, written, inputs)


def _require(flags: InitFlags) -> None:
    """Without questions, refuse before anything else when a needed flag is missing."""
    missing = flags.missing()
    if missing:
        refuse(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required with "
            "--non-interactive (on a terminal, init asks instead)"
        )


def _check_target(out: Path, force: bool) -> None:
    """An existing policy (or a link where it goes) is replaced only with ``--force``."""
    target = out / LOCAL_POLICY
    if (target.exists() or target.is_symlink()) and not force:
        refuse(f"{target} exists; pass --force to replace it, or edit it")


def _spec(model: Model) -> ModelSpec:
    try:
        document = json.loads(model.config)
    except ValueError as exc:
        raise InitError(f"the config.json of {model.hf_id} is not JSON: {exc}") from None
    return parse_model_config(document, f"models/{model.file}")


def _write_checked(out: Path, answers: Answers) -> tuple[Written, BundleInputs]:
    """Decide, write into a scratch copy, validate it as ``gpupool validate`` does, then
    move it into place: a policy that does not validate is never written."""
    written = checked(lambda: decide(answers, _spec(answers.model)))
    with tempfile.TemporaryDirectory(prefix="gpupool-init-") as tmp:
        scratch = Path(tmp) / "policy"
        (scratch / "models").mkdir(parents=True)
        (scratch / "pool.yaml").write_text(written.text, encoding="utf-8")
        (scratch / "models" / answers.model.file).write_bytes(answers.model.config)
        try:
            load_inputs(scratch / "pool.yaml")
        except PolicyError as exc:
            for problem in exc.problems:
                err_console.print(_relocated(problem, scratch, out / "policy"), markup=False)
            raise typer.Exit(1) from None
    final = out / "policy"
    files = {
        final / "pool.yaml": written.text.encode("utf-8"),
        final / "models" / answers.model.file: answers.model.config,
    }
    try:
        write_files(files)
    except OutputError as exc:
        refuse(str(exc))
    with reported_errors():  # what was written, read back as `gpupool validate` reads it
        inputs = load_inputs(final / "pool.yaml")
    return written, inputs


def _relocated(problem: Problem, scratch: Path, final: Path) -> str:
    return str(problem).replace(str(scratch), str(final))


def _report(out: Path, answers: Answers, written: Written, inputs: BundleInputs) -> None:
    policy_path = out / LOCAL_POLICY
    lines = len(written.text.splitlines())
    licence = f", {answers.model.licence}" if answers.model.licence else ""
    console.print(
        f"wrote {policy_path} ({lines} lines) and {policy_path.parent}/models/"
        f"{answers.model.file} ({answers.model.hf_id}{licence}: architecture fields only)",
        markup=False,
    )
    policy = inputs.policy
    console.print(
        f"{policy_path}: ok ({len(policy.node_pools)} node pools, {len(policy.workloads)} flex "
        f"workloads); {written.workload} serves {answers.model.hf_id} on "
        f"{written.tensor_parallel} GPU(s) per replica, max_model_len {written.max_model_len}",
        markup=False,
    )
    placeholders = {path for path, _ in placeholder_warnings(policy)}
    todo = [w for w in inputs.warnings if w.path in placeholders]
    if todo:
        console.print("Replace the placeholders before you apply (validate warns until then):")
        for warning in todo:
            console.print(f"  {warning}", markup=False)
    if answers.model.gated:
        console.print(
            f"{answers.model.hf_id} is gated: set hf_token_secret (commented in the file) to a "
            "Secret with a Hugging Face token that accepted its licence",
            markup=False,
        )
    where = "" if out.resolve() == Path.cwd().resolve() else f" (in {out})"
    console.print(f"Next{where}:", markup=False)
    steps = (
        (WHATIF_COMMAND, "a day of the bundled production sample on your pools"),
        (render_command(policy), "every Kubernetes object, one file each, to review"),
        (COMMIT_COMMAND, "then a policy change is a pull request"),
    )
    width = max(len(command) for command, _ in steps)
    for command, why in steps:
        console.print(f"  {command:<{width}}  # {why}", markup=False)


def render_command(policy: PoolPolicy) -> str:
    """The render init suggests: counted nodes (none named) are Karpenter's to make and label;
    the labels target would refuse production on prod nodes it cannot label."""
    karpenter = " --target karpenter" if unlabelled_production(policy) else ""
    return f"gpupool render --out build/{karpenter}"


def register(app: typer.Typer) -> None:
    app.command()(init)

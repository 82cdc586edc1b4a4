"""``gpupool init``: a short, commented policy for the owner's cluster, from flags or from
questions on a terminal; validated as ``gpupool validate`` would, then the next commands."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer

from infra.inputs import BundleInputs, load_inputs
from policy import PolicyError, PoolPolicy, Problem
from policy.base import check_dns_label
from policy.effects import unlabelled_production
from policy.placeholders import placeholder_warnings
from runtime.atomic_file import OutputError, write_files
from runtime.cli.consoles import console, err_console
from runtime.cli.errors import reported_errors
from runtime.cli.policy_commands import LOCAL_POLICY
from runtime.init.catalog import MODELS, find_gpu, find_model, gpu_names
from runtime.init.writer import (
    Answers,
    Gpu,
    InitError,
    Model,
    Pool,
    Scaling,
    Written,
    decide,
    parse_nodes,
    parse_production,
)
from runtime.vllm import ModelConfigError
from runtime.vllm.model_spec import ModelSpec, parse_model_config

T = TypeVar("T")

WHATIF_COMMAND = "gpupool whatif --hours 24 --fit-production"
"""The first replay init suggests: ``--fit-production`` scales the bundled production sample
down to a cluster smaller than its peak (67 GPUs), and changes nothing on a larger one."""

COMMIT_COMMAND = 'git add policy build && git commit -m "gpupool policy"'

USAGE_EXIT = 2
"""Exit status for answers that are missing or make no policy (like a bad option)."""


def stdin_is_terminal() -> bool:
    """Whether ``init`` may ask questions (tests replace it to answer them)."""
    return sys.stdin.isatty()


def init(
    out: Annotated[
        Path, typer.Option("--out", help="Policy repository to write policy/ into.")
    ] = Path("."),
    non_interactive: Annotated[
        bool,
        typer.Option("--non-interactive", help="Never ask: what no flag gives is refused."),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing policy/pool.yaml.")
    ] = False,
    cluster_name: Annotated[
        str | None,
        typer.Option(help="Cluster name, a label on every alert (default: OUT's folder name)."),
    ] = None,
    gpu_model: Annotated[
        str | None,
        typer.Option(
            help="Production GPUs: A100, H100, H200, L40S, A10G, T4 (or their "
            "nvidia.com/gpu.product label; another GPU needs --gpu-memory-gib)."
        ),
    ] = None,
    gpus_per_node: Annotated[
        int, typer.Option(min=1, max=64, help="GPUs per production node.")
    ] = 8,
    gpu_memory_gib: Annotated[
        float | None,
        typer.Option(
            min=1, max=1024, help="Memory of one production GPU as nvidia-smi says (GiB)."
        ),
    ] = None,
    prod_nodes: Annotated[
        str | None,
        typer.Option(help="Production nodes: names a,b,c (labelled) or a number of nodes."),
    ] = None,
    flex_gpu_model: Annotated[
        str | None, typer.Option(help="Flex GPUs (default: --gpu-model).")
    ] = None,
    flex_gpus_per_node: Annotated[
        int | None, typer.Option(min=1, max=64, help="GPUs per flex node (default: as prod).")
    ] = None,
    flex_gpu_memory_gib: Annotated[
        float | None,
        typer.Option(min=1, max=1024, help="Memory of one flex GPU, GiB (default: as known)."),
    ] = None,
    flex_nodes: Annotated[
        str | None, typer.Option(help="Flex nodes: names a,b,c or a number of nodes.")
    ] = None,
    flex_model: Annotated[
        str | None,
        typer.Option(
            help="Hugging Face id of the model flex serves; gpupool ships the config.json of "
            "Llama 3.1 8B/70B, Qwen2.5 7B/72B, Mistral 7B, Phi-3 mini, DeepSeek-V2-Lite."
        ),
    ] = None,
    flex_config: Annotated[
        Path | None,
        typer.Option(help="The model's own config.json (or its folder), for another model."),
    ] = None,
    flex_tp: Annotated[
        int | None,
        typer.Option(min=1, max=16, help="Flex GPUs per replica (default: the fewest it fits)."),
    ] = None,
    production: Annotated[
        list[str] | None,
        typer.Option(
            help="A production workload, NAMESPACE/DEPLOYMENT:GPUS (GPUs per replica); repeatable."
        ),
    ] = None,
    production_scaling: Annotated[
        Scaling,
        typer.Option(
            help="How production scales: gpu_utilization (gpupool renders an HPA on GPU duty, "
            "so flex gets what production idles), fixed (your replica count) or external "
            "(your own HPA)."
        ),
    ] = "gpu_utilization",
    lend_idle: Annotated[
        bool | None,
        typer.Option(
            "--lend-idle/--no-lend-idle",
            help="Flex may use the GPUs production leaves idle (default: when a production "
            "GPU has at least a flex GPU's memory).",
            show_default=False,
        ),
    ] = None,
    repo_url: Annotated[
        str | None,
        typer.Option(help="Git URL of OUT, the tuner clones it (default: OUT's origin remote)."),
    ] = None,
    runtime_image: Annotated[
        str | None,
        typer.Option(help="Your build of infra/images/runtime.Dockerfile, REGISTRY/NAME:TAG."),
    ] = None,
    alert_webhook: Annotated[
        str | None, typer.Option(help="Webhook URL that receives gpupool's alerts.")
    ] = None,
) -> None:
    """Write policy/pool.yaml for your cluster (about 40 commented lines) and the flex
    model's config.json, validate them, and print the next commands.

    Flags answer the questions; on a terminal init asks for what they leave out.

    Values only you know and did not give (runtime image, repository URL, alert
    receiver) become placeholders marked TODO; `gpupool validate` warns until you
    replace them."""
    ask = _Asker(interactive=not non_interactive and stdin_is_terminal())
    if not ask.interactive:
        required = {
            "--gpu-model": gpu_model,
            "--prod-nodes": prod_nodes,
            "--flex-nodes": flex_nodes,
            "--flex-model": flex_model,
        }
        missing = [flag for flag, value in required.items() if value is None]
        if missing:
            _refuse(
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required with "
                "--non-interactive (on a terminal, init asks instead)"
            )
    target = out / LOCAL_POLICY
    if (target.exists() or target.is_symlink()) and not force:
        _refuse(f"{target} exists; pass --force to replace it, or edit it")
    name = ask.text(
        cluster_name,
        "Cluster name (a label on every alert)",
        default=_folder_name(out),
        check=check_dns_label,
    )
    prod_gpu = ask.text(
        gpu_model,
        "Production GPU model (e.g. A100, H100, H200)",
        check=lambda t: _gpu(t, gpu_memory_gib, "--gpu-model"),
    )
    prod = _pool(ask, prod_gpu, gpus_per_node, gpu_memory_gib, prod_nodes, "prod")

    def flex_memory(gpu: str) -> float | None:
        """--flex-gpu-memory-gib, else --gpu-memory-gib for the production GPU's model."""
        if flex_gpu_memory_gib is not None:
            return flex_gpu_memory_gib
        same = (find_gpu(gpu) or gpu.lower()) == (find_gpu(prod_gpu) or prod_gpu.lower())
        return gpu_memory_gib if same else None

    flex_gpu = ask.text(
        flex_gpu_model if flex_gpu_model or ask.interactive else prod_gpu,
        "Flex GPU model",
        default=prod_gpu,
        check=lambda t: _gpu(t, flex_memory(t), "--flex-gpu-model"),
    )
    flex = _pool(
        ask,
        flex_gpu,
        flex_gpus_per_node or gpus_per_node,
        flex_memory(flex_gpu),
        flex_nodes,
        "flex",
    )
    model = _model(ask, flex_model, flex_config)
    refs = production
    if refs is None and ask.interactive:
        answer = ask.text(
            None,
            "Production workloads, NAMESPACE/DEPLOYMENT:GPUS, comma-separated (empty: none)",
            optional=True,
            check=lambda t: parse_production([t]),
        )
        refs = [answer] if answer else []
    repo = ask.text(
        repo_url,
        "Git URL of this policy repository (empty: a TODO placeholder)",
        default=_origin(out),
        optional=True,
    )
    image = ask.text(
        runtime_image, "Runtime image you built (empty: a TODO placeholder)", optional=True
    )
    webhook = ask.text(
        alert_webhook, "Alert webhook URL (empty: a TODO placeholder)", optional=True
    )
    answers = Answers(
        cluster_name=name,
        prod=prod,
        flex=flex,
        model=model,
        production=_checked(lambda: parse_production(refs or [])),
        production_scaling=production_scaling,
        lend_idle=(
            lend_idle if lend_idle is not None else prod.gpu.memory_gib >= flex.gpu.memory_gib
        ),
        repo_url=repo or None,
        runtime_image=image or None,
        alert_webhook=webhook or None,
        tensor_parallel=flex_tp,
    )
    written, inputs = _write_checked(out, answers)
    _report(out, answers, written, inputs)


class _Asker:
    """An answer from its flag, else from a question on a terminal, else its default."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive

    def text(
        self,
        given: str | None,
        question: str,
        *,
        default: str | None = None,
        optional: bool = False,
        check: Callable[[str], object] | None = None,
    ) -> str:
        """``given``; else, on a terminal, the answer (asked again until ``check`` passes);
        else ``default`` ("" when there is none: the caller checked required flags)."""
        if given is not None:
            return given
        if not self.interactive:
            return default or ""
        while True:
            answer = str(
                typer.prompt(question, default=default or "", show_default=bool(default))
            ).strip()
            if not answer and not optional:
                continue
            if answer and check is not None:
                try:
                    check(answer)
                except ValueError as exc:
                    err_console.print(f"  {exc}", markup=False)
                    continue
            return answer


def _refuse(line: str) -> NoReturn:
    err_console.print(f"error: {line}", markup=False)
    raise typer.Exit(USAGE_EXIT)


def _checked(make: Callable[[], T]) -> T:
    try:
        return make()
    except (InitError, ModelConfigError) as exc:
        _refuse(str(exc))


def _folder_name(out: Path) -> str:
    """OUT's folder name as a cluster name, when it is a DNS label; else ``gpu-cluster``."""
    name = out.resolve().name.lower()
    try:
        return check_dns_label(name)
    except ValueError:
        return "gpu-cluster"


def _origin(out: Path) -> str | None:
    """OUT's ``origin`` remote URL when OUT is a git checkout that has one."""
    if not out.is_dir():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(out), "remote", "get-url", "origin"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    url = done.stdout.strip()
    return url if done.returncode == 0 and url else None


def _gpu(text: str, memory_gib: float | None, option: str) -> Gpu:
    entry = find_gpu(text)
    if entry is not None:
        gpu = Gpu.of(entry)
        if memory_gib is None:
            return gpu
        return Gpu(gpu.label, memory_gib, "as given", gpu.hopper_or_newer)
    if memory_gib is None:
        raise InitError(
            f"{option} {text!r}: gpupool knows the memory of {gpu_names()}; for another GPU "
            "give its product label (nvidia.com/gpu.product) and --gpu-memory-gib (or "
            "--flex-gpu-memory-gib) from nvidia-smi"
        )
    return Gpu(text, memory_gib, "as given")


def _pool(
    ask: _Asker,
    gpu_text: str,
    gpus_per_node: int,
    memory_gib: float | None,
    nodes_text: str | None,
    role: str,
) -> Pool:
    option = f"--{role}-nodes"
    flag = "--gpu-model" if role == "prod" else "--flex-gpu-model"
    gpu = _checked(lambda: _gpu(gpu_text, memory_gib, flag))
    text = ask.text(
        nodes_text,
        f"{'Production' if role == 'prod' else 'Flex'} nodes: names a,b,c or a number of nodes",
        check=lambda t: parse_nodes(t, option),
    )
    names, count = _checked(lambda: parse_nodes(text, option))
    return Pool(gpu, gpus_per_node, names, count)


def _model(ask: _Asker, flex_model: str | None, flex_config: Path | None) -> Model:
    shipped = ", ".join(m.hf_id for m in MODELS)
    model_id = ask.text(flex_model, f"Flex model, a Hugging Face id (shipped: {shipped})")
    entry = find_model(model_id)
    if flex_config is None and entry is None:
        if not ask.interactive:
            _refuse(
                f"--flex-model {model_id!r}: gpupool ships no config.json for it (shipped: "
                f"{shipped}); pass the model's own with --flex-config PATH"
            )
        flex_config = Path(ask.text(None, f"Path of the config.json of {model_id}"))
    if flex_config is not None:
        file = flex_config / "config.json" if flex_config.is_dir() else flex_config
        try:
            config = file.read_bytes()
        except OSError as exc:
            _refuse(f"--flex-config {flex_config}: {exc}")
        stem = entry.stem if entry is not None else _file_stem(model_id)
        return Model(model_id, config, f"{stem}.json")
    assert entry is not None
    return Model(entry.hf_id, entry.path.read_bytes(), entry.file, entry.licence, entry.gated)


def _file_stem(model_id: str) -> str:
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in model_id.split("/")[-1])
    return stem.lower().strip(".-") or "model"


def _spec(model: Model) -> ModelSpec:
    try:
        document = json.loads(model.config)
    except ValueError as exc:
        raise InitError(f"the config.json of {model.hf_id} is not JSON: {exc}") from None
    return parse_model_config(document, f"models/{model.file}")


def _write_checked(out: Path, answers: Answers) -> tuple[Written, BundleInputs]:
    """Decide, write into a scratch copy, validate it as ``gpupool validate`` does, then
    move it into place: a policy that does not validate is never written."""
    written = _checked(lambda: decide(answers, _spec(answers.model)))
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
        _refuse(str(exc))
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

"""``gpupool init``'s answers: each from its flag, else from a question on a terminal, else
its default; an answer that is missing or makes no policy is refused (exit 2)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import typer

from policy.base import check_dns_label
from runtime.cli.consoles import err_console
from runtime.cli.init_options import InitFlags, OwnerFlags, PoolFlags
from runtime.init.catalog import MODELS, find_gpu, find_model, gpu_names
from runtime.init.writer import (
    Answers,
    Gpu,
    InitError,
    Model,
    Pool,
    parse_nodes,
    parse_production,
)
from runtime.vllm import ModelConfigError

T = TypeVar("T")

USAGE_EXIT = 2
"""Exit status for answers that are missing or make no policy (like a bad option)."""


class Asker:
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


def refuse(line: str) -> NoReturn:
    """``error: LINE`` on stderr and exit 2, as a bad option would."""
    err_console.print(f"error: {line}", markup=False)
    raise typer.Exit(USAGE_EXIT)


def checked(make: Callable[[], T]) -> T:
    """``make()``, an answer it cannot use refused as one line."""
    try:
        return make()
    except (InitError, ModelConfigError) as exc:
        refuse(str(exc))


def answers_from(ask: Asker, out: Path, flags: InitFlags) -> Answers:
    """The answers in the order a terminal asks them: cluster, pools, model, production,
    then what only the owner knows; the production references are checked last."""
    name = ask.text(
        flags.cluster_name,
        "Cluster name (a label on every alert)",
        default=_folder_name(out),
        check=check_dns_label,
    )
    prod, flex = _pools(ask, flags.prod, flags.flex)
    model = _model(ask, flags.model.hf_id, flags.model.config)
    refs = flags.production.refs
    if refs is None and ask.interactive:
        answer = ask.text(
            None,
            "Production workloads, NAMESPACE/DEPLOYMENT:GPUS, comma-separated (empty: none)",
            optional=True,
            check=lambda t: parse_production([t]),
        )
        refs = [answer] if answer else []
    owner = _owner(ask, out, flags.owner)
    lend_idle = flags.production.lend_idle
    return Answers(
        cluster_name=name,
        prod=prod,
        flex=flex,
        model=model,
        production=checked(lambda: parse_production(refs or [])),
        production_scaling=flags.production.scaling,
        lend_idle=(
            lend_idle if lend_idle is not None else prod.gpu.memory_gib >= flex.gpu.memory_gib
        ),
        repo_url=owner.repo_url or None,
        runtime_image=owner.runtime_image or None,
        alert_webhook=owner.alert_webhook or None,
        tensor_parallel=flags.model.tensor_parallel,
    )


def _pools(ask: Asker, prod_flags: PoolFlags, flex_flags: PoolFlags) -> tuple[Pool, Pool]:
    """The production pool, then the flex pool: its GPU model and memory default to
    production's."""
    prod_gpu = ask.text(
        prod_flags.gpu_model,
        "Production GPU model (e.g. A100, H100, H200)",
        check=lambda t: _gpu(t, prod_flags.gpu_memory_gib, "--gpu-model"),
    )
    prod = _pool(
        ask, prod_gpu, prod_flags.gpus_per_node, prod_flags.gpu_memory_gib, prod_flags.nodes, "prod"
    )

    def flex_memory(gpu: str) -> float | None:
        """--flex-gpu-memory-gib, else --gpu-memory-gib for the production GPU's model."""
        if flex_flags.gpu_memory_gib is not None:
            return flex_flags.gpu_memory_gib
        same = (find_gpu(gpu) or gpu.lower()) == (find_gpu(prod_gpu) or prod_gpu.lower())
        return prod_flags.gpu_memory_gib if same else None

    flex_gpu = ask.text(
        flex_flags.gpu_model if flex_flags.gpu_model or ask.interactive else prod_gpu,
        "Flex GPU model",
        default=prod_gpu,
        check=lambda t: _gpu(t, flex_memory(t), "--flex-gpu-model"),
    )
    flex = _pool(
        ask, flex_gpu, flex_flags.gpus_per_node, flex_memory(flex_gpu), flex_flags.nodes, "flex"
    )
    return prod, flex


def _owner(ask: Asker, out: Path, given: OwnerFlags) -> OwnerFlags:
    """What only the owner knows, "" where a TODO placeholder goes (the repository URL
    defaults to OUT's origin remote)."""
    repo = ask.text(
        given.repo_url,
        "Git URL of this policy repository (empty: a TODO placeholder)",
        default=_origin(out),
        optional=True,
    )
    image = ask.text(
        given.runtime_image, "Runtime image you built (empty: a TODO placeholder)", optional=True
    )
    webhook = ask.text(
        given.alert_webhook, "Alert webhook URL (empty: a TODO placeholder)", optional=True
    )
    return OwnerFlags(repo, image, webhook)


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
    ask: Asker,
    gpu_text: str,
    gpus_per_node: int,
    memory_gib: float | None,
    nodes_text: str | None,
    role: str,
) -> Pool:
    option = f"--{role}-nodes"
    flag = "--gpu-model" if role == "prod" else "--flex-gpu-model"
    gpu = checked(lambda: _gpu(gpu_text, memory_gib, flag))
    text = ask.text(
        nodes_text,
        f"{'Production' if role == 'prod' else 'Flex'} nodes: names a,b,c or a number of nodes",
        check=lambda t: parse_nodes(t, option),
    )
    names, count = checked(lambda: parse_nodes(text, option))
    return Pool(gpu, gpus_per_node, names, count)


def _model(ask: Asker, flex_model: str | None, flex_config: Path | None) -> Model:
    shipped = ", ".join(m.hf_id for m in MODELS)
    model_id = ask.text(flex_model, f"Flex model, a Hugging Face id (shipped: {shipped})")
    entry = find_model(model_id)
    if flex_config is None and entry is None:
        if not ask.interactive:
            refuse(
                f"--flex-model {model_id!r}: gpupool ships no config.json for it (shipped: "
                f"{shipped}); pass the model's own with --flex-config PATH"
            )
        flex_config = Path(ask.text(None, f"Path of the config.json of {model_id}"))
    if flex_config is not None:
        file = flex_config / "config.json" if flex_config.is_dir() else flex_config
        try:
            config = file.read_bytes()
        except OSError as exc:
            refuse(f"--flex-config {flex_config}: {exc}")
        stem = entry.stem if entry is not None else _file_stem(model_id)
        return Model(model_id, config, f"{stem}.json")
    assert entry is not None
    return Model(entry.hf_id, entry.path.read_bytes(), entry.file, entry.licence, entry.gated)


def _file_stem(model_id: str) -> str:
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in model_id.split("/")[-1])
    return stem.lower().strip(".-") or "model"

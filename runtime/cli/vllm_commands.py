"""``vllm-args`` and ``kv-report``: the flex container's vLLM arguments explained, and the KV
memory a real trace would waste at the chosen block size."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, get_args

import typer

from policy import PoolPolicy, load_policy
from policy.workloads import AttentionBackend, FlexWorkload
from runtime.cli import tables
from runtime.cli.consoles import console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.policy_commands import ExampleOption, policy_file
from runtime.vllm import (
    BackendError,
    KvCachePlan,
    KvPlanError,
    ModelConfigError,
    load_model_spec,
    plan_kv_cache,
    render_args,
)
from runtime.vllm.fragmentation import WasteReport, waste_report
from runtime.vllm.model_spec import read_model_config
from runtime.vllm.trace import TraceError, load_azure_trace

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:([kmgtKMGT])(i?)B?)?$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
WASTE_GOAL = 0.02
"""The product's goal for paged KV waste at the chosen block size (vLLM paper: under 4 %)."""


def parse_memory(text: str) -> int:
    """Bytes in ``141G``/``141Gi`` (binary, as vLLM reads ``--kv-cache-memory-bytes``) or
    ``141g`` (decimal)."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise typer.BadParameter(f"expected a size such as 141G, 80Gi or 512M, found {text!r}")
    number, unit, binary = match.groups()
    if unit is None:
        return int(float(number))
    table = _BINARY if unit.isupper() or binary else _DECIMAL
    return int(float(number) * table[unit.upper() if unit.upper() in table else unit])


PolicyOption = Annotated[
    Path | None,
    typer.Option("--policy", help="Policy file (default: ./policy/pool.yaml).", show_default=False),
]
WorkloadOption = Annotated[
    str | None, typer.Option("--workload", help="Flex workload name (default: the first one).")
]
ModelOption = Annotated[
    Path | None,
    typer.Option(
        "--model",
        help="Model directory or config.json (default: the workload's model and hf_config); "
        "the arguments then serve this model.",
    ),
]
GpuMemoryOption = Annotated[
    str | None,
    typer.Option(
        "--gpu-memory",
        help="Memory of one GPU, e.g. 141G (binary units; default: the workload's node pool).",
    ),
]
TpOption = Annotated[
    int | None,
    typer.Option("--tp", min=1, help="Tensor-parallel size (default: gpus_per_replica)."),
]
BackendOption = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help=f"Attention backend, one of {list(get_args(AttentionBackend))} "
        "(default: the workload's).",
    ),
]


@dataclass(frozen=True)
class _Inputs:
    policy: PoolPolicy
    workload: FlexWorkload
    plan: KvCachePlan


@contextmanager
def _domain_errors() -> Iterator[None]:
    """Model, plan, backend and trace errors become one clear line and exit 1."""
    with reported_errors():
        try:
            yield
        except (ModelConfigError, KvPlanError, BackendError, TraceError) as exc:
            raise UsageProblem(str(exc)) from None


def _plan(
    source: Path,
    workload_name: str | None,
    model_dir: Path | None,
    gpu_memory: str | None,
    tp: int | None,
    backend: str | None,
) -> _Inputs:
    policy = load_policy(source)
    workload = _workload(policy, workload_name, source)
    if backend is not None and backend not in get_args(AttentionBackend):
        raise UsageProblem(
            f"--backend {backend!r} is unknown; expected one of {list(get_args(AttentionBackend))}"
        )
    model = load_model_spec(model_dir or source.parent / workload.hf_config)
    if model_dir is not None:
        # --model describes the model it names: vLLM's --model (and the title, and the KV
        # snapshot identity) is that model, not the workload's.
        workload = workload.model_copy(update={"model": served_model(model_dir)})
    plan = plan_kv_cache(
        policy,
        workload,
        model,
        gpu_memory_bytes=parse_memory(gpu_memory) if gpu_memory else None,
        backend=backend,  # type: ignore[arg-type]  # checked against the Literal above
        tensor_parallel=tp,
    )
    return _Inputs(policy, workload, plan)


def served_model(model: Path) -> str:
    """What vLLM's ``--model`` is for ``--model PATH``: a directory is the model itself (its
    weights beside ``config.json``); a ``config.json`` file, its folder; another JSON file (a
    config kept apart from any weights), the Hugging Face id in its ``_name_or_path`` when it
    has one, else the file as given."""
    if model.is_dir():
        return str(model)
    if model.name == "config.json":
        return str(model.parent)
    try:
        name = json.loads(read_model_config(model)).get("_name_or_path")
    except (OSError, ValueError, AttributeError, RecursionError):
        name = None
    return name if isinstance(name, str) and name else str(model)


def _workload(policy: PoolPolicy, name: str | None, source: Path) -> FlexWorkload:
    names = [w.name for w in policy.workloads]
    for workload in policy.workloads:
        if name is None or workload.name == name:
            return workload
    wanted = f"workload {name!r}" if name else "a flex workload"
    raise UsageProblem(f"{source}: {wanted} not found; workloads: {names}")


def vllm_args(
    model: ModelOption = None,
    gpu_memory: GpuMemoryOption = None,
    tp: TpOption = None,
    backend: BackendOption = None,
    policy: PolicyOption = None,
    example: ExampleOption = False,
    workload: WorkloadOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the arguments, as a JSON list.")
    ] = False,
) -> None:
    """Print the flex container's vLLM arguments and a table explaining each derived number."""
    source = policy_file(policy, example=example)
    with _domain_errors():
        plan = _plan(source, workload, model, gpu_memory, tp, backend).plan
    args = render_args(plan)
    if as_json:
        typer.echo(json.dumps(args))
        return
    tables.print_table(
        console,
        ("number", "value", "how it was derived"),
        [(row.name, row.value, row.why) for row in plan.derivations()],
        title=f"vLLM KV cache for {plan.model_path}",
    )
    for name in plan.env_unset:
        console.print(f"{name} must be unset: it overrides these arguments", markup=False)
    typer.echo(shlex.join(args))


def kv_report(
    trace: Annotated[Path, typer.Option("--trace", help="Azure-format request trace (CSV).")],
    model: ModelOption = None,
    gpu_memory: GpuMemoryOption = None,
    tp: TpOption = None,
    backend: BackendOption = None,
    policy: PolicyOption = None,
    example: ExampleOption = False,
    workload: WorkloadOption = None,
) -> None:
    """Internal fragmentation of a trace at the chosen block size and its neighbours, against a
    contiguous allocator that reserves max-model-len per sequence."""
    source = policy_file(policy, example=example)
    with _domain_errors():
        plan = _plan(source, workload, model, gpu_memory, tp, backend).plan
        requests = load_azure_trace(trace)
    report = waste_report(
        [r.total_tokens for r in requests],
        chosen_block_size=plan.block_size,
        rule=plan.backend,
        max_model_len=plan.max_model_len,
    )
    _print_report(trace, report)


def _print_report(trace: Path, report: WasteReport) -> None:
    rows = []
    for waste in [*report.paged, report.contiguous]:
        label = waste.label
        if waste.label.endswith(f" {report.chosen_block_size}"):
            label += " (chosen)"
        if not waste.legal:
            label += " (backend refuses)"
        rows.append(
            (
                label,
                f"{waste.reserved_tokens:,}",
                f"{waste.wasted_tokens:,}",
                f"{waste.waste_share:.2%}",
            )
        )
    tables.print_table(
        console,
        ("allocator", "reserved tokens", "wasted tokens", "waste"),
        rows,
        title=f"KV waste on {trace.name}",
    )
    chosen = next(w for w in report.paged if w.label.endswith(f" {report.chosen_block_size}"))
    verdict = "meets" if chosen.waste_share < WASTE_GOAL else "MISSES"
    console.print(
        f"{report.requests:,} requests ({report.too_long} longer than max_model_len "
        f"{report.max_model_len}, left out); block {report.chosen_block_size} wastes "
        f"{chosen.waste_share:.2%}: {verdict} the {WASTE_GOAL:.0%} goal; contiguous wastes "
        f"{report.contiguous.waste_share:.2%}",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.command("vllm-args")(vllm_args)
    app.command("kv-report")(kv_report)

"""``gpupool init``'s policy: the owner's answers -> a short, commented ``pool.yaml`` that
validates, renders and replays.

Only what differs by cluster is written (pools, the flex model, production references and
the values only the owner knows); every other field keeps its documented default. A value
the owner did not give that the file needs (the runtime image, the repository URL, the alert
receiver) is written as a placeholder on a ``.invalid`` host (RFC 6761: it never resolves),
marked ``TODO``, and ``gpupool validate`` warns on it until it is replaced
(``policy.placeholders``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ruamel.yaml import YAML

from policy import PoolPolicy, parse_policy
from policy.placeholders import PLACEHOLDER_TLD
from runtime.init.catalog import GpuEntry
from runtime.vllm import BackendError, KvPlanError, ModelConfigError, serve_args
from runtime.vllm.model_spec import ModelSpec

PLACEHOLDER_IMAGE = f"registry.example{PLACEHOLDER_TLD}/gpupool/gpupool:0.1.0"
PLACEHOLDER_REPO = f"https://git.example{PLACEHOLDER_TLD}/your-org/gpu-policy.git"
PLACEHOLDER_WEBHOOK = f"https://alerts.example{PLACEHOLDER_TLD}/gpupool"

PROD_POOL, FLEX_POOL = "gpu-prod", "gpu-flex"
RESERVE_RATIO = 0.2
"""The prod pool's reserve (the shipped example's): flex sheds to keep it free."""
MAX_MODEL_LEN = 8192
"""The flex workload's context unless the model's is shorter (the policy's default)."""


Scaling = Literal["gpu_utilization", "fixed", "external"]
"""How the production workloads scale (``production[*].scale_on``)."""

SCALING_NOTES: dict[str, str] = {
    "gpu_utilization": "gpupool's HPA frees GPUs production idles",
    "fixed": "your replicas; flex never gets their GPUs",
    "external": "your own HPA scales it",
}


class InitError(ValueError):
    """An answer ``gpupool init`` cannot turn into a policy; the message says which."""


@dataclass(frozen=True)
class Gpu:
    """The GPUs of one pool as the policy states them."""

    label: str
    memory_gib: float
    note: str
    """Where ``memory_gib`` came from, for the comment beside it."""
    hopper_or_newer: bool = False

    @classmethod
    def of(cls, entry: GpuEntry) -> Gpu:
        return cls(
            entry.label,
            entry.memory_gib,
            f"nvidia-smi: {entry.memory_mib} MiB (lower it if yours says less)",
            entry.hopper_or_newer,
        )


@dataclass(frozen=True)
class Pool:
    gpu: Gpu
    gpus_per_node: int
    nodes: tuple[str, ...]
    """Node names (the ``labels`` target labels them); empty with a bare count."""
    max_nodes: int

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.max_nodes


@dataclass(frozen=True)
class Production:
    """One production workload by reference: ``NAMESPACE/DEPLOYMENT:GPUS``."""

    namespace: str
    name: str
    gpus_per_replica: int


@dataclass(frozen=True)
class Model:
    """The flex workload's model: its Hugging Face id and its ``config.json``."""

    hf_id: str
    config: bytes
    file: str
    """File name under ``policy/models/``."""
    licence: str | None = None
    gated: bool = False


@dataclass(frozen=True)
class Answers:
    cluster_name: str
    prod: Pool
    flex: Pool
    model: Model
    production: tuple[Production, ...] = ()
    production_scaling: Scaling = "gpu_utilization"
    lend_idle: bool = True
    repo_url: str | None = None
    runtime_image: str | None = None
    alert_webhook: str | None = None
    tensor_parallel: int | None = None
    """Flex GPUs per replica; None: the fewest the model fits."""


@dataclass(frozen=True)
class Written:
    """The policy text and what was decided for the flex workload."""

    text: str
    workload: str
    tensor_parallel: int
    max_model_len: int
    backend: str | None


def parse_nodes(text: str, option: str) -> tuple[tuple[str, ...], int]:
    """``a,b,c`` -> the names and their count; a bare number -> no names, that many nodes."""
    value = text.strip()
    if value.isdigit():
        if int(value) < 1:
            raise InitError(f"{option}: expected at least one node, found {value}")
        return (), int(value)
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise InitError(f"{option}: expected node names a,b,c or a number of nodes")
    if len(set(names)) != len(names):
        raise InitError(f"{option}: a node is listed twice in {value!r}")
    return names, len(names)


_PRODUCTION = re.compile(r"^(?P<ns>[^/\s:]+)/(?P<name>[^/\s:]+):(?P<gpus>[0-9]+)$")


def parse_production(texts: Sequence[str]) -> tuple[Production, ...]:
    """``NAMESPACE/DEPLOYMENT:GPUS`` entries (repeated, or comma-separated)."""
    out: list[Production] = []
    for text in texts:
        for item in (t.strip() for t in text.split(",")):
            if not item:
                continue
            match = _PRODUCTION.match(item)
            if match is None:
                raise InitError(
                    f"--production: expected NAMESPACE/DEPLOYMENT:GPUS (GPUs per replica), "
                    f"e.g. inference/llama-70b:4, found {item!r}"
                )
            out.append(Production(match["ns"], match["name"], int(match["gpus"])))
    return tuple(out)


def workload_name(hf_id: str) -> str:
    """A flex workload name from a model id: ``Qwen/Qwen2.5-7B-Instruct`` ->
    ``qwen2-5-7b-instruct`` (a DNS-1035 label short enough for every derived name)."""
    base = re.sub(r"[^a-z0-9]+", "-", hf_id.split("/")[-1].lower()).strip("-")[:40].strip("-")
    if not base or not base[0].isalpha():
        base = f"m-{base}".strip("-")
    return base


def _scalar(value: str) -> str:
    """``value`` as a YAML scalar: plain where that reads back as the same string."""
    plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9._/@+-]*(:[A-Za-z0-9._/@+-]+)*", value)
    special = value.lower() in {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}
    return value if plain and not special and "//" not in value else json.dumps(value)


def _url(value: str) -> str:
    return value if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s#'\"]+", value) else _scalar(value)


def _list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_scalar(v) for v in values) + "]"


def _memory(value: float) -> str:
    return f"{value:g}"


COMMENT_COLUMN = 32
"""Where the comments beside values start (the shipped example's layout)."""


def _c(text: str, comment: str = "") -> str:
    """``text`` with ``comment`` beside it, aligned at ``COMMENT_COLUMN``."""
    if not comment:
        return text
    return f"{text.ljust(COMMENT_COLUMN - 2)}  # {comment}"


def _owner(value: str | None, placeholder: str, indent: str, what: str) -> tuple[str, list[str]]:
    """The value to write and the lines above it: the owner's as is, or a placeholder under a
    ``TODO`` line."""
    if value:
        return value, []
    return placeholder, [
        f"{indent}# TODO: {what} (a placeholder: {PLACEHOLDER_TLD} never resolves)"
    ]


def render(answers: Answers, tensor_parallel: int, max_model_len: int, backend: str | None) -> str:
    """The policy text for ``answers`` with the flex workload at ``tensor_parallel``."""
    lines = [
        f"# gpupool policy of {answers.cluster_name}, written by `gpupool init` "
        "(docs/quickstart.md).",
        "# Yours to edit; fields not written keep their documented defaults (docs/policy.md).",
        "",
        *_cluster_lines(answers),
        "",
        *_node_pool_lines(answers),
        "",
        *_alerting_lines(answers),
        "",
        *_tuner_lines(answers),
        "",
        *_workload_lines(answers, tensor_parallel, max_model_len, backend),
        *_production_lines(answers),
    ]
    return "\n".join(lines) + "\n"


def _cluster_lines(a: Answers) -> list[str]:
    """The cluster's name and the runtime image (a TODO placeholder when not given)."""
    image, image_todo = _owner(
        a.runtime_image, PLACEHOLDER_IMAGE, "  ", "your build of infra/images/runtime.Dockerfile"
    )
    return [
        "cluster:",
        _c(f"  name: {a.cluster_name}", "a label on every alert"),
        *image_todo,
        _c(
            f"  runtime_image: {_scalar(image)}",
            "" if image_todo else "the tuner's, sidecars' image",
        ),
    ]


def _node_pool_lines(a: Answers) -> list[str]:
    """Both pools; the prod pool's reserve, and its lending when flex may borrow."""
    lines = [
        "node_pools:",
        _c(f"  - name: {PROD_POOL}", "guaranteed: production keeps these GPUs"),
        *_pool_lines(a.prod, "prod"),
        _c(f"    reserve_ratio: {RESERVE_RATIO:g}", "kept free for production's bursts"),
    ]
    if a.production:
        first = a.production[0]
        lines.append(
            f"    # reserve: {{replicas: 1, of: {first.namespace}/{first.name}}}"
            "  # or room for whole replicas"
        )
    if a.lend_idle:
        lines.append(_c("    lend_idle: true", "flex borrows idle GPUs; production preempts"))
    return [
        *lines,
        _c(f"  - name: {FLEX_POOL}", "elastic: idle-time inference, evicted first"),
        *_pool_lines(a.flex, "flex"),
    ]


def _alerting_lines(a: Answers) -> list[str]:
    """One webhook receiver for every alert (a TODO placeholder when not given)."""
    hook, hook_todo = _owner(a.alert_webhook, PLACEHOLDER_WEBHOOK, "        ", "your receiver")
    return [
        "alerting:",
        "  routing:",
        "    receivers:",
        "      - name: platform",
        _c("        type: webhook", "or slack, pagerduty, email, opsgenie (docs/alerts.md)"),
        *hook_todo,
        f"        url: {_url(hook)}",
        _c("    by_severity: {}", "every alert to default_receiver"),
        "    default_receiver: platform",
    ]


def _tuner_lines(a: Answers) -> list[str]:
    """The repository the tuner clones (a TODO placeholder when not given)."""
    repo, repo_todo = _owner(a.repo_url, PLACEHOLDER_REPO, "  ", "this repository's git URL")
    return [
        "tuner:",
        *repo_todo,
        _c(f"  policy_repo_url: {_url(repo)}", "the tuner clones it" if not repo_todo else ""),
    ]


def _workload_lines(
    a: Answers, tensor_parallel: int, max_model_len: int, backend: str | None
) -> list[str]:
    """The one flex workload: the model, its config, GPUs per replica and context."""
    lines = [
        _c("workloads:", "flex vLLM on idle GPUs (docs/vllm.md)"),
        f"  - name: {workload_name(a.model.hf_id)}",
        _c(f"    model: {_scalar(a.model.hf_id)}", a.model.licence or ""),
        _c(f"    hf_config: models/{a.model.file}", "architecture fields: sizes the KV cache"),
        _c(
            f"    gpus_per_replica: {tensor_parallel}",
            "the fewest GPUs it fits" if a.tensor_parallel is None else "",
        ),
        f"    max_model_len: {max_model_len}",
    ]
    if backend is not None:
        lines.append(_c(f"    attention_backend: {backend}", "MLA before Hopper"))
    if a.model.gated:
        lines.append(_c("    # hf_token_secret: hf-token", "gated: a Secret with your HF token"))
    return lines


def _production_lines(a: Answers) -> list[str]:
    """The production workloads by reference, each sized to its share of the prod pool;
    nothing without any."""
    if not a.production:
        return []
    lines = ["", _c("production:", "your workloads, by reference (docs/policy.md)")]
    for p in a.production:
        most = max(1, a.prod.gpus // len(a.production) // p.gpus_per_replica)
        lines += [
            f"  - namespace: {_scalar(p.namespace)}",
            f"    name: {_scalar(p.name)}",
            f"    gpus_per_replica: {p.gpus_per_replica}",
            f"    min_replicas: {min(2, most)}",
            _c(f"    max_replicas: {most}", f"what {PROD_POOL} holds"),
            _c(f"    scale_on: {a.production_scaling}", SCALING_NOTES[a.production_scaling]),
        ]
        if a.production_scaling == "gpu_utilization":
            lines.append(_c("    target_gpu_utilization: 0.6", "the pods' mean GPU duty"))
    return lines


def _pool_lines(pool: Pool, role: str) -> list[str]:
    lines = [
        f"    role: {role}",
        _c(f"    gpu_model: {_scalar(pool.gpu.label)}", "nvidia.com/gpu.product"),
        f"    gpus_per_node: {pool.gpus_per_node}",
        _c(f"    gpu_memory_gib: {_memory(pool.gpu.memory_gib)}", pool.gpu.note),
        f"    max_nodes: {pool.max_nodes}",
    ]
    if pool.nodes:
        lines.append(f"    nodes: {_list(pool.nodes)}")
    return lines


def _document(text: str) -> Any:
    return YAML(typ="rt").load(text)


def decide(answers: Answers, spec: ModelSpec) -> Written:
    """The policy for ``answers``: the flex workload at the fewest GPUs per replica (powers
    of two up to a flex node) whose vLLM plan fits, or at ``answers.tensor_parallel``.

    Raises ``PolicyError`` when the answers make an invalid policy, ``InitError`` when the
    model fits no tensor-parallel size."""
    max_len = min(MAX_MODEL_LEN, spec.max_position_embeddings)
    pools = [answers.flex.gpu, *([answers.prod.gpu] if answers.lend_idle else [])]
    backend = (
        "triton" if spec.mla is not None and not all(g.hopper_or_newer for g in pools) else None
    )
    first = render(answers, answers.tensor_parallel or 1, max_len, backend)
    policy = parse_policy(_document(first), "policy/pool.yaml")
    sizes = (
        [answers.tensor_parallel]
        if answers.tensor_parallel is not None
        else [t for t in (1, 2, 4, 8, 16) if t <= answers.flex.gpus_per_node]
    )
    why = ""
    for tp in sizes:
        problem = _plan_problem(policy, tp, spec)
        if problem is None:
            text = render(answers, tp, max_len, backend)
            return Written(text, workload_name(answers.model.hf_id), tp, max_len, backend)
        why = problem
    raise InitError(
        f"{answers.model.hf_id} fits no {answers.flex.gpu.label} replica of "
        f"{', '.join(map(str, sizes))} GPUs: {why}"
    )


def _plan_problem(policy: PoolPolicy, tp: int, spec: ModelSpec) -> str | None:
    workload = policy.workloads[0].model_copy(update={"gpus_per_replica": tp})
    try:
        serve_args(policy, workload, spec)
    except (KvPlanError, BackendError, ModelConfigError) as exc:
        return str(exc)
    return None

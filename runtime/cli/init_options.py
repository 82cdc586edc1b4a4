"""``gpupool init``'s options: the typer declarations, and the given values grouped by what
they answer (the pools, the flex model, production, what only the owner knows)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from runtime.init.writer import Scaling

OutOption = Annotated[Path, typer.Option("--out", help="Policy repository to write policy/ into.")]
NonInteractiveOption = Annotated[
    bool,
    typer.Option("--non-interactive", help="Never ask: what no flag gives is refused."),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace an existing policy/pool.yaml.")]
ClusterNameOption = Annotated[
    str | None,
    typer.Option(help="Cluster name, a label on every alert (default: OUT's folder name)."),
]
GpuModelOption = Annotated[
    str | None,
    typer.Option(
        help="Production GPUs: A100, H100, H200, L40S, A10G, T4 (or their "
        "nvidia.com/gpu.product label; another GPU needs --gpu-memory-gib)."
    ),
]
GpusPerNodeOption = Annotated[int, typer.Option(min=1, max=64, help="GPUs per production node.")]
GpuMemoryOption = Annotated[
    float | None,
    typer.Option(min=1, max=1024, help="Memory of one production GPU as nvidia-smi says (GiB)."),
]
ProdNodesOption = Annotated[
    str | None,
    typer.Option(help="Production nodes: names a,b,c (labelled) or a number of nodes."),
]
FlexGpuModelOption = Annotated[str | None, typer.Option(help="Flex GPUs (default: --gpu-model).")]
FlexGpusPerNodeOption = Annotated[
    int | None, typer.Option(min=1, max=64, help="GPUs per flex node (default: as prod).")
]
FlexGpuMemoryOption = Annotated[
    float | None,
    typer.Option(min=1, max=1024, help="Memory of one flex GPU, GiB (default: as known)."),
]
FlexNodesOption = Annotated[
    str | None, typer.Option(help="Flex nodes: names a,b,c or a number of nodes.")
]
FlexModelOption = Annotated[
    str | None,
    typer.Option(
        help="Hugging Face id of the model flex serves; gpupool ships the config.json of "
        "Llama 3.1 8B/70B, Qwen2.5 7B/72B, Mistral 7B, Phi-3 mini, DeepSeek-V2-Lite."
    ),
]
FlexConfigOption = Annotated[
    Path | None,
    typer.Option(help="The model's own config.json (or its folder), for another model."),
]
FlexTpOption = Annotated[
    int | None,
    typer.Option(min=1, max=16, help="Flex GPUs per replica (default: the fewest it fits)."),
]
ProductionOption = Annotated[
    list[str] | None,
    typer.Option(
        help="A production workload, NAMESPACE/DEPLOYMENT:GPUS (GPUs per replica); repeatable."
    ),
]
ProductionScalingOption = Annotated[
    Scaling,
    typer.Option(
        help="How production scales: gpu_utilization (gpupool renders an HPA on GPU duty, "
        "so flex gets what production idles), fixed (your replica count) or external "
        "(your own HPA)."
    ),
]
LendIdleOption = Annotated[
    bool | None,
    typer.Option(
        "--lend-idle/--no-lend-idle",
        help="Flex may use the GPUs production leaves idle (default: when a production "
        "GPU has at least a flex GPU's memory).",
        show_default=False,
    ),
]
RepoUrlOption = Annotated[
    str | None,
    typer.Option(help="Git URL of OUT, the tuner clones it (default: OUT's origin remote)."),
]
RuntimeImageOption = Annotated[
    str | None,
    typer.Option(help="Your build of infra/images/runtime.Dockerfile, REGISTRY/NAME:TAG."),
]
AlertWebhookOption = Annotated[
    str | None, typer.Option(help="Webhook URL that receives gpupool's alerts.")
]


@dataclass(frozen=True)
class PoolFlags:
    """One pool's flags (``--gpu-model`` ... or ``--flex-gpu-model`` ...); None: not given."""

    gpu_model: str | None
    gpus_per_node: int
    """The flex pool's is production's unless given."""
    gpu_memory_gib: float | None
    nodes: str | None


@dataclass(frozen=True)
class ModelFlags:
    """The flex model's flags: its Hugging Face id, its own config.json, GPUs per replica."""

    hf_id: str | None
    config: Path | None
    tensor_parallel: int | None


@dataclass(frozen=True)
class ProductionFlags:
    """The production workloads by reference, how they scale, and whether flex borrows."""

    refs: list[str] | None
    scaling: Scaling
    lend_idle: bool | None
    """None: when a production GPU has at least a flex GPU's memory."""


@dataclass(frozen=True)
class OwnerFlags:
    """Values only the owner knows; None: asked on a terminal, else a TODO placeholder."""

    repo_url: str | None
    runtime_image: str | None
    alert_webhook: str | None


@dataclass(frozen=True)
class InitFlags:
    """Every answer ``init``'s flags give; the rest is asked (on a terminal) or refused."""

    cluster_name: str | None
    prod: PoolFlags
    flex: PoolFlags
    model: ModelFlags
    production: ProductionFlags
    owner: OwnerFlags

    def missing(self) -> list[str]:
        """The flags ``--non-interactive`` needs that were not given, in the help's order."""
        required = {
            "--gpu-model": self.prod.gpu_model,
            "--prod-nodes": self.prod.nodes,
            "--flex-nodes": self.flex.nodes,
            "--flex-model": self.model.hf_id,
        }
        return [flag for flag, value in required.items() if value is None]

"""What ``gpupool init`` knows without asking: the model configs shipped in ``policy/models/``
(architecture fields of common open models, with their sources and licences) and the memory
of common data-centre GPUs as ``nvidia-smi`` reports it.

``policy/models/README.md`` restates the model table for readers; a test keeps the two and the
files in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from policy import DEFAULT_POLICY

MODELS_DIR = DEFAULT_POLICY.parent / "models"
"""The shipped ``config.json`` files (architecture fields only, no weights)."""


@dataclass(frozen=True)
class ModelEntry:
    """One shipped model config."""

    hf_id: str
    """Hugging Face repository id: what vLLM downloads (the workload's ``model``)."""
    file: str
    """File name under ``policy/models/``."""
    licence: str
    """The licence of the model's weights, as its Hugging Face page names it."""
    gated: bool = False
    """Hugging Face serves the weights only to accounts that accepted the licence: the
    workload needs ``hf_token_secret``."""

    @property
    def path(self) -> Path:
        return MODELS_DIR / self.file

    @property
    def stem(self) -> str:
        return self.file.removesuffix(".json")


MODELS: tuple[ModelEntry, ...] = (
    ModelEntry(
        "meta-llama/Llama-3.1-8B-Instruct",
        "llama-3.1-8b-instruct.json",
        "Llama 3.1 Community License",
        gated=True,
    ),
    ModelEntry(
        "meta-llama/Llama-3.1-70B-Instruct",
        "llama-3.1-70b-instruct.json",
        "Llama 3.1 Community License",
        gated=True,
    ),
    ModelEntry("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct.json", "Apache-2.0"),
    ModelEntry("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b-instruct.json", "Qwen License"),
    ModelEntry("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-instruct-v0.3.json", "Apache-2.0"),
    ModelEntry("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini-4k-instruct.json", "MIT"),
    ModelEntry(
        "deepseek-ai/DeepSeek-V2-Lite",
        "deepseek-v2-lite.json",
        "DeepSeek License (model), MIT (code)",
    ),
)


def find_model(name: str) -> ModelEntry | None:
    """The shipped entry for a Hugging Face id or a file stem (``qwen2.5-7b-instruct``),
    case-insensitive; None when gpupool ships no config for it."""
    wanted = name.strip().lower()
    for entry in MODELS:
        if wanted in (entry.hf_id.lower(), entry.stem, entry.hf_id.split("/")[-1].lower()):
            return entry
    return None


@dataclass(frozen=True)
class GpuEntry:
    """One GPU product: its ``nvidia.com/gpu.product`` label and the memory vLLM sees."""

    label: str
    """GPU feature discovery's ``nvidia.com/gpu.product`` (the pool's ``gpu_model``)."""
    memory_mib: int
    """Total memory ``nvidia-smi --query-gpu=memory.total`` reports, MiB."""
    aliases: tuple[str, ...] = ()
    """Short names ``--gpu-model`` accepts (``A100``)."""
    hopper_or_newer: bool = False
    """Runs FlashAttention's MLA kernels (compute capability 9.0 and up)."""

    @property
    def memory_gib(self) -> float:
        """``memory_mib`` in GiB, rounded down to a tenth (never more than the GPU has)."""
        return int(self.memory_mib / 1024 * 10) / 10


GPUS: tuple[GpuEntry, ...] = (
    GpuEntry("NVIDIA-H200", 143771, ("H200",), hopper_or_newer=True),
    GpuEntry("NVIDIA-H100-80GB-HBM3", 81559, ("H100", "H100-SXM"), hopper_or_newer=True),
    GpuEntry("NVIDIA-H100-PCIe", 81559, ("H100-PCIE",), hopper_or_newer=True),
    GpuEntry("NVIDIA-A100-SXM4-80GB", 81920, ("A100", "A100-80GB", "A100-SXM")),
    GpuEntry("NVIDIA-A100-80GB-PCIe", 81920, ("A100-PCIE",)),
    GpuEntry("NVIDIA-A100-SXM4-40GB", 40960, ("A100-40GB",)),
    GpuEntry("NVIDIA-L40S", 46068, ("L40S",)),
    GpuEntry("NVIDIA-A10G", 23028, ("A10G",)),
    GpuEntry("Tesla-T4", 15360, ("T4",)),
)


def find_gpu(name: str) -> GpuEntry | None:
    """The entry for a product label or a short name, case-insensitive (``NVIDIA-`` optional)."""
    wanted = re.sub(r"^nvidia-", "", name.strip().lower())
    for entry in GPUS:
        names = (entry.label.lower(), *(a.lower() for a in entry.aliases))
        if wanted in names or f"nvidia-{wanted}" in names:
            return entry
    return None


def gpu_names() -> str:
    """Every name ``find_gpu`` accepts, for messages."""
    return ", ".join(f"{g.aliases[0]} ({g.label})" if g.aliases else g.label for g in GPUS)

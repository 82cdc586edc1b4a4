"""Flex inference workloads: the vLLM deployments that run on idle GPUs."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from policy.base import (
    INT32_MAX,
    MAX_REPLICAS,
    AbsolutePath,
    DnsLabel,
    DnsSubdomain,
    Invariants,
    Quantity,
    QuantityOrPercent,
    ReplicaBoundOrAuto,
    ServiceName,
    StrictModel,
)
from policy.images import ImageReference
from policy.quantity import parse_quantity

AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]
"""PersistentVolumeClaim access modes vLLM can write to (``ReadOnlyMany`` cannot hold
snapshots)."""


class SnapshotVolume(StrictModel):
    """Persistent volume that keeps KV-cache snapshots across evictions."""

    size: Quantity = "100Gi"
    """PersistentVolumeClaim request."""
    storage_class: DnsSubdomain | None = None
    """StorageClass (``kubectl get storageclass``); cluster-specific, so no default. Needed
    only with ``kv_cache.kv_preservation: filesystem``, the one setting that renders the
    volume."""
    access_mode: AccessMode = "ReadWriteMany"
    """``ReadWriteMany`` lets a rescheduled replica on another node read the snapshot;
    ``ReadWriteOnce``/``ReadWriteOncePod`` keep every replica on one node's volume."""
    mount_path: AbsolutePath = "/var/lib/gpupool/kv-snapshots"
    """Where the volume is mounted in the vLLM container; root of vLLM's filesystem KV tier."""
    tier_capacity: QuantityOrPercent = "90%"
    """Most bytes the snapshot tier may hold: a share of ``size`` (``"90%"``) or a quantity
    (``"80Gi"``) at most ``size``. The snapshot GC deletes whole block files, least recently
    used first, down to 90 % of it (docs/preservation.md); vLLM's own tier never
    deletes, so without the bound the volume fills and every write fails."""

    @property
    def capacity_bytes(self) -> int:
        """``tier_capacity`` in bytes."""
        if self.tier_capacity.endswith("%"):
            return int(quantity_bytes(self.size) * float(self.tier_capacity[:-1]) / 100)
        return int(quantity_bytes(self.tier_capacity))

    @model_validator(mode="after")
    def _capacity_fits(self) -> SnapshotVolume:
        found = Invariants()
        size = quantity_bytes(self.size)
        found.require(
            0 < self.capacity_bytes <= size,
            "tier_capacity",
            f"tier_capacity {self.tier_capacity!r} is {self.capacity_bytes} bytes; expected more "
            f"than 0 and at most size ({self.size}, {size} bytes)",
        )
        found.raise_if_any()
        return self


class ModelCache(StrictModel):
    """Where vLLM keeps the downloaded weights (``HF_HOME``)."""

    size: Quantity = "200Gi"
    """Bound of the cache: the ``emptyDir``'s ``sizeLimit`` (the kubelet evicts a pod that
    writes more), or the PersistentVolumeClaim's request. At least the model's weights."""
    storage_class: DnsSubdomain | None = None
    """Unset: a per-pod ``emptyDir`` (each new replica downloads the weights again). A
    StorageClass with ReadWriteMany: one PVC ``<workload>-model-cache`` all replicas share,
    so a replica that replaces an evicted one finds the weights already there."""


class Resources(StrictModel):
    """CPU and memory of the vLLM container (GPUs come from ``gpus_per_replica``)."""

    cpu: Quantity = "8"
    """CPU request and limit."""
    memory: Quantity = "64Gi"
    """Memory request and limit (host RAM; KV lives in GPU memory)."""

    @property
    def memory_bytes(self) -> int:
        """``memory`` in bytes (the KV offload tier must fit in it)."""
        return int(quantity_bytes(self.memory))


def quantity_bytes(quantity: str) -> float:
    """A validated Kubernetes quantity (``Quantity``) as a number."""
    return float(parse_quantity(quantity))


MAX_NUM_SEQS = 65536
"""Most sequences one vLLM instance may schedule at once: vLLM sizes per-sequence buffers
(and CUDA graphs) from ``--max-num-seqs`` at start-up, so more is a typo, never a plan."""

_MODEL_NAME = re.compile(r"[A-Za-z0-9_./~][A-Za-z0-9_./~:@+=-]{0,254}", re.ASCII)


def _check_model_name(value: str) -> str:
    if _MODEL_NAME.fullmatch(value) is None:
        raise ValueError(
            "expected a Hugging Face model id or a path (ASCII letters, digits and _ . / ~ : @ "
            "+ = -, at most 255, not starting with '-'), e.g. meta-llama/Llama-3.1-8B-Instruct, "
            f"found {value!r}"
        )
    return value


ModelName = Annotated[str, AfterValidator(_check_model_name)]
"""A model id or path as vLLM's ``--model`` (and the served model's id) takes it."""


def _check_file_path(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./~+-]{1,4096}", value, re.ASCII) is None:
        raise ValueError(
            "expected a file path (ASCII letters, digits and _ . / ~ + -), e.g. "
            f"models/llama-3.1-8b-instruct.json, found {value!r}"
        )
    return value


FilePath = Annotated[str, AfterValidator(_check_file_path)]
"""A path the validating machine reads (relative to the policy file or absolute)."""

MAX_GPUS_PER_REPLICA = 16
"""Most GPUs one flex replica (one vLLM tensor-parallel group, on one node) may take."""


AttentionBackend = Literal["flash_attn", "triton", "flex", "cpu", "flashmla", "cutlass_mla"]
"""vLLM attention backends gpupool sizes blocks for; ``runtime.vllm.backends`` has their rules."""


class FlexWorkload(StrictModel):
    """One vLLM deployment on the flex pool."""

    name: ServiceName
    """Deployment, Service, PDB and HPA name: a DNS-1035 label (starts with a letter), short
    enough that every name derived from it fits its limit (``<name>-kv-compaction`` is a
    Service too; ``gpupool validate`` names the longest allowed)."""
    model: ModelName
    """Model served (Hugging Face id or path inside the image / volume): ASCII, no spaces, not
    starting with ``-`` (it is the value of vLLM's ``--model``)."""
    hf_config: FilePath
    """Hugging Face ``config.json`` of the model, relative to the policy file; sizes the KV."""
    image: ImageReference = "vllm/vllm-openai:v0.32.0"
    """Container image; gpupool targets the vLLM 0.32 API. Pin it by digest
    (``vllm/vllm-openai:v0.32.0@sha256:<digest>``): a tag-only image is a warning."""
    pool: DnsLabel = "gpu-flex"
    """Flex node pool the replicas run on."""
    gpus_per_replica: int = Field(1, ge=1, le=MAX_GPUS_PER_REPLICA)
    """``nvidia.com/gpu`` per replica; also vLLM's tensor-parallel size."""
    min_replicas: int = Field(1, ge=0, le=MAX_REPLICAS)
    """HPA lower bound (0 needs the HPAScaleToZero feature gate; not supported)."""
    max_replicas: ReplicaBoundOrAuto = "auto"
    """HPA upper bound. ``auto``: as many replicas as the pools the workload may use can
    hold (its flex pool and every pool that lends, ``PoolPolicy.replica_bound``), so the
    budget alone decides; a number caps the workload below that."""
    port: int = Field(8000, ge=1024, le=65535)
    """vLLM OpenAI server port."""
    max_model_len: int = Field(8192, ge=16, le=INT32_MAX)
    """``--max-model-len``: longest prompt + output in tokens."""
    max_num_seqs: int = Field(128, ge=1, le=MAX_NUM_SEQS)
    """``--max-num-seqs``: most sequences scheduled at once."""
    startup_timeout_s: int = Field(900, ge=60, le=7200)
    """Longest model download + load before the startup probe restarts the container."""
    attention_backend: AttentionBackend = "flash_attn"
    """vLLM attention backend (``--attention-backend``); decides which block sizes are legal.

    ``flash_attn``, ``triton``, ``flex``: multiples of 16 tokens; ``cpu``: multiples of 32;
    ``flashmla``: 64 (MLA models only); ``cutlass_mla``: 128 (MLA models only)."""
    resources: Resources = Resources()
    """Container CPU and memory."""
    kv_compaction: bool = True
    """Run the KV compaction sidecar in each pod and load gpupool's vLLM plugin (compact, shrink
    and grow the KV pool at run time, docs/kvcache.md). Off: neither is deployed, and vLLM
    keeps its default CUDA-graph mode."""
    snapshot_volume: SnapshotVolume = SnapshotVolume()
    """KV snapshot volume, rendered only with ``kv_cache.kv_preservation: filesystem`` (then
    its ``storage_class`` is required)."""
    model_cache: ModelCache = ModelCache()
    """The weights' cache: size-bounded per pod by default, or a shared persistent volume."""
    hf_token_secret: DnsLabel | None = None
    """Secret (in ``cluster.flex_namespace``, key ``token``) with a Hugging Face token for
    gated models; mounted as a file that ``HF_TOKEN_PATH`` names, never an environment
    variable. Unset: downloads are anonymous."""

    @model_validator(mode="after")
    def _bounds(self) -> FlexWorkload:
        found = Invariants()
        found.require(
            self.min_replicas >= 1
            and (self.max_replicas == "auto" or self.min_replicas <= self.max_replicas),
            "min_replicas",
            f"min_replicas ({self.min_replicas}) must be between 1 and max_replicas "
            f"({self.max_replicas})",
        )
        found.raise_if_any()
        return self

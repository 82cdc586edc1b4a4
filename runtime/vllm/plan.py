"""Policy + model -> the exact vLLM 0.32 KV-cache arguments, every number with its reason.

Pure: ``plan_kv_cache`` takes typed inputs and returns a ``KvCachePlan``; ``serve_args`` renders
the plan as the flex container's arguments. The flex Deployment, ``gpupool vllm-args`` and the
test engine all call these two functions, so the arguments have one source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from policy import PoolPolicy
from policy.workloads import MAX_GPUS_PER_REPLICA, AttentionBackend, FlexWorkload
from runtime.vllm.backends import BlockRule, block_rule, check_block_size
from runtime.vllm.model_spec import ModelSpec

GIB = 1024**3
CUDA_CONTEXT_BYTES = 1 * GIB
"""GPU memory a vLLM worker already holds when its start-up check measures free memory: the
CUDA context (about 0.5 GiB with CUDA 12 on Hopper, not measured here) and NCCL's buffers
for tensor parallelism. The activation reserve covers it, so ``--gpu-memory-utilization``
leaves it out; counted twice, a weights-bound plan (weights + reserve + KV = the whole GPU)
would ask for more free memory than an idle GPU has after the context exists."""
UTILIZATION_GRAIN = 1_000_000
"""``--gpu-memory-utilization`` is emitted in millionths of the GPU (150 KB on 140 GiB): its
rounding up stays far below what the CUDA context's size varies by, so a weights-bound plan
still starts on an idle GPU."""


class KvPlanError(ValueError):
    """Policy, model and GPU do not fit together; says which values and which limit.

    ``field`` is the workload field to change (``max_model_len``, ``gpus_per_replica``,
    ``resources.memory``), so ``infra.inputs`` can point at its line in pool.yaml."""

    def __init__(self, message: str, field: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Derivation:
    """One derived number as the table shows it: name, value, and how it was obtained."""

    name: str
    value: str
    why: str


@dataclass(frozen=True)
class KvCachePlan:
    """Every number behind the vLLM arguments of one flex workload on one GPU type."""

    model_path: str
    """``--model``: what the container serves."""
    port: int
    backend: BlockRule
    tensor_parallel: int
    gpu_memory_bytes: int
    kv_dtype: str
    """Resolved KV element type (``auto`` resolved to the model dtype)."""
    kv_dtype_flag: str
    """``--kv-cache-dtype`` as passed (the policy's value)."""
    bytes_per_token_per_layer: int
    """KV bytes one token takes in one layer on one rank."""
    page_bytes_target: int
    ideal_block_tokens: float
    block_size: int
    weight_bytes: int
    activation_reserve_bytes: int
    share_cap_bytes: int
    """KV may take at most ``max_gpu_memory_share`` of the GPU."""
    left_after_weights_bytes: int
    """GPU memory minus weights minus the activation reserve."""
    kv_cache_bytes: int
    num_layers: int
    max_model_len: int
    max_num_seqs: int
    prefix_caching: bool
    prefix_caching_hash_algo: str
    shutdown_timeout_s: int
    kv_transfer_config: dict[str, Any] | None
    preservation_note: str
    env_unset: tuple[str, ...] = ()
    """Environment variables that must be absent for these arguments to mean what they say."""
    compilation_config: dict[str, Any] | None = None
    """``--compilation-config``: set when the KV compaction plugin must be able to resize the
    pool on a GPU (full CUDA graphs capture the KV buffer's address; piecewise ones do not)."""

    @property
    def page_bytes_per_layer(self) -> int:
        """Bytes of one block in one layer: vLLM's ``page_size_bytes``."""
        return self.bytes_per_token_per_layer * self.block_size

    @property
    def startup_bytes(self) -> int:
        """What the worker allocates after vLLM's start-up memory check: weights, the KV cache
        and the activation reserve less the part of it that exists by then
        (``CUDA_CONTEXT_BYTES``)."""
        reserve = max(self.activation_reserve_bytes - CUDA_CONTEXT_BYTES, 0)
        return self.weight_bytes + self.kv_cache_bytes + reserve

    @property
    def gpu_memory_utilization(self) -> str | None:
        """``--gpu-memory-utilization``: the smallest share of the GPU, rounded up to
        ``UTILIZATION_GRAIN``, that covers ``startup_bytes``; None on the CPU backend.

        vLLM 0.32 refuses to start unless free memory >= ceil(total x utilization)
        (``vllm/v1/worker/utils.py`` ``request_memory``, called from ``Worker.init_device``
        after the CUDA context and NCCL exist), even with ``--kv-cache-memory-bytes``, which
        alone sizes the KV. Its default 0.92 asks a restarted flex pod for 92 % of the GPU
        whatever it needs; this asks for what it will allocate. The CPU worker skips the
        check when the KV bytes are given."""
        if self.backend.vllm_name.startswith("CPU"):
            return None
        grains = -(-self.startup_bytes * UTILIZATION_GRAIN // self.gpu_memory_bytes)
        return f"{grains / UTILIZATION_GRAIN:.6f}"

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers: the unit vLLM divides the KV budget by."""
        return self.page_bytes_per_layer * self.num_layers

    @property
    def target_expressible(self) -> bool:
        """Whether some legal block size gives exactly the policy's page-bytes target."""
        per_token = self.bytes_per_token_per_layer
        if self.page_bytes_target % per_token:
            return False
        return self.backend.allows(self.page_bytes_target // per_token)

    @property
    def num_blocks(self) -> int:
        """Blocks vLLM allocates: ``kv_cache_bytes // block_bytes`` (kv_cache_utils.py)."""
        return self.kv_cache_bytes // self.block_bytes

    @property
    def max_concurrent_tokens(self) -> int:
        """Tokens all running sequences together can hold in the cache."""
        return self.num_blocks * self.block_size

    @property
    def max_full_length_sequences(self) -> float:
        """How many ``max_model_len`` sequences fit at once (vLLM logs this as max concurrency)."""
        return self.max_concurrent_tokens / self.max_model_len

    @property
    def weight_bound(self) -> bool:
        """True when weights, not the share cap, limit the KV budget."""
        return self.left_after_weights_bytes < self.share_cap_bytes

    def derivations(self) -> list[Derivation]:
        """Each derived number and the arithmetic behind it, in the order they depend."""
        rule, per_token = self.backend, self.bytes_per_token_per_layer
        target_note = (
            f"{self.page_bytes_target} B is exactly {self.page_bytes_target // per_token} tokens"
            if self.target_expressible
            else f"{self.page_bytes_target} B/page is NOT expressible: it would be "
            f"{self.ideal_block_tokens:g} tokens, and {rule.vllm_name} needs {rule.describe()}"
        )
        bound = (
            "weights bound: GPU - weights - activation reserve < share cap"
            if self.weight_bound
            else "share cap bound: min(share cap, GPU - weights - activation reserve)"
        )
        return [
            Derivation(
                "KV bytes per token per layer",
                f"{self.bytes_per_token_per_layer:,}",
                f"kv heads per rank x (K+V or MLA latent width) x {self.kv_dtype} bytes",
            ),
            Derivation("ideal block (tokens)", f"{self.ideal_block_tokens:g}", target_note),
            Derivation(
                "--block-size",
                str(self.block_size),
                f"nearest to {self.ideal_block_tokens:g} that {rule.vllm_name} accepts "
                f"({rule.describe()})",
            ),
            Derivation(
                "page bytes per layer",
                f"{self.page_bytes_per_layer:,}",
                f"{self.bytes_per_token_per_layer:,} B x {self.block_size} tokens",
            ),
            Derivation(
                "block bytes, all layers",
                f"{self.block_bytes:,}",
                f"{self.page_bytes_per_layer:,} B x {self.num_layers} layers",
            ),
            Derivation(
                "weights per GPU",
                _gib(self.weight_bytes),
                f"estimated parameters x dtype bytes / TP {self.tensor_parallel}",
            ),
            Derivation(
                "activation reserve",
                _gib(self.activation_reserve_bytes),
                "kv_cache.activation_reserve_share x GPU memory",
            ),
            Derivation(
                "KV share cap",
                _gib(self.share_cap_bytes),
                "kv_cache.max_gpu_memory_share x GPU memory",
            ),
            Derivation(
                "--kv-cache-memory-bytes",
                f"{self.kv_cache_bytes:,}",
                f"{bound}, rounded down to whole blocks",
            ),
            Derivation(
                "--gpu-memory-utilization",
                self.gpu_memory_utilization or "none",
                f"(weights + KV + activation reserve - {_gib(CUDA_CONTEXT_BYTES)} CUDA context) "
                f"/ GPU = {_gib(self.startup_bytes)} / {_gib(self.gpu_memory_bytes)}, rounded "
                "up: vLLM starts when that much of the GPU is free"
                if self.gpu_memory_utilization
                else "CPU backend: vLLM checks no free memory when the KV bytes are given",
            ),
            Derivation(
                "KV blocks",
                f"{self.num_blocks:,}",
                f"{self.kv_cache_bytes:,} // {self.block_bytes:,} (vLLM's own division)",
            ),
            Derivation(
                "max concurrent tokens",
                f"{self.max_concurrent_tokens:,}",
                f"{self.num_blocks:,} blocks x {self.block_size} tokens = "
                f"{self.max_full_length_sequences:.1f} sequences of max_model_len",
            ),
            Derivation(
                "--shutdown-timeout",
                str(self.shutdown_timeout_s),
                "disruption.drain_s: SIGTERM drains in-flight requests this long",
            ),
            Derivation(
                "--kv-transfer-config",
                "set" if self.kv_transfer_config else "none",
                self.preservation_note,
            ),
            Derivation(
                "--compilation-config",
                json.dumps(self.compilation_config) if self.compilation_config else "none",
                "KV compaction on a GPU: piecewise CUDA graphs leave attention (and the KV "
                "buffer) outside the graphs, so the pool can be resized"
                if self.compilation_config
                else "vLLM's default (no KV resize on this instance, or no CUDA graphs)",
            ),
        ]


def plan_kv_cache(
    policy: PoolPolicy,
    workload: FlexWorkload,
    model: ModelSpec,
    *,
    gpu_memory_bytes: int | None = None,
    backend: AttentionBackend | None = None,
    tensor_parallel: int | None = None,
) -> KvCachePlan:
    """Size the paged KV cache of ``workload`` serving ``model``.

    GPU memory defaults to the workload's node pool (``gpu_memory_gib``), the backend to
    ``workload.attention_backend`` and tensor parallelism to ``workload.gpus_per_replica``.
    Raises ``KvPlanError``/``BackendError`` before anything starts when they cannot fit.
    """
    kv = policy.kv_cache
    tp = tensor_parallel or workload.gpus_per_replica
    pool = policy.pool_of(workload)
    gpu_bytes = gpu_memory_bytes or int(pool.gpu_memory_gib * GIB)
    rule = block_rule(backend or workload.attention_backend, model.mla is not None)
    kv_dtype = model.dtype if kv.cache_dtype == "auto" else kv.cache_dtype
    per_token = model.kv_bytes_per_token_per_layer(tp, kv_dtype)
    ideal = kv.page_bytes_target / per_token
    block_size = rule.nearest(ideal)
    check_block_size(rule, block_size)
    _check_model_fits(workload, model, tp)

    weights = model.weight_bytes_per_rank(tp)
    reserve = int(kv.activation_reserve_share * gpu_bytes)
    cap = int(kv.max_gpu_memory_share * gpu_bytes)
    left = gpu_bytes - weights - reserve
    block_bytes = per_token * block_size * model.num_layers
    kv_bytes = min(cap, left) // block_bytes * block_bytes
    if left <= 0:
        raise KvPlanError(
            f"{model.source}: weights {_gib(weights)} + activation reserve {_gib(reserve)} "
            f"exceed the {_gib(gpu_bytes)} GPU at tensor parallel {tp}, leaving nothing for "
            "the KV cache; expected them to fit in the GPU: use more GPUs per replica or a "
            "larger GPU",
            "gpus_per_replica",
        )
    needed = -(-workload.max_model_len // block_size) * block_bytes
    if kv_bytes < needed:
        raise KvPlanError(
            f"{model.source}: KV cache gets {_gib(kv_bytes)} = min(share cap "
            f"{kv.max_gpu_memory_share} x {_gib(gpu_bytes)}, GPU {_gib(gpu_bytes)} - weights "
            f"{_gib(weights)} - activation reserve {_gib(reserve)}), but one sequence of "
            f"max_model_len {workload.max_model_len} needs {_gib(needed)}; use more GPUs per "
            "replica (tensor parallel), a larger GPU, or a shorter max_model_len",
            "max_model_len",
        )
    identity = {
        "model": workload.model,
        "architecture": model.architecture,
        "weights_dtype": model.dtype,
        "kv_dtype": kv_dtype,
        "block_size": block_size,
        "attention_backend": rule.vllm_name,
        "tensor_parallel": tp,
        "prefix_caching_hash_algo": kv.prefix_caching_hash_algo,
        "python_hash_seed": kv.python_hash_seed,
    }
    transfer, note = _preservation(policy, workload, rule, identity)
    return KvCachePlan(
        model_path=workload.model,
        port=workload.port,
        backend=rule,
        tensor_parallel=tp,
        gpu_memory_bytes=gpu_bytes,
        kv_dtype=kv_dtype,
        kv_dtype_flag=kv.cache_dtype,
        bytes_per_token_per_layer=per_token,
        page_bytes_target=kv.page_bytes_target,
        ideal_block_tokens=round(ideal, 3),
        block_size=block_size,
        weight_bytes=weights,
        activation_reserve_bytes=reserve,
        share_cap_bytes=cap,
        left_after_weights_bytes=left,
        kv_cache_bytes=kv_bytes,
        num_layers=model.num_layers,
        max_model_len=workload.max_model_len,
        max_num_seqs=workload.max_num_seqs,
        prefix_caching=kv.prefix_caching,
        prefix_caching_hash_algo=kv.prefix_caching_hash_algo,
        shutdown_timeout_s=_shutdown_timeout_s(policy, transfer),
        kv_transfer_config=transfer,
        preservation_note=note,
        env_unset=_env_unset(rule),
        compilation_config=_compilation_config(workload, rule),
    )


def render_args(plan: KvCachePlan) -> list[str]:
    """The container arguments of a plan, in a fixed order (reviewable diffs)."""
    args = [
        "--model",
        plan.model_path,
        "--port",
        str(plan.port),
        "--attention-backend",
        plan.backend.vllm_name,
        "--block-size",
        str(plan.block_size),
        "--kv-cache-memory-bytes",
        str(plan.kv_cache_bytes),
    ]
    if plan.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", plan.gpu_memory_utilization]
    args += ["--enable-prefix-caching"] if plan.prefix_caching else ["--no-enable-prefix-caching"]
    if plan.prefix_caching:
        args += ["--prefix-caching-hash-algo", plan.prefix_caching_hash_algo]
    args += [
        "--kv-cache-dtype",
        plan.kv_dtype_flag,
        "--max-num-seqs",
        str(plan.max_num_seqs),
        "--max-model-len",
        str(plan.max_model_len),
        "--tensor-parallel-size",
        str(plan.tensor_parallel),
        "--shutdown-timeout",
        str(plan.shutdown_timeout_s),
    ]
    if plan.kv_transfer_config is not None:
        args += ["--kv-transfer-config", json.dumps(plan.kv_transfer_config, sort_keys=True)]
    if plan.compilation_config is not None:
        args += ["--compilation-config", json.dumps(plan.compilation_config, sort_keys=True)]
    return args


def serve_args(policy: PoolPolicy, workload: FlexWorkload, model: ModelSpec) -> list[str]:
    """The flex container's vLLM arguments for ``workload`` (one source for every consumer)."""
    return render_args(plan_kv_cache(policy, workload, model))


def _check_model_fits(workload: FlexWorkload, model: ModelSpec, tp: int) -> None:
    """What vLLM refuses at start-up: a context beyond the model's, heads TP cannot split."""
    if workload.max_model_len > model.max_position_embeddings:
        raise KvPlanError(
            f"{workload.name}: max_model_len {workload.max_model_len} exceeds the model's "
            f"max_position_embeddings {model.max_position_embeddings} ({model.source}); "
            f"expected at most {model.max_position_embeddings}",
            "max_model_len",
        )
    problem = _sharding_problem(model, tp)
    if problem is not None:
        usable = [n for n in range(1, MAX_GPUS_PER_REPLICA + 1) if not _sharding_problem(model, n)]
        raise KvPlanError(
            f"{workload.name}: tensor parallel {tp} {problem} ({model.source}); expected one "
            f"of {usable}",
            "gpus_per_replica",
        )


def _sharding_problem(model: ModelSpec, tp: int) -> str | None:
    """Why vLLM cannot split ``model`` over ``tp`` ranks (None: it can).

    Query heads must divide evenly; KV heads are split when ``tp`` divides them and
    replicated when ``tp`` is a multiple of them (MLA's one latent is never split)."""
    kv = model.num_kv_heads
    if model.mla is None and kv % tp and tp % kv:
        return f"neither divides nor is a multiple of the model's {kv} KV heads"
    if model.num_attention_heads % tp:
        return f"does not divide the model's {model.num_attention_heads} attention heads"
    return None


def _preservation(
    policy: PoolPolicy, workload: FlexWorkload, rule: BlockRule, identity: dict[str, Any]
) -> tuple[dict[str, Any] | None, str]:
    """vLLM's OffloadingConnector config that keeps KV across eviction (docs/preservation.md):
    with ``filesystem``, gpupool's ``SnapshotTier`` (vLLM's filesystem tier
    under a root keyed by ``identity``, flushed within ``disruption.snapshot_s``)."""
    mode = policy.kv_cache.kv_preservation
    if mode == "off":
        return None, "kv_cache.kv_preservation is off"
    if rule.vllm_name.startswith("CPU"):
        return None, (
            "CPU backend: the KV already lives in host memory and vLLM's offloading worker "
            "needs CUDA/XPU tensors (kv_offload/cpu/gpu_worker.py), so no connector"
        )
    host_bytes = int(policy.kv_cache.offload_host_gib * GIB)
    if host_bytes >= workload.resources.memory_bytes:
        raise KvPlanError(
            f"{workload.name}: kv_cache.offload_host_gib ({policy.kv_cache.offload_host_gib:g}) "
            f"does not fit in the container's memory ({workload.resources.memory}); lower it, "
            "raise resources.memory, or set kv_cache.kv_preservation to off",
            "resources.memory",
        )
    extra: dict[str, Any] = {"cpu_bytes_to_use": host_bytes}
    if mode == "cpu":
        return _connector(extra), (
            f"OffloadingConnector, CPU tier of {policy.kv_cache.offload_host_gib:g} GiB "
            "(survives request preemption, not pod eviction)"
        )
    root = workload.snapshot_volume.mount_path
    extra |= {
        "spec_name": "TieringOffloadingSpec",
        "secondary_tiers": [
            {
                "type": SNAPSHOT_TIER,
                "module_path": SNAPSHOT_TIER_MODULE,
                "root_dir": root,
                "identity": identity,
                "flush_budget_s": policy.disruption.snapshot_s,
            }
        ],
    }
    return _connector(extra), (
        f"OffloadingConnector + TieringOffloadingSpec: {policy.kv_cache.offload_host_gib:g} GiB "
        f"host tier, then gpupool's SnapshotTier: files under {root}/gpupool-kv-<identity> "
        "(snapshot PVC) so a rescheduled replica finds its KV, flushed within "
        f"disruption.snapshot_s ({policy.disruption.snapshot_s} s) at shutdown"
    )


def _shutdown_timeout_s(policy: PoolPolicy, transfer: dict[str, Any] | None) -> int:
    """``--shutdown-timeout``: ``drain_s``, plus ``snapshot_s`` where the snapshot tier flushes.

    vLLM 0.32 kills the EngineCore ``--shutdown-timeout`` seconds after SIGTERM, drain and
    teardown together (``vllm/v1/engine/utils.py get_engine_process_shutdown_timeout``); the
    tier's flush runs in that teardown, so without the addition it would only get what the
    drain left. The sum stays within the grace period (``Disruption.shutdown_budget_s``)."""
    drain = policy.disruption.drain_s
    if transfer is None or policy.kv_cache.kv_preservation != "filesystem":
        return drain
    return drain + policy.disruption.snapshot_s


def _connector(extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


SNAPSHOT_TIER = "SnapshotTier"
SNAPSHOT_TIER_MODULE = "runtime.kvcache.preservation.tier"
"""vLLM imports the out-of-tree tier ``SNAPSHOT_TIER`` from this module (tiering/factory.py);
the pod carries gpupool on ``PYTHONPATH`` (infra.builders.compaction_sidecar.plugin_installer)."""

PIECEWISE_CUDA_GRAPHS = {"cudagraph_mode": "PIECEWISE"}
"""vLLM compilation config that keeps the KV buffer out of captured CUDA graphs."""


def _compilation_config(workload: FlexWorkload, rule: BlockRule) -> dict[str, Any] | None:
    """Piecewise CUDA graphs when the compaction plugin runs on a GPU backend.

    vLLM 0.32 captures full CUDA graphs by default (``FULL_AND_PIECEWISE``); a full graph
    holds the KV buffer's address, so the plugin refuses to resize under it. The CPU backend
    has no CUDA graphs."""
    if not workload.kv_compaction or rule.vllm_name.startswith("CPU"):
        return None
    return dict(PIECEWISE_CUDA_GRAPHS)


def _env_unset(rule: BlockRule) -> tuple[str, ...]:
    """On CPU the legacy ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB), when set, replaces
    ``--kv-cache-memory-bytes`` (vllm/platforms/cpu.py); an empty value crashes vllm/envs.py."""
    return ("VLLM_CPU_KVCACHE_SPACE",) if rule.vllm_name.startswith("CPU") else ()


def _gib(value: int) -> str:
    """Human-readable bytes: GiB, or MiB below one GiB (the test engine's pretend GPU)."""
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / 2**20:.2f} MiB"

"""Policy + model -> the exact vLLM 0.32 KV-cache arguments, every number with its reason.

Pure: ``plan_kv_cache`` takes typed inputs and returns a ``KvCachePlan``; ``serve_args`` renders
the plan as the flex container's arguments. The flex Deployment, ``gpupool vllm-args`` and the
test engine all call these two functions, so the arguments have one source.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from policy import PoolPolicy
from policy.workloads import MAX_GPUS_PER_REPLICA, AttentionBackend, FlexWorkload
from runtime.vllm.backends import BlockRule, block_rule, check_block_size
from runtime.vllm.kv_cache_plan import GIB, KvCachePlan, KvPlanError, gib
from runtime.vllm.model_spec import ModelSpec


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
    block = (block_size, per_token * block_size * model.num_layers)
    budget = _kv_budget(policy, workload, model, gpu_bytes, tp, block)
    identity = _snapshot_identity(policy, workload, model, (kv_dtype, block_size, rule, tp))
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
        **budget._asdict(),
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


def _snapshot_identity(
    policy: PoolPolicy,
    workload: FlexWorkload,
    model: ModelSpec,
    layout: tuple[str, int, BlockRule, int],
) -> dict[str, Any]:
    """What a snapshot's KV bytes depend on (``layout``: KV dtype, block size, backend and
    tensor parallelism): the snapshot tier keys its root by it, so a replica reads only
    blocks laid out as its own."""
    kv_dtype, block_size, rule, tp = layout
    return {
        "model": workload.model,
        "architecture": model.architecture,
        "weights_dtype": model.dtype,
        "kv_dtype": kv_dtype,
        "block_size": block_size,
        "attention_backend": rule.vllm_name,
        "tensor_parallel": tp,
        "prefix_caching_hash_algo": policy.kv_cache.prefix_caching_hash_algo,
        "python_hash_seed": policy.kv_cache.python_hash_seed,
    }


class _KvBudget(NamedTuple):
    """How one GPU's memory divides: the ``KvCachePlan`` fields of the same names."""

    weight_bytes: int
    activation_reserve_bytes: int
    share_cap_bytes: int
    left_after_weights_bytes: int
    kv_cache_bytes: int


def _kv_budget(
    policy: PoolPolicy,
    workload: FlexWorkload,
    model: ModelSpec,
    gpu_bytes: int,
    tp: int,
    block: tuple[int, int],
) -> _KvBudget:
    """The KV bytes of one GPU: the share cap or what weights and the activation reserve
    leave, whichever is less, in whole blocks (``block``: tokens and bytes, all layers);
    ``KvPlanError`` when that holds nothing or not one ``max_model_len`` sequence."""
    kv = policy.kv_cache
    block_size, block_bytes = block
    weights = model.weight_bytes_per_rank(tp)
    reserve = int(kv.activation_reserve_share * gpu_bytes)
    cap = int(kv.max_gpu_memory_share * gpu_bytes)
    left = gpu_bytes - weights - reserve
    kv_bytes = min(cap, left) // block_bytes * block_bytes
    if left <= 0:
        raise KvPlanError(
            f"{model.source}: weights {gib(weights)} + activation reserve {gib(reserve)} "
            f"exceed the {gib(gpu_bytes)} GPU at tensor parallel {tp}, leaving nothing for "
            "the KV cache; expected them to fit in the GPU: use more GPUs per replica or a "
            "larger GPU",
            "gpus_per_replica",
        )
    needed = -(-workload.max_model_len // block_size) * block_bytes
    if kv_bytes < needed:
        raise KvPlanError(
            f"{model.source}: KV cache gets {gib(kv_bytes)} = min(share cap "
            f"{kv.max_gpu_memory_share} x {gib(gpu_bytes)}, GPU {gib(gpu_bytes)} - weights "
            f"{gib(weights)} - activation reserve {gib(reserve)}), but one sequence of "
            f"max_model_len {workload.max_model_len} needs {gib(needed)}; use more GPUs per "
            "replica (tensor parallel), a larger GPU, or a shorter max_model_len",
            "max_model_len",
        )
    return _KvBudget(weights, reserve, cap, left, kv_bytes)


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

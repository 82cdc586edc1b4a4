"""KV-cache arithmetic against hand-computed examples for published configs.

Shared inputs (policy/pool.yaml defaults): H200 flex pool, 140 GiB = 150,323,855,360 B per GPU;
KV cap 0.75 x that = 112,742,891,520 B (105 GiB); activation reserve 0.08 x that =
12,025,908,428 B; bfloat16 KV (2 B); page target 4096 B; flash_attn (multiples of 16).
"""

from __future__ import annotations

import itertools
import json

import pytest

from policy import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.vllm import BackendError, KvPlanError, plan_kv_cache, render_args, serve_args
from runtime.vllm.backends import block_rule, check_block_size
from tests.harness.servers import TINY_MODEL
from tests.vllm.conftest import model

GPU = 150_323_855_360
CAP = 112_742_891_520
RESERVE = 12_025_908_428


def test_llama_3_8b_tp1(policy: PoolPolicy, workload: FlexWorkload) -> None:
    plan = plan_kv_cache(policy, workload, model("llama-3-8b"))
    assert plan.bytes_per_token_per_layer == 8 * (128 + 128) * 2 == 4096
    assert plan.ideal_block_tokens == 1  # a 4096 B page would be ONE token
    assert not plan.target_expressible
    assert plan.block_size == 16  # smallest multiple of 16
    assert plan.page_bytes_per_layer == 4096 * 16 == 65_536
    assert plan.block_bytes == 65_536 * 32 == 2_097_152
    assert plan.weight_bytes == 8_029_995_008 * 2
    assert (plan.gpu_memory_bytes, plan.share_cap_bytes) == (GPU, CAP)
    assert plan.activation_reserve_bytes == RESERVE
    # GPU - weights - reserve = 122,237,956,916 > cap: the 75 % cap binds
    assert not plan.weight_bound
    assert plan.kv_cache_bytes == CAP
    assert plan.num_blocks == CAP // 2_097_152 == 53_760
    assert plan.max_concurrent_tokens == 53_760 * 16 == 860_160
    assert plan.max_full_length_sequences == 860_160 / 8192 == 105.0


def test_llama_3_70b_tp4_is_bound_by_weights(policy: PoolPolicy, workload: FlexWorkload) -> None:
    plan = plan_kv_cache(policy, workload, model("llama-3-70b"), tensor_parallel=4)
    assert plan.bytes_per_token_per_layer == 2 * 256 * 2 == 1024  # 8 KV heads / 4 ranks
    assert plan.ideal_block_tokens == 4
    assert plan.block_size == 16
    assert plan.block_bytes == 1024 * 16 * 80 == 1_310_720
    assert plan.weight_bytes == 70_552_387_584 * 2 // 4 == 35_276_193_792
    left = GPU - 35_276_193_792 - RESERVE
    assert left == 103_021_753_140 < CAP
    assert plan.weight_bound
    assert plan.num_blocks == 103_021_753_140 // 1_310_720 == 78_599
    assert plan.kv_cache_bytes == 78_599 * 1_310_720 == 103_021_281_280
    assert plan.max_concurrent_tokens == 78_599 * 16


def test_llama_3_70b_tp8(policy: PoolPolicy, workload: FlexWorkload) -> None:
    plan = plan_kv_cache(policy, workload, model("llama-3-70b"), tensor_parallel=8)
    assert plan.bytes_per_token_per_layer == 1 * 256 * 2 == 512
    assert plan.ideal_block_tokens == 8
    assert plan.block_size == 16  # 8 is not a multiple of 16
    assert plan.block_bytes == 512 * 16 * 80 == 655_360
    assert plan.weight_bytes == 70_552_387_584 * 2 // 8
    assert not plan.weight_bound
    assert plan.num_blocks == CAP // 655_360 == 172_032
    assert "--tensor-parallel-size" in (args := render_args(plan))
    assert args[args.index("--tensor-parallel-size") + 1] == "8"


def test_qwen2_7b(policy: PoolPolicy, workload: FlexWorkload) -> None:
    plan = plan_kv_cache(policy, workload, model("qwen2-7b"))
    assert plan.bytes_per_token_per_layer == 4 * 256 * 2 == 2048
    assert plan.ideal_block_tokens == 2
    assert plan.block_bytes == 2048 * 16 * 28 == 917_504
    assert plan.num_blocks == CAP // 917_504 == 122_880
    assert plan.max_concurrent_tokens == 122_880 * 16 == 1_966_080


@pytest.mark.parametrize(
    ("backend", "vllm_name", "block_size"),
    [
        ("flashmla", "FLASHMLA", 64),
        ("cutlass_mla", "CUTLASS_MLA", 128),
        ("triton", "TRITON_MLA", 16),
    ],
)
def test_deepseek_v2_lite_mla_backends(
    policy: PoolPolicy, workload: FlexWorkload, backend: str, vllm_name: str, block_size: int
) -> None:
    plan = plan_kv_cache(policy, workload, model("deepseek-v2-lite"), backend=backend)  # type: ignore[arg-type]
    assert plan.bytes_per_token_per_layer == 1 * (512 + 64) * 2 == 1152  # latent, not K+V
    assert plan.ideal_block_tokens == round(4096 / 1152, 3)
    assert not plan.target_expressible
    assert (plan.backend.vllm_name, plan.block_size) == (vllm_name, block_size)
    assert plan.block_bytes == 1152 * block_size * 27
    # weights 15,706,357,760 x 2 B = 31,412,715,520: GPU - weights - reserve
    # = 106,885,231,412 < cap, so the weights bind
    assert plan.weight_bound
    assert plan.num_blocks == 106_885_231_412 // (1152 * block_size * 27)


def test_target_is_expressible_when_a_legal_block_hits_it(policy: PoolPolicy) -> None:
    """Tiny model: 2 KV heads x 64 x 2 B = 256 B/token, so 4096 B is exactly 16 tokens."""
    from runtime.vllm import load_model_spec

    tiny = load_model_spec(TINY_MODEL)
    workload = policy.workloads[0].model_copy(update={"max_model_len": 512})
    on_gpu = plan_kv_cache(policy, workload, tiny, backend="flash_attn")
    assert (on_gpu.block_size, on_gpu.page_bytes_per_layer, on_gpu.target_expressible) == (
        16,
        4096,
        True,
    )
    on_cpu = plan_kv_cache(policy, workload, tiny, backend="cpu")
    assert (on_cpu.block_size, on_cpu.page_bytes_per_layer, on_cpu.target_expressible) == (
        32,
        8192,
        False,
    )
    assert any("NOT expressible" in d.why for d in on_cpu.derivations())


def test_serve_args(policy: PoolPolicy, workload: FlexWorkload) -> None:
    args = serve_args(policy, workload, model("llama-3-8b"))
    flags = {flag: value for flag, value in itertools.pairwise(args) if not value.startswith("--")}
    assert args[:2] == ["--model", workload.model]
    assert flags["--port"] == str(workload.port)
    assert flags["--block-size"] == "16"
    assert flags["--kv-cache-memory-bytes"] == str(CAP)
    assert flags["--kv-cache-dtype"] == policy.kv_cache.cache_dtype
    assert flags["--max-num-seqs"] == str(workload.max_num_seqs)
    assert flags["--max-model-len"] == str(workload.max_model_len)
    assert flags["--shutdown-timeout"] == str(policy.disruption.drain_s)
    assert "--enable-prefix-caching" in args
    # The default policy compacts, so it preserves nothing (compaction beside a connector
    # is refused); with compaction off, filesystem preservation is the tiered connector.
    assert "--kv-transfer-config" not in args
    kv = policy.kv_cache.model_copy(update={"kv_preservation": "filesystem"})
    preserving = policy.model_copy(update={"kv_cache": kv})
    args = serve_args(
        preserving, workload.model_copy(update={"kv_compaction": False}), model("llama-3-8b")
    )
    transfer = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert transfer == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 16 * 2**30,
            "secondary_tiers": [
                {
                    "type": "SnapshotTier",
                    "module_path": "runtime.kvcache.preservation.tier",
                    "root_dir": workload.snapshot_volume.mount_path,
                    "flush_budget_s": policy.disruption.snapshot_s,
                    "identity": {
                        "model": workload.model,
                        "architecture": "LlamaForCausalLM",
                        "weights_dtype": "bfloat16",
                        "kv_dtype": "bfloat16",
                        "block_size": 16,
                        "attention_backend": "FLASH_ATTN",
                        "tensor_parallel": 1,
                        "prefix_caching_hash_algo": "sha256",
                        "python_hash_seed": None,
                    },
                }
            ],
        },
    }
    assert flags["--prefix-caching-hash-algo"] == "sha256"
    # The tier's flush runs in the engine's teardown, which --shutdown-timeout also bounds.
    flush_window = policy.disruption.drain_s + policy.disruption.snapshot_s
    assert args[args.index("--shutdown-timeout") + 1] == str(flush_window)


def test_policy_switches_change_the_args(policy: PoolPolicy, workload: FlexWorkload) -> None:
    kv = policy.kv_cache.model_copy(
        update={"prefix_caching": False, "kv_preservation": "cpu", "cache_dtype": "fp8"}
    )
    changed = policy.model_copy(update={"kv_cache": kv})
    plan = plan_kv_cache(changed, workload, model("llama-3-8b"))
    args = render_args(plan)
    assert "--no-enable-prefix-caching" in args
    assert plan.bytes_per_token_per_layer == 2048  # fp8: one byte per element
    assert plan.kv_transfer_config is not None
    assert "spec_name" not in plan.kv_transfer_config["kv_connector_extra_config"]
    off = policy.model_copy(update={"kv_cache": kv.model_copy(update={"kv_preservation": "off"})})
    assert "--kv-transfer-config" not in serve_args(off, workload, model("llama-3-8b"))


def test_cpu_backend_has_no_connector_and_needs_the_legacy_variable_unset(
    policy: PoolPolicy, workload: FlexWorkload
) -> None:
    plan = plan_kv_cache(policy, workload, model("llama-3-8b"), backend="cpu")
    assert plan.block_size == 32
    assert plan.kv_transfer_config is None
    assert plan.env_unset == ("VLLM_CPU_KVCACHE_SPACE",)


def test_block_size_the_backend_refuses() -> None:
    with pytest.raises(
        BackendError,
        match=r"block size 16 tokens is not supported by CPU_ATTN: "
        r"it must be a multiple of 32",
    ):
        check_block_size(block_rule("cpu", mla=False), 16)
    with pytest.raises(BackendError, match="must be exactly 64"):
        check_block_size(block_rule("flashmla", mla=True), 128)


def test_backend_that_cannot_serve_the_model(policy: PoolPolicy, workload: FlexWorkload) -> None:
    with pytest.raises(BackendError, match="'flashmla' cannot serve a standard-attention"):
        plan_kv_cache(policy, workload, model("llama-3-8b"), backend="flashmla")
    with pytest.raises(BackendError, match="'flex' cannot serve a MLA model"):
        plan_kv_cache(policy, workload, model("deepseek-v2-lite"), backend="flex")


def test_weights_that_leave_no_room_for_kv(policy: PoolPolicy, workload: FlexWorkload) -> None:
    """Llama-3-70B on one H200: 141 GB of weights alone exceed the 140 GiB GPU."""
    with pytest.raises(KvPlanError) as error:
        plan_kv_cache(policy, workload, model("llama-3-70b"), tensor_parallel=1)
    message = str(error.value)
    assert "llama-3-70b.json" in message
    # 70,552,387,584 x 2 B = 131.41 GiB; reserve 0.08 x 140 GiB = 11.20 GiB
    assert "weights 131.41 GiB + activation reserve 11.20 GiB" in message
    assert "exceed the 140.00 GiB GPU" in message


def test_gpu_too_small_for_one_sequence(policy: PoolPolicy, workload: FlexWorkload) -> None:
    """8192 tokens / 16 = 512 blocks x 2 MiB = 1 GiB; a 17 GiB GPU leaves 698 MiB."""
    with pytest.raises(KvPlanError, match=r"one sequence of max_model_len 8192 needs 1.00 GiB"):
        plan_kv_cache(policy, workload, model("llama-3-8b"), gpu_memory_bytes=17 * 2**30)


def test_context_longer_than_the_model(policy: PoolPolicy, workload: FlexWorkload) -> None:
    long = workload.model_copy(update={"max_model_len": 16_384})
    with pytest.raises(KvPlanError, match="exceeds the model's max_position_embeddings 8192"):
        plan_kv_cache(policy, long, model("llama-3-8b"))


def test_tensor_parallel_that_cannot_shard_kv_heads(
    policy: PoolPolicy, workload: FlexWorkload
) -> None:
    with pytest.raises(KvPlanError, match="tensor parallel 3 neither divides"):
        plan_kv_cache(policy, workload, model("llama-3-8b"), tensor_parallel=3)


def test_offload_tier_must_fit_in_the_container(policy: PoolPolicy, workload: FlexWorkload) -> None:
    small = workload.model_copy(
        update={"resources": workload.resources.model_copy(update={"memory": "16Gi"})}
    )
    assert small.resources.memory_bytes == 16 * 2**30
    kv = policy.kv_cache.model_copy(update={"kv_preservation": "cpu"})
    preserving = policy.model_copy(update={"kv_cache": kv})
    with pytest.raises(KvPlanError, match=r"offload_host_gib \(16\) does not fit .*\(16Gi\)"):
        plan_kv_cache(preserving, small, model("llama-3-8b"))


def test_compaction_on_a_gpu_asks_for_piecewise_cuda_graphs(
    policy: PoolPolicy, workload: FlexWorkload
) -> None:
    """Full CUDA graphs hold the KV buffer's address, so the plugin could not resize it."""
    assert workload.kv_compaction
    args = serve_args(policy, workload, model("llama-3-8b"))
    config = json.loads(args[args.index("--compilation-config") + 1])
    assert config == {"cudagraph_mode": "PIECEWISE"}
    plan = plan_kv_cache(policy, workload, model("llama-3-8b"))
    (row,) = [d for d in plan.derivations() if d.name == "--compilation-config"]
    assert "PIECEWISE" in row.value and "resized" in row.why
    off = workload.model_copy(update={"kv_compaction": False})
    assert "--compilation-config" not in serve_args(policy, off, model("llama-3-8b"))
    on_cpu = plan_kv_cache(policy, workload, model("llama-3-8b"), backend="cpu")
    assert on_cpu.compilation_config is None  # no CUDA graphs on the CPU backend
    assert "--compilation-config" not in render_args(on_cpu)


GIB = 2**30
LLAMA_8B_WEIGHTS = 8_029_995_008 * 2
LLAMA_70B_TP4_WEIGHTS = 35_276_193_792
LLAMA_70B_TP4_KV = 103_021_281_280


def test_gpu_memory_utilization_covers_what_the_worker_allocates_after_the_check(
    policy: PoolPolicy, workload: FlexWorkload
) -> None:
    """vLLM starts only when free >= ceil(total x utilization), measured once the CUDA context
    exists: weights + KV + the reserve less the context, over the GPU, rounded up to 1e-6."""
    capped = plan_kv_cache(policy, workload, model("llama-3-8b"))
    assert capped.startup_bytes == LLAMA_8B_WEIGHTS + CAP + RESERVE - GIB == 139_755_048_140
    assert capped.gpu_memory_utilization == "0.929694"  # 929,693.08 millionths, rounded up
    bound = plan_kv_cache(policy, workload, model("llama-3-70b"), tensor_parallel=4)
    assert bound.startup_bytes == LLAMA_70B_TP4_WEIGHTS + LLAMA_70B_TP4_KV + RESERVE - GIB
    assert bound.startup_bytes == 149_249_641_676  # 992,854.004 millionths of the GPU
    # weights + reserve + KV is the whole GPU: counting the context twice would ask for 1.0,
    # more than an idle GPU has free once the context exists
    assert bound.gpu_memory_utilization == "0.992855"
    args = serve_args(policy, workload, model("llama-3-8b"))
    at = args.index("--gpu-memory-utilization")
    assert args[at - 2 : at + 2] == [
        "--kv-cache-memory-bytes",
        str(CAP),
        "--gpu-memory-utilization",
        "0.929694",
    ]
    (row,) = [d for d in capped.derivations() if d.name == "--gpu-memory-utilization"]
    assert row.value == "0.929694" and "rounded up" in row.why


def test_a_smaller_plan_asks_for_less_of_the_gpu(
    policy: PoolPolicy, workload: FlexWorkload
) -> None:
    """A 40 % KV share: weights 14.96 + KV 56.00 + reserve 11.20 - context 1 = 81.16 GiB of
    140, where vLLM's default (0.92) would wait for 128.8 GiB free."""
    kv = policy.kv_cache.model_copy(update={"max_gpu_memory_share": 0.40})
    plan = plan_kv_cache(policy.model_copy(update={"kv_cache": kv}), workload, model("llama-3-8b"))
    assert plan.kv_cache_bytes == 60_129_542_144  # 28,672 blocks of 2 MiB
    assert plan.startup_bytes == LLAMA_8B_WEIGHTS + 60_129_542_144 + RESERVE - GIB
    assert plan.gpu_memory_utilization == "0.579694"  # 579,693.08 millionths, rounded up


def test_no_gpu_memory_utilization_on_the_cpu_backend(
    policy: PoolPolicy, workload: FlexWorkload
) -> None:
    """The CPU worker skips its memory check when --kv-cache-memory-bytes is given."""
    plan = plan_kv_cache(policy, workload, model("llama-3-8b"), backend="cpu")
    assert plan.gpu_memory_utilization is None
    assert "--gpu-memory-utilization" not in render_args(plan)
    (row,) = [d for d in plan.derivations() if d.name == "--gpu-memory-utilization"]
    assert row.value == "none"

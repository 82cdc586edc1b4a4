"""Our rules agree with the installed vLLM 0.32: the block sizes each backend declares, the
rejection of a size our code rejects, and the KV-transfer config keys vLLM reads.

In-process and short (no engine start); slow only because importing vLLM takes ~30 s here.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import vllm

from policy import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.vllm import BackendError, plan_kv_cache
from runtime.vllm.backends import BLOCK_RULES, BlockRule, block_rule, check_block_size
from tests.vllm.conftest import model

pytestmark = pytest.mark.slow

VLLM_ROOT = Path(vllm.__file__).parent


def _declared(rule: BlockRule) -> list[Any]:
    """The backend's ``get_supported_kernel_block_sizes()``, or its source text where the class
    cannot be imported without CUDA (FLASH_ATTN_MLA, CUTLASS_MLA)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    try:
        backend = AttentionBackendEnum[rule.vllm_name].get_class()
    except (ImportError, AssertionError, RuntimeError):
        source = (VLLM_ROOT / rule.source).read_text()
        body = source.split("def get_supported_kernel_block_sizes", 1)[1].split("def ", 1)[0]
        return [body]
    return list(backend.get_supported_kernel_block_sizes())


@pytest.mark.parametrize("rule", list(BLOCK_RULES.values()), ids=lambda r: r.vllm_name)
def test_rules_match_what_vllm_declares(rule: BlockRule) -> None:
    from vllm.v1.attention.backend import MultipleOf

    declared = _declared(rule)
    if declared and isinstance(declared[0], str):
        expected = f"[{rule.step}]" if rule.fixed else f"[MultipleOf({rule.step})]"
        assert f"return {expected}" in declared[0]
    elif rule.fixed:
        assert declared == [rule.step]
    else:
        assert declared == [MultipleOf(rule.step)]


def test_block_16_on_cpu_is_rejected_by_vllm_too() -> None:
    """The check vLLM runs at engine start (``select_common_block_size``) refuses it too."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.utils import select_common_block_size

    cpu = AttentionBackendEnum["CPU_ATTN"].get_class()
    with pytest.raises(BackendError, match="multiple of 32"):
        check_block_size(block_rule("cpu", mla=False), 16)
    with pytest.raises(ValueError, match=r"No common block size for 16 \(CPU_ATTN"):
        select_common_block_size(16, [cpu])
    assert select_common_block_size(32, [cpu]) == 32


def test_kv_transfer_config_keys_are_the_ones_vllm_reads(
    policy: PoolPolicy, workload: FlexWorkload
) -> None:
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

    # The default compacts and so preserves nothing; preservation needs compaction off.
    kv = policy.kv_cache.model_copy(update={"kv_preservation": "filesystem"})
    preserving = policy.model_copy(update={"kv_cache": kv})
    workload = workload.model_copy(update={"kv_compaction": False})
    plan = plan_kv_cache(preserving, workload, model("llama-3-8b"))
    assert plan.kv_transfer_config is not None
    config = KVTransferConfig(**plan.kv_transfer_config)
    assert config.kv_connector in KVConnectorFactory._registry
    extra = config.kv_connector_extra_config
    spec = OffloadingSpecFactory.get_spec_cls(extra)
    assert spec.__name__ == "TieringOffloadingSpec"
    (tier,) = extra["secondary_tiers"]
    tier_cls = SecondaryTierFactory.get_tier_class(tier)
    assert tier_cls.__name__ == "SnapshotTier"
    assert issubclass(tier_cls, FileSystemTierManager)  # vLLM's tier, keyed and bounded
    parameters = inspect.signature(tier_cls.__init__).parameters
    # The factory pops type and module_path and passes the rest as constructor arguments.
    assert set(tier) - {"type", "module_path"} <= set(parameters)
    assert tier["root_dir"] == workload.snapshot_volume.mount_path
    cpu_spec = (VLLM_ROOT / "v1/kv_offload/cpu/spec.py").read_text()
    assert 'extra_config.get("cpu_bytes_to_use")' in cpu_spec


def test_vllm_parses_the_compaction_args_into_piecewise_cuda_graphs(
    policy: PoolPolicy, workload: FlexWorkload
) -> None:
    """vLLM's own CLI parser accepts every rendered flag and reads the CUDA-graph mode the
    compaction plugin needs (docs/kvcache.md: no resize under full CUDA graphs)."""
    from vllm.config.compilation import CompilationConfig, CUDAGraphMode
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from runtime.vllm import serve_args

    parser = make_arg_parser(FlexibleArgumentParser())  # the OpenAI server's own parser
    args = serve_args(policy, workload, model("llama-3-8b"))
    # parse only: building EngineArgs would resolve the model id on the Hugging Face hub
    config = parser.parse_args(args).compilation_config
    assert isinstance(config, CompilationConfig)
    assert config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert not config.cudagraph_mode.has_full_cudagraphs()


@pytest.mark.parametrize(
    ("name", "tensor_parallel"), [("llama-3-8b", 1), ("llama-3-70b", 4)], ids=["cap", "weights"]
)
def test_vllm_starts_exactly_when_the_planned_bytes_are_free(
    policy: PoolPolicy, workload: FlexWorkload, name: str, tensor_parallel: int
) -> None:
    """vLLM's own parser reads ``--gpu-memory-utilization`` and its own start-up check
    (``request_memory``, what ``Worker.init_device`` runs) passes with ``startup_bytes`` free
    up to the 1e-6 grain and fails with less; an idle GPU (only the CUDA context held)
    passes, even for a weights-bound plan."""
    from vllm.config import CacheConfig
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.mem_utils import MemorySnapshot
    from vllm.v1.worker.utils import request_memory

    from runtime.vllm.kv_cache_plan import CUDA_CONTEXT_BYTES, UTILIZATION_GRAIN
    from runtime.vllm.plan import render_args

    plan = plan_kv_cache(policy, workload, model(name), tensor_parallel=tensor_parallel)
    parser = make_arg_parser(FlexibleArgumentParser())
    parsed = parser.parse_args(render_args(plan)).gpu_memory_utilization
    assert plan.gpu_memory_utilization is not None
    assert parsed == float(plan.gpu_memory_utilization)
    cache = CacheConfig(gpu_memory_utilization=parsed)
    total = plan.gpu_memory_bytes

    def check(free: int) -> int:
        snapshot = MemorySnapshot(device="cpu", auto_measure=False)
        snapshot.free_memory, snapshot.total_memory = free, total
        requested: int = request_memory(snapshot, cache)
        return requested

    requested = check(total)
    assert plan.startup_bytes <= requested < plan.startup_bytes + total / UTILIZATION_GRAIN
    assert check(requested) == requested
    with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
        check(requested - 1)
    with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
        check(plan.startup_bytes - 1)
    check(total - CUDA_CONTEXT_BYTES)  # an idle GPU after the context: starts

"""vLLM 0.32's filesystem KV tier, run on its own: no connector, no engine, no CUDA.

The OffloadingConnector asserts CUDA tensors, so the CPU build cannot run it end to end. Its
secondary tiers only ever touch the primary (host) tier's memoryview, so they run here
unchanged: the tier below is built by vLLM's own ``SecondaryTierFactory`` from the same
``secondary_tiers`` entry ``gpupool vllm-args`` emits, over vLLM's own ``TieringOffloadingSpec``,
and writes vLLM's real file layout through vLLM's own store and load code.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray
from vllm.v1.kv_offload.base import OffloadKey, ReqContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

BLOCK_BYTES = 16 * 1024
"""Bytes of one offloaded block in these tests (a real 8B model's block is ~2 MiB)."""


def offloading_spec(
    *,
    model: str = "tiny/model",
    dtype: str = "bfloat16",
    tokens_per_block: int = 16,
    block_bytes: int = BLOCK_BYTES,
    tp_size: int = 1,
    secondary_tiers: Iterable[Mapping[str, Any]] = (),
) -> TieringOffloadingSpec:
    """vLLM's tiering spec for one full-attention group, as the connector would build it."""
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block, ("layers.0", "layers.1"), 0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": 1 << 20, "secondary_tiers": list(secondary_tiers)},
        engine_id="engine-0",
        model=OffloadingModelConfig(model, dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_block, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=tp_size,
            tp_size=tp_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
    return TieringOffloadingSpec(config)


def primary_view(num_chunks: int, block_bytes: int = BLOCK_BYTES) -> NDArray[np.uint8]:
    """The host tier's buffer: ``num_chunks`` slots of one block each (``strides[0]``), in
    anonymous page-aligned memory as vLLM's own (``O_DIRECT`` needs the alignment)."""
    region = mmap.mmap(-1, num_chunks * block_bytes)
    return np.frombuffer(region, dtype=np.uint8).reshape(num_chunks, block_bytes)


def build_tier(
    tier_config: Mapping[str, Any], buffer: NDArray[np.uint8], **spec: Any
) -> SecondaryTierManager:
    """The tier ``tier_config`` names, built the way ``TieringOffloadingSpec`` builds it."""
    return SecondaryTierFactory.create_secondary_tier(
        dict(tier_config), memoryview(buffer), offloading_spec(**spec)
    )


def key(n: int) -> OffloadKey:
    """A deterministic 32-byte block hash (vLLM's sha256 width), group 0."""
    return make_offload_key(hashlib.sha256(str(n).encode()).digest(), 0)


def request(name: str = "req-0") -> ReqContext:
    return ReqContext(req_id=name)


_job_ids = iter(range(1, 1 << 62))


def store(tier: SecondaryTierManager, keys: list[OffloadKey], chunks: list[int]) -> int:
    """Submit one store job; its id."""
    job_id = next(_job_ids)
    tier.submit_store(_job(job_id, keys, chunks, promotion=False))
    return job_id


def load(tier: SecondaryTierManager, keys: list[OffloadKey], chunks: list[int]) -> int:
    """Submit one load job; its id."""
    job_id = next(_job_ids)
    tier.submit_load(_job(job_id, keys, chunks, promotion=True))
    return job_id


def _job(job_id: int, keys: list[OffloadKey], chunks: list[int], *, promotion: bool) -> TransferJob:
    return TransferJob(
        job_id=job_id,
        keys=keys,
        chunk_ids=np.asarray(chunks, dtype=np.int64),
        is_promotion=promotion,
        req_context=request(),
    )


def finished(
    tier: SecondaryTierManager, job_ids: set[int], timeout_s: float = 30.0
) -> dict[int, JobResult]:
    """Poll ``get_finished_jobs`` (as the scheduler does every step) until ``job_ids`` end."""
    results: dict[int, JobResult] = {}
    deadline = time.monotonic() + timeout_s
    while not job_ids <= results.keys():
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs {sorted(job_ids - results.keys())} did not finish")
        results |= {int(r.job_id): r for r in tier.get_finished_jobs()}
        time.sleep(0.002)
    return results


def block_files(root: str) -> list[str]:
    """Every complete block file vLLM wrote under ``root``."""
    return sorted(
        os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".bin")
    )

"""vLLM service times for the simulator: prefill and decode-step latency of a model on a GPU type.

``service_model(gpu_product=..., model_id=..., spec=..., tp=..., max_context=...)`` returns a
``ServiceModel`` whose methods are numpy-only table lookups, cheap enough to be called millions
of times on arrays. The tables are built once per (aiconfigurator system, model, tp,
max_context) and kept in-process.

Where the numbers come from, in order of preference:

1. **aiconfigurator-core** (NVIDIA's measured per-op database, vLLM backend; its default vLLM
   data set, 0.24.0 for most systems in 0.12.0, 0.14.0 for ``a100_sxm``). The policy's GPU
   product label (``nvidia.com/gpu.product``) maps to a database system by family
   (``GPU_SPECS``); the policy's model id maps to a database model by normalised name
   (``database_model``: org dropped, case folded, ``Meta-`` before ``Llama`` and
   ``-Instruct``/``-Chat``/``-Base``/``-IT``/``-hf`` tokens removed), used only if its
   packaged config has the same shape as the workload's ``ModelSpec``. Otherwise the
   ``config.json`` the ``ModelSpec`` was read from (``spec.source``) is compiled instead.
   The tables sample ``EngineHandle.predict_prefill_latency(1, tokens)`` and
   ``EngineHandle.predict_decode_latency(batch, context, osl=2)``.

   What the database's decode latency means: ``predict_decode_latency(bs, isl, osl)`` is the
   total time of the ``osl - 1`` decode steps that follow the prefill (the first output token
   comes out of the prefill), for ``bs`` sequences whose context grows from ``isl``: ``osl=1``
   gives 0, ``osl=2`` exactly one step (equal to ``decode_step_latency(bs, isl, 1)``),
   ``osl=10`` nine steps (9 x 4.907 ms at bs 1, isl 2048 on H200). So ``osl=2`` is one step
   of ``bs`` sequences each holding ``isl`` tokens of KV.

2. **Roofline fallback** for GPUs without vLLM data in the database (L4, A10G, PCIe/NVL parts,
   ...) and for models it cannot compile. Per GPU rank (``tp`` divides parameters and
   weights; KV bytes are per rank already), with ``F`` dense bf16 FLOP/s and ``BW`` HBM bytes/s
   from the vendor datasheet (``GPU_SPECS``), ``P = spec.param_count / tp`` parameters,
   ``W = spec.weight_bytes_per_rank(tp)`` weight bytes and ``K`` KV bytes per token (all
   layers, this rank: ``ModelSpec.kv_bytes_per_token_per_layer`` x layers, as
   ``runtime.vllm.plan.plan_kv_cache`` sizes pages, with ``--kv-cache-dtype auto``)::

       prefill(n)        = 2 P n / (F MFU) + W / BW
       decode_step(b, c) = (W + b c K) / (BW MBU) + 2 P b / (F MFU)
       MFU = 0.5, MBU = 0.7

   It ignores attention FLOPs (the n^2 term of long prompts), MoE sparsity (all parameters
   count), tensor-parallel communication and kernel launch overheads.

   Calibration, Llama-3.1-8B on H200 (roofline / database; ``tests/sim/test_service_time.py``
   keeps these numbers true). Prefill: 512 tokens 1.74, 2048 tokens 1.61 (69.9 vs 43.4 ms:
   the database's GEMMs reach ~0.8 of peak, not 0.5), 8192 tokens 1.35, 32768 tokens 0.96
   (the missing n^2 attention term catches up). Decode step at context 2048: batch 1 1.00
   (4.9 ms, weight-bound: MBU 0.7 is right), batch 32 1.15, batch 128 1.38, batch 512 1.40;
   at context 32768: batch 32 1.29, batch 128 1.35 (the roofline adds the compute and memory
   terms; real kernels overlap them). So the fallback is pessimistic: decode 0-40 % slow,
   prefill up to 75 % slow on short prompts and about right at 32k.

Lookup: bilinear interpolation in linear space (exact for the roofline, which is affine in
each axis) on grids of powers of two and their x1.5 midpoints: batch 1..512, context
128..max_context, prompt tokens 16..max_context. Inputs below a grid are clamped to its first
point (a forward pass costs at least that); past its end the last segment continues linearly.
Against direct database calls at 1,000 random off-grid points (H200, up to 131072 tokens) the
error is 0.1 % median, 2.4 % 95th percentile, 4.7 % worst for decode steps and 0.7 % / 3.5 % /
5.9 % for prefill: the database itself jumps at GEMM tile boundaries. The tables are made
monotone (running maximum along each axis; the measured data wobbles), which raises no point
by more than 1.9 % (0.1 ms). Building the tables takes ~1.5-2.2 s the first time per database
system in a process (importing aiconfigurator-core ~0.5 s, its database load and compile
~1.1-1.4 s, the 400-point grid ~0.3 s), ~0.02 s for another tp or max_context on a loaded
system. A lookup costs ~0.5 ms (decode) / ~0.2 ms (prefill) for 10,000 elements, ~11 / ~2 us
for a scalar.

aiconfigurator-core logs two notices per database load that concern neither vLLM nor these
models ("Loading low-fidelity fallback rows ..." for other frameworks' tables, and
"resolve_attention_lane_order: ..." where it has no default vLLM attention kernel for the GPU,
a100_sxm and l40s); a filter on those two loggers drops exactly them.

The database side is ``runtime.sim.service_database``; the tables and their lookup are
``runtime.sim.service_tables``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from runtime.sim.service_database import (
    DATABASE_BACKEND,
    DATABASE_PACKAGE,
    config_text,
    database_model,
    database_tables,
    database_version,
)
from runtime.sim.service_tables import Array, StepTables, Values, tabulate
from runtime.vllm.model_spec import ModelSpec

MFU = 0.5
"""Roofline: fraction of dense bf16 peak a GEMM-bound forward reaches."""
MBU = 0.7
"""Roofline: fraction of HBM bandwidth a weight- or KV-bound decode step reaches."""


class ServiceTimeError(ValueError):
    """No service-time model for this GPU product / model; the message says what is known."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU family: how GPU feature discovery labels it and what the service model uses."""

    name: str
    """Product as the datasheet names it."""
    label: str
    """An ``nvidia.com/gpu.product`` value of this family (for messages)."""
    pattern: str
    """Regex matched (``re.search``) against the upper-cased label without ``NVIDIA-``."""
    system: str | None
    """aiconfigurator-core system with vLLM data, or None (roofline only)."""
    bf16_tflops: float
    """Dense (no sparsity) bf16 tensor-core peak, TFLOP/s."""
    hbm_gbps: float
    """Memory bandwidth, GB/s."""


GPU_SPECS: tuple[GpuSpec, ...] = (
    # Ordered: the first match wins, so variants come before their family.
    # H200 datasheet (nvidia.com/en-us/data-center/h200): BF16 1,979 (SXM) / 1,671 (NVL)
    # TFLOPS with sparsity, i.e. 989 / 836 dense; 4.8 TB/s for both.
    GpuSpec("H200 NVL", "NVIDIA-H200-NVL", r"^H200-NVL", None, 836.0, 4800.0),
    GpuSpec("H200 SXM 141GB", "NVIDIA-H200", r"^H200(-|$)", "h200_sxm", 989.0, 4800.0),
    # H100 datasheet (nvidia.com/en-us/data-center/h100): BF16 1,979 (SXM) / 1,513 (PCIe) /
    # 1,671 (NVL) TFLOPS with sparsity; 3.35 / 2.0 / 3.9 TB/s. aiconfigurator-core 0.12.0
    # ships no vLLM data for h100_pcie.
    GpuSpec("H100 PCIe", "NVIDIA-H100-PCIe", r"^H100.*-PCIE", None, 756.0, 2000.0),
    GpuSpec("H100 NVL", "NVIDIA-H100-NVL", r"^H100.*-NVL", None, 835.0, 3900.0),
    GpuSpec("H100 SXM", "NVIDIA-H100-80GB-HBM3", r"^H100(-|$)", "h100_sxm", 989.0, 3350.0),
    # A100 datasheet (nvidia.com/en-us/data-center/a100): BF16 312 TFLOPS dense (624 sparse);
    # 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s, 40GB 1,555 GB/s. Database: a100_sxm (80GB)
    # only; a100_pcie has no vLLM data.
    GpuSpec(
        "A100 40GB PCIe", "NVIDIA-A100-PCIE-40GB", r"^A100(?=.*PCIE)(?=.*40GB)", None, 312.0, 1555.0
    ),
    GpuSpec("A100 80GB PCIe", "NVIDIA-A100-80GB-PCIe", r"^A100(?=.*PCIE)", None, 312.0, 1935.0),
    GpuSpec("A100 40GB SXM", "NVIDIA-A100-SXM4-40GB", r"^A100(?=.*40GB)", None, 312.0, 1555.0),
    GpuSpec("A100 80GB SXM", "NVIDIA-A100-SXM4-80GB", r"^A100(-|$)", "a100_sxm", 312.0, 2039.0),
    # GB200 NVL72 datasheet: 360 PFLOPS FP16/BF16 sparse and 576 TB/s HBM3e over 72 GPUs,
    # i.e. 2,500 TFLOPS dense and 8 TB/s per GPU.
    GpuSpec("GB200", "NVIDIA-GB200", r"^GB200(-|$)", "gb200", 2500.0, 8000.0),
    # HGX B200 datasheet: 36 PFLOPS FP16/BF16 sparse and 64 TB/s over 8 GPUs, i.e. 2,250 TFLOPS
    # dense and 8 TB/s per GPU (aiconfigurator's b200_sxm.yaml uses 7.7 TB/s).
    GpuSpec("B200", "NVIDIA-B200", r"^B200(-|$)", "b200_sxm", 2250.0, 8000.0),
    # L40S datasheet: BF16 362.05 TFLOPS dense (733 sparse), 864 GB/s.
    GpuSpec("L40S", "NVIDIA-L40S", r"^L40S(-|$)", "l40s", 362.0, 864.0),
    # L40 datasheet: BF16 181.05 TFLOPS dense (362.1 sparse), 864 GB/s.
    GpuSpec("L40", "NVIDIA-L40", r"^L40(-|$)", None, 181.0, 864.0),
    # L4 datasheet: BF16 242 TFLOPS with sparsity (121 dense), 300 GB/s. aiconfigurator-core
    # 0.12.0 has an l4 system but no vLLM data for it.
    GpuSpec("L4", "NVIDIA-L4", r"^L4(-|$)", None, 121.0, 300.0),
    # A10G (AWS G5) has no NVIDIA datasheet: it shares the A10's 600 GB/s GDDR6 but has about
    # half its tensor rate; Baseten's "NVIDIA A10 vs A10G for ML model inference" lists 70
    # TFLOPS, and a measured bf16 GEMM reaches 69.5 TFLOP/s. Not the A10's 125.
    GpuSpec("A10G", "NVIDIA-A10G", r"^A10G(-|$)", None, 70.0, 600.0),
    # A10 datasheet: BF16 125 TFLOPS dense (250 sparse), 600 GB/s.
    GpuSpec("A10", "NVIDIA-A10", r"^A10(-|$)", None, 125.0, 600.0),
)
"""GPU families by ``nvidia.com/gpu.product`` label, first match wins."""


@dataclass(frozen=True)
class ServiceModel:
    """Step latencies of one model on one GPU type under vLLM, as lookup tables."""

    source: str
    """Where the numbers come from: the database (system, model, tp) or the roofline (specs)."""
    fallback: bool
    """True when the roofline was used."""
    gpu: str
    """Policy GPU product name (``nvidia.com/gpu.product``)."""
    model: str
    """Policy model id."""
    tables: StepTables = field(repr=False, compare=False)

    def prefill_s(self, tokens: Values) -> Array:
        """Seconds to prefill a prompt of ``tokens`` uncached tokens, batch 1 (elementwise)."""
        k = self.tables.lookup
        result: Array = np.asarray(np.interp(tokens, k.tokens, k.prefill_s), dtype=np.float64)
        return result

    def decode_step_s(self, batch: Values, context: Values) -> Array:
        """Seconds of ONE decode step of ``batch`` sequences at mean context length ``context``
        (tokens already in each sequence's KV cache); the arguments broadcast."""
        k = self.tables.lookup
        fb = np.interp(batch, k.batch, k.batch_positions)
        fc = np.interp(context, k.context, k.context_positions)
        i = np.minimum(fb.astype(np.intp), k.last_batch_cell)
        j = np.minimum(fc.astype(np.intp), k.last_context_cell)
        u, v = fb - i, fc - j
        cell = i * k.cells_per_row + j
        # mode="clip": a NaN input gives NaN (through u, v), never an IndexError
        result: Array = np.asarray(
            k.base.take(cell, mode="clip")
            + u * k.d_batch.take(cell, mode="clip")
            + v * (k.d_context.take(cell, mode="clip") + u * k.twist.take(cell, mode="clip")),
            dtype=np.float64,
        )
        return result

    def saturated_tokens_per_s(self, *, max_num_seqs: int, context: float) -> float:
        """Generated tokens/s of one replica decoding ``max_num_seqs`` sequences at mean context
        ``context`` (decode only: the prefills of replacement requests are not included)."""
        return max_num_seqs / float(self.decode_step_s(max_num_seqs, context))


def service_model(
    *, gpu_product: str, model_id: str, spec: ModelSpec, tp: int = 1, max_context: int
) -> ServiceModel:
    """The service model of ``model_id`` (shape ``spec``) on ``gpu_product`` at tensor parallel
    ``tp``, tabulated up to ``max_context`` tokens (database first, roofline fallback).

    Raises ``ServiceTimeError`` for a GPU product of no known family (the message lists them).
    """
    if tp < 1 or max_context < 1:
        raise ServiceTimeError(
            f"{model_id} on {gpu_product}: tp ({tp}) and max_context ({max_context}) must be >= 1"
        )
    gpu = gpu_spec(gpu_product, model_id=model_id)
    found = _from_database(gpu, gpu_product, model_id, spec, tp, max_context)
    if isinstance(found, ServiceModel):
        return found
    return roofline_model(
        gpu_product=gpu_product,
        model_id=model_id,
        spec=spec,
        tp=tp,
        max_context=max_context,
        reason=found,
    )


def _from_database(
    gpu: GpuSpec, gpu_product: str, model_id: str, spec: ModelSpec, tp: int, max_context: int
) -> ServiceModel | str:
    """The database's service model, or why it has none (the roofline's ``reason``)."""
    if gpu.system is None:
        return f"no vLLM data for {gpu.name} in {DATABASE_PACKAGE}"
    version = database_version()
    if version is None:
        return f"{DATABASE_PACKAGE} is not installed"
    db_name = database_model(model_id, spec)
    config = config_text(spec) if db_name is None else None
    if db_name is None and config is None:
        return (
            f"{DATABASE_PACKAGE} has no model {model_id!r} and the spec's config "
            f"{spec.source!r} is not a readable file"
        )
    ref = db_name if db_name is not None else f"config {spec.source}"
    tables = database_tables(gpu.system, db_name, config, tp, max_context)
    if isinstance(tables, str):
        return f"{DATABASE_PACKAGE} failed for {ref}: {tables}"
    return ServiceModel(
        source=f"{DATABASE_PACKAGE} {version} ({gpu.system}, {DATABASE_BACKEND}, {ref}, tp={tp})",
        fallback=False,
        gpu=gpu_product,
        model=model_id,
        tables=tables,
    )


def roofline_model(
    *,
    gpu_product: str,
    model_id: str,
    spec: ModelSpec,
    tp: int = 1,
    max_context: int,
    reason: str = "requested",
) -> ServiceModel:
    """The roofline service model (module docstring), whatever the database has."""
    gpu = gpu_spec(gpu_product, model_id=model_id)
    return ServiceModel(
        source=f"roofline fallback ({gpu_product}: {gpu.bf16_tflops:g} TFLOP/s bf16, "
        f"{gpu.hbm_gbps:g} GB/s; MFU {MFU}, MBU {MBU}, tp={tp}; {reason})",
        fallback=True,
        gpu=gpu_product,
        model=model_id,
        tables=_roofline_tables(gpu, spec, tp, max_context),
    )


def gpu_spec(gpu_product: str, *, model_id: str = "") -> GpuSpec:
    """The family of a ``nvidia.com/gpu.product`` label (case-insensitive; ``NVIDIA-`` and a
    time-slicing ``-SHARED`` suffix ignored). MIG slices are not modelled."""
    label = re.sub(r"[\s_]+", "-", gpu_product.strip()).upper()
    label = re.sub(r"-SHARED$", "", re.sub(r"^NVIDIA-", "", label))
    where = f"GPU product {gpu_product!r}" + (f" (model {model_id})" if model_id else "")
    if re.search(r"-MIG(-|$)", label):
        raise ServiceTimeError(f"{where}: MIG slices have no service-time model; use whole GPUs")
    for gpu in GPU_SPECS:
        if re.search(gpu.pattern, label):
            return gpu
    known = ", ".join(g.label for g in GPU_SPECS)
    raise ServiceTimeError(
        f"{where}: not in {DATABASE_PACKAGE} nor the roofline GPU table; known products: {known}"
    )


@lru_cache(maxsize=64)
def _roofline_tables(gpu: GpuSpec, spec: ModelSpec, tp: int, max_context: int) -> StepTables:
    flops = gpu.bf16_tflops * 1e12 * MFU
    bandwidth = gpu.hbm_gbps * 1e9 * MBU
    params = spec.param_count / tp
    weights = float(spec.weight_bytes_per_rank(tp))
    kv_per_token = spec.kv_bytes_per_token_per_layer(tp, spec.dtype) * spec.num_layers

    def decode(b: float, c: float) -> float:
        return (weights + b * c * kv_per_token) / bandwidth + 2 * params * b / flops

    def prefill(n: float) -> float:
        return 2 * params * n / flops + weights / (gpu.hbm_gbps * 1e9)

    return tabulate(max_context, decode, prefill)

"""vLLM service times: the aiconfigurator-core tables against direct database calls, the GPU and
model mapping, and the roofline fallback (its formula and its calibration against the database)."""

from __future__ import annotations

import dataclasses
import logging
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml
from aiconfigurator_core.sdk.engine import EngineHandle

from runtime.sim.service_database import database_model
from runtime.sim.service_time import (
    GPU_SPECS,
    MBU,
    MFU,
    ServiceModel,
    ServiceTimeError,
    gpu_spec,
    roofline_model,
    service_model,
)
from runtime.vllm.model_spec import ModelSpec, load_model_spec

ROOT = Path(__file__).resolve().parents[2]
LLAMA_ID = "meta-llama/Llama-3.1-8B-Instruct"
DB_LLAMA = "meta-llama/Meta-Llama-3.1-8B"
MAX_CONTEXT = 32768


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return load_model_spec(ROOT / "policy/models/llama-3.1-8b-instruct.json")


@pytest.fixture(scope="module")
def h200(spec: ModelSpec) -> ServiceModel:
    return service_model(
        gpu_product="NVIDIA-H200", model_id=LLAMA_ID, spec=spec, max_context=MAX_CONTEXT
    )


@pytest.fixture(scope="module")
def handle(h200: ServiceModel) -> EngineHandle:
    """The database queried directly (after ``h200``, so its log filter is in place)."""
    return EngineHandle.compile(DB_LLAMA, "h200_sxm", "vllm")


def test_h200_llama_comes_from_the_database(h200: ServiceModel, handle: EngineHandle) -> None:
    assert not h200.fallback
    assert h200.source.startswith("aiconfigurator-core 0.12.0 (h200_sxm, vllm, ")
    assert DB_LLAMA in h200.source
    assert (h200.gpu, h200.model) == ("NVIDIA-H200", LLAMA_ID)
    prefill = float(h200.prefill_s(2048))
    assert prefill == pytest.approx(handle.predict_prefill_latency(1, 2048) / 1e3, rel=0.05)
    assert prefill == pytest.approx(0.043, rel=0.05)  # docs: 43 ms
    for batch, seen_ms in ((1, 4.9), (32, 7.3), (128, 13.9)):
        step = float(h200.decode_step_s(batch, 2048))
        direct = handle.predict_decode_latency(batch, 2048, 2) / 1e3
        assert step == pytest.approx(direct, rel=0.05)
        assert step == pytest.approx(seen_ms / 1e3, rel=0.05)


def test_database_decode_latency_is_osl_minus_one_steps(handle: EngineHandle) -> None:
    """What the module docstring says ``predict_decode_latency`` means."""
    for batch in (1, 32, 128):
        one = handle.predict_decode_latency(batch, 2048, 2)
        assert handle.predict_decode_latency(batch, 2048, 1) == 0
        assert one == pytest.approx(handle.decode_step_latency(batch, 2048, 1), rel=1e-9)
        assert handle.predict_decode_latency(batch, 2048, 3) == pytest.approx(2 * one, rel=0.01)
        assert handle.predict_decode_latency(batch, 2048, 10) == pytest.approx(9 * one, rel=0.01)


def test_off_grid_lookups_stay_close_to_the_database(
    h200: ServiceModel, handle: EngineHandle
) -> None:
    rng = np.random.default_rng(7)
    batch = rng.integers(1, 513, 300)
    context = np.exp(rng.uniform(np.log(128), np.log(MAX_CONTEXT), 300)).astype(int)
    tokens = np.exp(rng.uniform(np.log(16), np.log(MAX_CONTEXT), 300)).astype(int)
    direct_decode = [
        handle.predict_decode_latency(int(b), int(c), 2) / 1e3
        for b, c in zip(batch, context, strict=True)
    ]
    direct_prefill = [handle.predict_prefill_latency(1, int(n)) / 1e3 for n in tokens]
    decode_error = np.abs(h200.decode_step_s(batch, context) / direct_decode - 1)
    prefill_error = np.abs(h200.prefill_s(tokens) / direct_prefill - 1)
    assert np.quantile(decode_error, 0.95) < 0.03 and decode_error.max() < 0.06
    assert np.quantile(prefill_error, 0.95) < 0.04 and prefill_error.max() < 0.07


def test_step_times_are_monotone(h200: ServiceModel) -> None:
    batch = np.arange(1, 1025, dtype=np.float64)[:, None]
    context = np.geomspace(1, 4 * MAX_CONTEXT, 400)[None, :]
    steps = h200.decode_step_s(batch, context)
    assert np.all(np.diff(steps, axis=0) >= 0) and np.all(np.diff(steps, axis=1) >= 0)
    assert np.all(np.diff(h200.prefill_s(np.arange(0, 4 * MAX_CONTEXT, 7))) >= 0)
    assert np.all(steps > 0)


def test_lookups_are_vectorised(h200: ServiceModel) -> None:
    tokens = np.arange(12).reshape(3, 4) * 300
    assert h200.prefill_s(tokens).shape == (3, 4)
    assert h200.prefill_s(100).shape == ()
    assert h200.decode_step_s(
        np.array([[1.0], [8.0]]), np.array([512.0, 1024.0, 4096.0])
    ).shape == (2, 3)
    assert h200.decode_step_s(16, np.full(5, 2048)).shape == (5,)
    assert h200.decode_step_s(16.0, 2048.0).shape == ()
    np.testing.assert_allclose(
        h200.decode_step_s(np.array([1, 32, 128]), 2048),
        [float(h200.decode_step_s(b, 2048)) for b in (1, 32, 128)],
    )
    # below the grid: clamped; past it: the last segment continues
    assert float(h200.prefill_s(0)) == float(h200.prefill_s(16))
    assert float(h200.decode_step_s(1024, 2048)) > float(h200.decode_step_s(512, 2048))


def test_saturated_throughput(h200: ServiceModel) -> None:
    rate = h200.saturated_tokens_per_s(max_num_seqs=128, context=2048)
    assert rate == pytest.approx(128 / float(h200.decode_step_s(128, 2048)))
    assert 8000 < rate < 10000  # 128 / 13.9 ms
    assert h200.saturated_tokens_per_s(max_num_seqs=256, context=2048) > rate


def test_tables_are_cached_per_system(spec: ModelSpec, h200: ServiceModel) -> None:
    again = service_model(
        gpu_product="nvidia-h200", model_id=LLAMA_ID, spec=spec, max_context=MAX_CONTEXT
    )
    assert again.tables is h200.tables
    sxm = service_model(
        gpu_product="NVIDIA-H100-SXM5-80GB", model_id=LLAMA_ID, spec=spec, max_context=8192
    )
    hbm3 = service_model(
        gpu_product="NVIDIA-H100-80GB-HBM3", model_id=LLAMA_ID, spec=spec, max_context=8192
    )
    assert not sxm.fallback and "(h100_sxm, vllm, " in sxm.source
    assert hbm3.tables is sxm.tables
    direct = EngineHandle.compile(DB_LLAMA, "h100_sxm", "vllm")
    assert float(sxm.decode_step_s(32, 2048)) == pytest.approx(
        direct.predict_decode_latency(32, 2048, 2) / 1e3, rel=0.05
    )
    # H100 is slower than H200 on bandwidth-bound decode, not on compute-bound prefill
    assert float(sxm.decode_step_s(32, 2048)) > 1.2 * float(h200.decode_step_s(32, 2048))


def test_tensor_parallel_is_compiled(spec: ModelSpec, h200: ServiceModel) -> None:
    tp2 = service_model(
        gpu_product="NVIDIA-H200", model_id=LLAMA_ID, spec=spec, tp=2, max_context=8192
    )
    assert not tp2.fallback and "tp=2" in tp2.source
    assert float(tp2.decode_step_s(32, 2048)) < float(h200.decode_step_s(32, 2048))


@pytest.mark.parametrize(
    ("label", "name", "system"),
    [
        ("NVIDIA-H200", "H200 SXM 141GB", "h200_sxm"),
        ("nvidia-h200", "H200 SXM 141GB", "h200_sxm"),
        ("NVIDIA-H200-NVL", "H200 NVL", None),
        ("NVIDIA-H100-80GB-HBM3", "H100 SXM", "h100_sxm"),
        ("NVIDIA-H100-SXM5-80GB", "H100 SXM", "h100_sxm"),
        ("NVIDIA-H100-80GB-HBM3-SHARED", "H100 SXM", "h100_sxm"),
        ("NVIDIA-H100-PCIe", "H100 PCIe", None),
        ("NVIDIA-H100-NVL", "H100 NVL", None),
        ("NVIDIA-A100-SXM4-80GB", "A100 80GB SXM", "a100_sxm"),
        ("NVIDIA-A100-SXM4-40GB", "A100 40GB SXM", None),
        ("NVIDIA-A100-80GB-PCIe", "A100 80GB PCIe", None),
        ("NVIDIA-A100-PCIE-40GB", "A100 40GB PCIe", None),
        ("NVIDIA-B200", "B200", "b200_sxm"),
        ("NVIDIA-GB200", "GB200", "gb200"),
        ("NVIDIA-L40S", "L40S", "l40s"),
        ("NVIDIA-L40", "L40", None),
        ("NVIDIA-L4", "L4", None),
        ("NVIDIA-A10G", "A10G", None),
        ("NVIDIA A10", "A10", None),
    ],
)
def test_gpu_products_map_by_family(label: str, name: str, system: str | None) -> None:
    gpu = gpu_spec(label)
    assert (gpu.name, gpu.system) == (name, system)


@pytest.mark.parametrize("label", ["Acme-X1", "NVIDIA-GH200-480GB", "Tesla-T4", ""])
def test_unknown_gpu_product_raises_naming_it(spec: ModelSpec, label: str) -> None:
    with pytest.raises(ServiceTimeError) as raised:
        service_model(gpu_product=label, model_id=LLAMA_ID, spec=spec, max_context=8192)
    message = str(raised.value)
    assert repr(label) in message and LLAMA_ID in message
    assert "known products: NVIDIA-H200-NVL, NVIDIA-H200," in message and "NVIDIA-L4" in message
    assert "\n" not in message


def test_mig_slices_are_refused() -> None:
    with pytest.raises(ServiceTimeError, match="MIG"):
        gpu_spec("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")


def test_gpu_table_agrees_with_the_database_systems() -> None:
    """The datasheet numbers against aiconfigurator-core's own system files (within 5 %)."""
    systems = resources.files("aiconfigurator_core") / "systems"
    for gpu in GPU_SPECS:
        if gpu.system is None:
            continue
        numbers = yaml.safe_load((systems / f"{gpu.system}.yaml").read_text())["gpu"]
        assert gpu.bf16_tflops * 1e12 == pytest.approx(numbers["bfloat16_tc_flops"], rel=0.05)
        assert gpu.hbm_gbps * 1e9 == pytest.approx(numbers["mem_bw"], rel=0.05)


def test_model_ids_map_to_database_names(spec: ModelSpec) -> None:
    for model_id in (
        LLAMA_ID,
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "META-LLAMA/LLAMA-3.1-8B-INSTRUCT",
        "/models/Llama-3.1-8B-Instruct/",
        "meta-llama/Llama-3.1-8B",
    ):
        assert database_model(model_id, spec) == DB_LLAMA, model_id
    assert database_model("meta-llama/Llama-3.1-70B-Instruct") == "meta-llama/Meta-Llama-3.1-70B"
    assert database_model("meta-llama/Llama-3.1-70B-Instruct", spec) is None  # shape differs
    assert database_model("Qwen/Qwen3-32B") == "Qwen/Qwen3-32B"
    assert database_model("acme/house-model") is None


def test_unknown_model_name_uses_the_specs_config(spec: ModelSpec, h200: ServiceModel) -> None:
    house = service_model(
        gpu_product="NVIDIA-H200", model_id="acme/house-llama", spec=spec, max_context=MAX_CONTEXT
    )
    assert not house.fallback
    assert f"config {spec.source}" in house.source
    np.testing.assert_allclose(house.tables.decode_s, h200.tables.decode_s, rtol=1e-9)
    np.testing.assert_allclose(house.tables.prefill_s, h200.tables.prefill_s, rtol=1e-9)


def test_unknown_model_without_config_falls_back(spec: ModelSpec) -> None:
    inline = dataclasses.replace(spec, source="<inline spec>")
    model = service_model(
        gpu_product="NVIDIA-H200", model_id="acme/house-llama", spec=inline, max_context=8192
    )
    assert model.fallback
    assert model.source.startswith("roofline fallback (NVIDIA-H200: 989 TFLOP/s bf16, 4800 GB/s")
    assert "'<inline spec>' is not a readable file" in model.source


def test_gpu_without_database_data_uses_the_roofline(spec: ModelSpec) -> None:
    l4 = service_model(gpu_product="NVIDIA-L4", model_id=LLAMA_ID, spec=spec, max_context=8192)
    assert l4.fallback
    assert l4.source.startswith("roofline fallback (NVIDIA-L4: 121 TFLOP/s bf16, 300 GB/s;")
    assert "no vLLM data for L4 in aiconfigurator-core" in l4.source
    flops, bandwidth = 121e12, 300e9
    params, weights = spec.param_count, spec.param_count * 2
    kv_per_token = 8 * 2 * 128 * 2 * 32  # kv heads x (K+V) x head_dim x bf16 x layers
    assert float(l4.prefill_s(2048)) == pytest.approx(
        2 * params * 2048 / (flops * MFU) + weights / bandwidth
    )
    assert float(l4.decode_step_s(32, 2048)) == pytest.approx(
        (weights + 32 * 2048 * kv_per_token) / (bandwidth * MBU) + 2 * params * 32 / (flops * MFU)
    )
    tp2 = service_model(
        gpu_product="NVIDIA-L4", model_id=LLAMA_ID, spec=spec, tp=2, max_context=8192
    )
    assert float(tp2.decode_step_s(1, 2048)) == pytest.approx(
        float(l4.decode_step_s(1, 2048)) / 2, rel=1e-6
    )
    a10g = service_model(gpu_product="NVIDIA-A10G", model_id=LLAMA_ID, spec=spec, max_context=8192)
    assert float(a10g.prefill_s(2048)) > float(l4.prefill_s(2048)) / 2  # 70 vs 121 TFLOP/s


def test_roofline_calibration_against_the_database(spec: ModelSpec, h200: ServiceModel) -> None:
    """The ratios the module docstring states (roofline / database, Llama-3.1-8B on H200)."""
    roof = roofline_model(
        gpu_product="NVIDIA-H200", model_id=LLAMA_ID, spec=spec, max_context=MAX_CONTEXT
    )
    assert roof.fallback and "requested" in roof.source

    def prefill(n: int) -> float:
        return float(roof.prefill_s(n) / h200.prefill_s(n))

    def decode(b: int, c: int) -> float:
        return float(roof.decode_step_s(b, c) / h200.decode_step_s(b, c))

    assert prefill(512) == pytest.approx(1.74, abs=0.03)
    assert prefill(2048) == pytest.approx(1.61, abs=0.03)
    assert prefill(8192) == pytest.approx(1.35, abs=0.03)
    assert prefill(32768) == pytest.approx(0.96, abs=0.03)
    assert decode(1, 2048) == pytest.approx(1.00, abs=0.03)
    assert decode(32, 2048) == pytest.approx(1.15, abs=0.03)
    assert decode(128, 2048) == pytest.approx(1.38, abs=0.03)
    assert decode(512, 2048) == pytest.approx(1.40, abs=0.03)
    assert decode(32, 32768) == pytest.approx(1.29, abs=0.03)
    assert decode(128, 32768) == pytest.approx(1.35, abs=0.03)


def test_database_log_noise_is_filtered(
    h200: ServiceModel, caplog: pytest.LogCaptureFixture
) -> None:
    database = logging.getLogger("aiconfigurator_core.sdk.perf_database")
    lanes = logging.getLogger("aiconfigurator_core.sdk.attention_lanes")
    with caplog.at_level(logging.WARNING):
        database.warning("Loading low-fidelity fallback rows for %s from %s. Queries", "t", "p")
        lanes.warning("resolve_attention_lane_order: no entry for sm_version=%d", 89)
        database.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


def test_bad_arguments_raise(spec: ModelSpec) -> None:
    with pytest.raises(ServiceTimeError, match="tp"):
        service_model(gpu_product="NVIDIA-H200", model_id=LLAMA_ID, spec=spec, tp=0, max_context=8)

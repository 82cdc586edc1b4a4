"""The model configs gpupool ships (policy/models/): each loads with the loader `validate`
uses, has the published size, and is named with its source and licence in the README."""

from __future__ import annotations

import json

import pytest

from runtime.init.catalog import MODELS, MODELS_DIR, ModelEntry, find_gpu, find_model
from runtime.vllm import load_model_spec

PUBLISHED_PARAMETERS = {
    # billions, as each model card states them
    "meta-llama/Llama-3.1-8B-Instruct": 8.03,
    "meta-llama/Llama-3.1-70B-Instruct": 70.6,
    "Qwen/Qwen2.5-7B-Instruct": 7.61,
    "Qwen/Qwen2.5-72B-Instruct": 72.7,
    "mistralai/Mistral-7B-Instruct-v0.3": 7.25,
    "microsoft/Phi-3-mini-4k-instruct": 3.8,
    "deepseek-ai/DeepSeek-V2-Lite": 15.7,
}


def test_the_catalogue_is_the_folder() -> None:
    assert sorted(m.file for m in MODELS) == sorted(p.name for p in MODELS_DIR.glob("*.json"))
    assert sorted(PUBLISHED_PARAMETERS) == sorted(m.hf_id for m in MODELS)


@pytest.mark.parametrize("entry", MODELS, ids=lambda m: m.stem)
def test_each_config_is_the_published_architecture(entry: ModelEntry) -> None:
    spec = load_model_spec(entry.path)
    billions = spec.param_count / 1e9
    assert billions == pytest.approx(PUBLISHED_PARAMETERS[entry.hf_id], rel=0.02)
    document = json.loads(entry.path.read_text())
    assert document["_name_or_path"] == entry.hf_id
    assert document["_source"].startswith(f"{entry.hf_id} config.json")
    assert spec.dtype == "bfloat16"
    assert find_model(entry.hf_id) == find_model(entry.stem) == entry


def test_deepseek_v2_lite_keeps_its_mla_and_moe_fields() -> None:
    entry = find_model("deepseek-ai/DeepSeek-V2-Lite")
    assert entry is not None
    spec = load_model_spec(entry.path)
    assert spec.mla is not None
    assert (spec.mla.kv_lora_rank, spec.mla.qk_rope_head_dim) == (512, 64)
    document = json.loads(entry.path.read_text())
    assert (document["n_routed_experts"], document["num_experts_per_tok"]) == (64, 6)
    assert document["q_lora_rank"] is None


def test_the_readme_names_each_source_and_licence() -> None:
    readme = (MODELS_DIR / "README.md").read_text()
    assert "no weights" in readme
    rows = {line.split("|")[1].strip(" `"): line for line in readme.splitlines() if "| `" in line}
    for entry in MODELS:
        row = rows[entry.file]
        assert f"`{entry.hf_id}`" in row and entry.licence in row
        assert ("gated" in row) == entry.gated


def test_gpu_names_resolve_to_product_labels() -> None:
    a100 = find_gpu("a100")
    assert a100 is not None and a100.label == "NVIDIA-A100-SXM4-80GB"
    assert find_gpu("NVIDIA-H100-80GB-HBM3") == find_gpu("H100") == find_gpu("nvidia-h100")
    h200 = find_gpu("H200")
    assert h200 is not None and h200.memory_gib == 140.4  # 143771 MiB = 140.40 GiB, rounded down
    assert find_gpu("B300") is None

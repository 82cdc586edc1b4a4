"""config.json parsing: shapes and parameter counts of published models, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.vllm import MlaDims, ModelConfigError, load_model_spec
from tests.vllm.conftest import MODELS, model


def test_llama_3_8b_shapes_and_parameters() -> None:
    spec = model("llama-3-8b")
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads) == (32, 32, 8)
    assert (spec.head_dim, spec.mla, spec.dtype, spec.dtype_bytes) == (128, None, "bfloat16", 2)
    # embeddings + lm_head: 2 x 128256 x 4096 = 1,050,673,152
    # per layer: q,o 2 x 4096 x 4096 + k,v 2 x 4096 x 1024 + MLP 3 x 4096 x 14336
    #          = 33,554,432 + 8,388,608 + 176,160,768 = 218,103,808; x 32 = 6,979,321,856
    assert spec.param_count == 1_050_673_152 + 6_979_321_856  # Meta publishes "8B" (8.03 B)


def test_llama_3_70b_parameters() -> None:
    spec = model("llama-3-70b")
    # embeddings 2 x 128256 x 8192 = 2,101,346,304; per layer 2 x 8192^2 + 2 x 8192 x 1024
    # + 3 x 8192 x 28672 = 134,217,728 + 16,777,216 + 704,643,072 = 855,638,016; x 80
    assert spec.param_count == 2_101_346_304 + 80 * 855_638_016  # published 70.6 B
    assert spec.kv_heads_per_rank(4) == 2
    assert spec.kv_heads_per_rank(8) == 1
    assert spec.kv_heads_per_rank(16) == 1  # vLLM replicates KV heads beyond their count


def test_qwen2_7b_head_dim_from_hidden_size() -> None:
    spec = model("qwen2-7b")
    assert spec.head_dim == 3584 // 28 == 128  # no head_dim field: hidden / heads
    assert spec.num_kv_heads == 4
    assert round(spec.param_count / 1e9, 1) == 7.6  # Qwen publishes 7.6 B (biases left out)


def test_deepseek_v2_lite_is_mla_with_one_latent_per_token() -> None:
    spec = model("deepseek-v2-lite")
    assert spec.mla == MlaDims(kv_lora_rank=512, qk_rope_head_dim=64)
    assert spec.kv_width == 576
    assert spec.kv_heads_per_rank(1) == spec.kv_heads_per_rank(8) == 1
    assert round(spec.param_count / 1e9, 1) == 15.7  # DeepSeek publishes 15.7 B total


def _write(tmp_path: Path, **changes: object) -> Path:
    document = json.loads((MODELS / "llama-3-8b.json").read_text())
    for key, value in changes.items():
        if value is None:
            document.pop(key)
        else:
            document[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers: required field is missing"),
        ({"num_key_value_heads": 0}, "num_key_value_heads: expected a positive integer, found 0"),
        ({"torch_dtype": "int4"}, "torch_dtype: unknown dtype 'int4'"),
        ({"torch_dtype": None}, "dtype: required field is missing"),
        ({"hidden_size": "4096"}, "hidden_size: expected a positive integer, found '4096'"),
        ({"architectures": []}, "architectures: expected a non-empty list"),
    ],
)
def test_bad_config_names_file_and_field(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    path = _write(tmp_path, **changes)
    with pytest.raises(ModelConfigError) as error:
        load_model_spec(tmp_path)  # a directory holding config.json works too
    assert str(error.value).startswith(str(path))
    assert message in str(error.value)


def test_unreadable_config(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="file not found"):
        load_model_spec(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"hidden_size": 1,\n')
    with pytest.raises(ModelConfigError, match=r"broken.json: <file>: invalid JSON at line 2"):
        load_model_spec(broken)

"""``gpupool vllm-args`` and ``gpupool kv-report`` driven through typer's CliRunner."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policy import DEFAULT_POLICY, load_policy
from runtime.cli.app import app
from runtime.cli.vllm_commands import parse_memory
from runtime.vllm import load_model_spec, serve_args
from tests.vllm.conftest import MODELS
from tests.vllm.test_waste import AZURE_CODE

runner = CliRunner()


def test_vllm_args_json_is_serve_args_of_the_policy() -> None:
    result = runner.invoke(app, ["vllm-args", "--json"])
    assert result.exit_code == 0, result.output
    policy = load_policy(DEFAULT_POLICY)
    workload = policy.workloads[0]
    model = load_model_spec(DEFAULT_POLICY.parent / workload.hf_config)
    assert json.loads(result.stdout) == serve_args(policy, workload, model)


def test_vllm_args_table_explains_the_numbers() -> None:
    result = runner.invoke(
        app,
        [
            "vllm-args",
            "--model",
            str(MODELS / "llama-3-70b.json"),
            "--tp",
            "8",
            "--gpu-memory",
            "140G",
            "--backend",
            "triton",
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "4096 B/page is NOT expressible" in result.stdout
    assert "TRITON_ATTN" in result.stdout
    assert "172,032" in result.stdout  # KV blocks, hand-computed in test_plan.py
    args = shlex.split(result.stdout.strip().splitlines()[-1])
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--block-size") + 1] == "16"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "cpu", "--gpu-memory", "lots"], "expected a size such as 141G"),
        (["--backend", "tpu"], "--backend 'tpu' is unknown"),
        (["--backend", "flashmla"], "'flashmla' cannot serve a standard-attention"),
        (["--tp", "1", "--model", str(MODELS / "llama-3-70b.json")], "exceed the 140.00 GiB GPU"),
        (["--workload", "nope"], "workload 'nope' not found"),
    ],
)
def test_vllm_args_bad_input_is_one_clear_line(argv: list[str], message: str) -> None:
    result = runner.invoke(app, ["vllm-args", *argv], env={"COLUMNS": "300"})
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output


def test_vllm_args_missing_config_field(tmp_path: Path) -> None:
    document = json.loads((MODELS / "qwen2-7b.json").read_text())
    del document["num_attention_heads"]
    (tmp_path / "config.json").write_text(json.dumps(document))
    result = runner.invoke(app, ["vllm-args", "--model", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "config.json: num_attention_heads: required field is missing" in result.output


def test_parse_memory_follows_vllm_units() -> None:
    assert parse_memory("141G") == parse_memory("141Gi") == 141 * 2**30
    assert parse_memory("141g") == 141 * 10**9
    assert parse_memory("512M") == 512 * 2**20
    assert parse_memory("1024") == 1024


def test_kv_report_on_the_azure_trace() -> None:
    result = runner.invoke(app, ["kv-report", "--trace", str(AZURE_CODE)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "paged, block 16 (chosen)" in result.stdout
    assert "paged, block 8 (backend refuses)" in result.stdout
    assert "meets the 2% goal" in result.stdout
    assert "1,000 requests" in result.stdout


def test_kv_report_bad_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,5\n")
    result = runner.invoke(app, ["kv-report", "--trace", str(trace)], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert f"{trace}:2: expected 3 columns" in result.output


def test_unknown_kv_cache_dtype_is_a_policy_error(tmp_path: Path) -> None:
    text = DEFAULT_POLICY.read_text().replace("cache_dtype: auto", "cache_dtype: fp4")
    assert "cache_dtype: fp4" in text
    bad = tmp_path / "pool.yaml"
    bad.write_text(text)
    result = runner.invoke(app, ["vllm-args", "--policy", str(bad)], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert f"{bad}:" in result.output
    assert "kv_cache.cache_dtype" in result.output
    assert "'fp4'" in result.output

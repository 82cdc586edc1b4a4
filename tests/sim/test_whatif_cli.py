"""``gpupool whatif`` and ``demo`` as a user runs them: outputs, refs, and bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policy import DEFAULT_POLICY
from runtime.cli.app import app
from runtime.sim.markdown import MARKER
from runtime.sim.output import PLOTS

runner = CliRunner()


def _policy_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "policy"
    shutil.copytree(DEFAULT_POLICY.parent / "models", folder / "models")
    shutil.copy(DEFAULT_POLICY, folder / "pool.yaml")
    return folder / "pool.yaml"


def test_whatif_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "whatif",
            "--policy",
            str(_policy_copy(tmp_path)),
            "--hours",
            "1",
            "--json",
            str(out / "r.json"),
            "--plots",
            str(out),
            "--markdown",
            str(out / "r.md"),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "r.json").read_text())
    assert data["pooled"]["hours"] == 1.0 and data["useful_gpu_h_ratio"] > 0
    assert data["useful_gpu_h_ratio"] == pytest.approx(
        data["pooled"]["useful_gpu_h"] / data["fixed"]["useful_gpu_h"]
    )
    assert "tuner" not in data  # only with --tuner
    text = (out / "r.md").read_text()
    assert "Tuner in the loop" not in text and "Tuner in the loop" not in result.output
    assert "x cluster useful GPU-hours** (pooled" in text and "aiconfigurator-core" in text
    assert "useful tokens/s" not in text and "useful tokens/s" not in result.output
    tier = data["pooled"]["kv_tier"]
    assert (tier["kv_preservation"], tier["served_with_tier"]) == ("off", False)
    assert "KV snapshot tier: this policy has `kv_cache.kv_preservation: off`" in text
    (first,) = [line for line in text.splitlines() if "first minute after an eviction" in line]
    assert ("with the snapshot tier" in first) != ("n/a: " in first)
    assert {p.name for p in out.glob("*.png")} == set(PLOTS)
    # the report sits in the plots' folder: its links are bare file names, not cwd paths
    assert "![gpus_held](gpus_held.png)" in text and str(out) not in text


@pytest.mark.process
def test_base_and_head_refs_give_one_pr_comment(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    policy = _policy_copy(repo)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    text = policy.read_text()
    assert "reserve_ratio: 0.20 " in text
    policy.write_text(text.replace("reserve_ratio: 0.20 ", "reserve_ratio: 0.30 "))
    subprocess.run([*git, "commit", "-qam", "head"], check=True)
    comment = tmp_path / "comment.md"
    result = runner.invoke(
        app,
        [
            "whatif",
            "--repo",
            str(repo),
            "--base",
            "HEAD~1",
            "--head",
            "HEAD",
            "--hours",
            "1",
            "--markdown",
            str(comment),
            "--plots",
            str(tmp_path / "plots"),
        ],
    )
    assert result.exit_code == 0, result.output
    text = comment.read_text()
    assert text.startswith(MARKER) and "`HEAD~1` -> `HEAD`" in text
    # plots named from the comment's folder (as the CI artifact holds them), not the cwd's
    assert "Plot: `plots/head-gpus_held.png`" in text
    assert "harvested GPU-h" in text and len(text) < 65_000
    assert "Head: **" in text and "x cluster useful GPU-hours** (pooled" in text
    assert "| pooled / fixed useful GPU-h |" in text and "| goal: harvest efficiency" in text
    assert text.count("KV snapshot tier: this policy has") == 2  # base and head


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("value,timestamp_anon,container_ip\n50,60,a\nx,120,a\n", ":3: value:"),
        ("when,gpus\n1,2\n", ":1:"),
        ("value,timestamp_anon,container_ip\n", "expected at least one data row"),
    ],
)
def test_bad_production_trace_is_one_line_and_writes_nothing(
    tmp_path: Path, content: str, message: str
) -> None:
    trace = tmp_path / "prod.csv"
    trace.write_text(content)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["whatif", "--prod-trace", str(trace), "--json", str(out / "r.json"), "--plots", str(out)],
    )
    assert result.exit_code == 1
    assert message in result.output and "prod.csv" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_production_larger_than_the_cluster_is_refused_with_the_minute(tmp_path: Path) -> None:
    trace = tmp_path / "demand.csv"
    trace.write_text("timestamp,gpus_demanded\n0,10\n60,10\n120,500\n180,10\n")
    result = runner.invoke(
        app, ["whatif", "--prod-trace", str(trace), "--production-rule", "held", "--hours", "0.1"]
    )
    assert result.exit_code == 1
    assert "at minute 2 production holds 500 GPUs" in result.output
    assert "--fit-production" in result.output
    fitted = runner.invoke(
        app,
        [
            "whatif",
            "--prod-trace",
            str(trace),
            "--production-rule",
            "held",
            "--hours",
            "0.1",
            "--fit-production",
        ],
    )
    assert fitted.exit_code == 0, fitted.output


def test_a_refused_policy_never_replays(tmp_path: Path) -> None:
    policy = _policy_copy(tmp_path)
    text = policy.read_text()
    assert "shed_while_production_above: 0.65" in text
    policy.write_text(
        text.replace("shed_while_production_above: 0.65", "shed_while_production_above: 0.2")
    )
    out = tmp_path / "out"
    result = runner.invoke(app, ["whatif", "--policy", str(policy), "--plots", str(out)])
    assert result.exit_code == 1
    assert "pool.yaml:" in result.output and "grow_while_production_below" in result.output
    assert not out.exists()


def test_unknown_gpu_model_is_one_line(tmp_path: Path) -> None:
    policy = _policy_copy(tmp_path)
    policy.write_text(policy.read_text().replace("gpu_model: NVIDIA-H200", "gpu_model: Acme-X1"))
    result = runner.invoke(app, ["whatif", "--policy", str(policy), "--hours", "0.1"])
    assert result.exit_code == 1
    assert "Acme-X1" in result.output and "Traceback" not in result.output

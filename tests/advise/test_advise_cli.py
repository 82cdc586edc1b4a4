"""``gpupool advise`` as a user runs it: a sweep whose answer is known, and bad input.

The production trace is flat and light (8 GPUs held at 30 % duty for 2 h), with a flex
backlog: lending gpu-prod's idle GPUs clearly pays, and a large reserve clearly costs flex
GPUs production never uses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policy import DEFAULT_POLICY, load_policy
from runtime.advise.folder import MARKER
from runtime.cli.app import app

runner = CliRunner()
SWEEP = [
    "--vary",
    "gpu-prod.lend_idle=true,false",
    "--vary",
    "gpu-prod.reserve_ratio=0,0.5",
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the shipped policy beside its model configs, and the production trace."""
    root = tmp_path_factory.mktemp("advise")
    folder = root / "policy"
    shutil.copytree(DEFAULT_POLICY.parent / "models", folder / "models")
    shutil.copy(DEFAULT_POLICY, folder / "pool.yaml")
    rows = ["timestamp,gpus_demanded,duty_cycle", *(f"{i * 60},8,0.3" for i in range(121))]
    trace = root / "production.csv"
    trace.write_text("\n".join(rows) + "\n")
    return folder / "pool.yaml", trace


def _advise(inputs: tuple[Path, Path], out: Path, *extra: str) -> tuple[int, str]:
    policy, trace = inputs
    args = ["advise", "--policy", str(policy), "--prod-trace", str(trace)]
    args += ["--backlog", "azure-code", "--hours", "2", "--jobs", "2", "--out", str(out)]
    result = runner.invoke(app, [*args, *extra])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def swept(inputs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("swept") / "advice"
    code, output = _advise(inputs, out, *SWEEP)
    assert code == 0, output
    return out


def test_lending_dominates_and_the_large_reserve_is_not_picked(swept: Path) -> None:
    data = json.loads((swept / "advise.json").read_text())
    by_name = {v["name"]: v for v in data["variants"]}
    assert set(by_name) == {
        "current",
        "gpu-prod.reserve_ratio=0",
        "gpu-prod.reserve_ratio=0.5",
        "gpu-prod.lend_idle=false, gpu-prod.reserve_ratio=0",
        "gpu-prod.lend_idle=false, gpu-prod.reserve_ratio=0.5",
    }
    harvest = {n: v["summary"]["harvested_gpu_h"] for n, v in by_name.items()}
    lending = [harvest["gpu-prod.reserve_ratio=0"], harvest["current"]]
    lent_not = [harvest["gpu-prod.lend_idle=false, gpu-prod.reserve_ratio=0"]]
    assert min(lending) > 1.5 * max(lent_not)
    assert harvest["gpu-prod.reserve_ratio=0.5"] < harvest["current"] < lending[0]
    assert data["recommended"] == "gpu-prod.reserve_ratio=0"
    assert by_name["gpu-prod.reserve_ratio=0"]["on_front"] is True
    assert by_name["gpu-prod.reserve_ratio=0.5"]["on_front"] is False


def test_the_folder_holds_the_table_plot_and_a_policy_that_validates(
    swept: Path, inputs: tuple[Path, Path]
) -> None:
    names = {p.relative_to(swept).as_posix() for p in swept.rglob("*") if p.is_file()}
    assert names == {
        MARKER,
        "advise.md",
        "advise.json",
        "pareto.png",
        "recommended.yaml",
        "recommended.diff",
        "models/llama-3.1-8b-instruct.json",
    }
    assert (swept / "pareto.png").read_bytes().startswith(b"\x89PNG")
    table = (swept / "advise.md").read_text()
    assert "Recommended: gpu-prod.reserve_ratio=0: harvested" in table
    assert "![harvest against production harm](pareto.png)" in table
    assert "Front: the current policy is NOT on the Pareto front of its sweep: " in table
    original = inputs[0].read_text().splitlines()
    edited = (swept / "recommended.yaml").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, edited, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith("    reserve_ratio: 0 ")
    result = runner.invoke(app, ["validate", str(swept / "recommended.yaml")])
    assert result.exit_code == 0, result.output
    assert load_policy(swept / "recommended.yaml").prod_pool.reserve_ratio == 0


def test_an_invalid_variant_is_reported_and_the_rest_replayed(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code, output = _advise(inputs, out, "--vary", "gpu-prod.reserve_ratio=0.1,1.5")
    assert code == 0, output
    assert "not replayed: gpu-prod.reserve_ratio=1.5: invalid:" in " ".join(output.split())
    data = json.loads((out / "advise.json").read_text())
    replayed = [v["name"] for v in data["variants"] if v["summary"] is not None]
    assert replayed == ["current", "gpu-prod.reserve_ratio=0.1"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--vary", "gpu-prod.reserve_rato=0.1"], "did you mean 'reserve_ratio'?"),
        (["--vary", "gpu-big.max_nodes=2"], "the policy has no field 'gpu-big'"),
        (["--vary", "gpu-prod.reserve_ratio"], "expected FIELD=V1,V2"),
        (
            ["--vary", "gpu-prod.reserve_ratio=0,0.1,0.3", "--max-variants", "3"],
            "the sweep has 4 variants, over --max-variants 3",
        ),
        (["--budget-s", "1"], "did not finish in 1 s; raise --budget-s"),
        (["--target", "eks"], "--target must be labels or karpenter"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    inputs: tuple[Path, Path], tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "out"
    code, output = _advise(inputs, out, *extra)
    assert code != 0
    assert message in " ".join(output.split()), output
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no staging sibling either


def test_a_folder_holding_other_files_is_refused_before_the_sweep(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, output = _advise(inputs, out, *SWEEP)
    assert code != 0
    assert "holds files gpupool did not write (notes.txt)" in " ".join(output.split())
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.heavy
def test_a_second_run_replaces_its_own_folder(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    for values in ("0.1", "0.05"):
        code, output = _advise(inputs, out, "--vary", f"gpu-prod.reserve_ratio={values}")
        assert code == 0, output
    data = json.loads((out / "advise.json").read_text())
    assert [v["name"] for v in data["variants"]] == ["current", "gpu-prod.reserve_ratio=0.05"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.heavy
def test_variants_the_budget_does_not_reach_are_listed(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    """600 variants on one process cannot finish in 20 s (a 2 h replay of the shipped
    cluster takes a tenth of a second at the least, once the worker has loaded the model);
    the baseline does, and every variant is accounted for."""
    values = ",".join(f"{0.2 + i / 2000:.4f}" for i in range(1, 601))
    out = tmp_path / "out"
    code, output = _advise(
        inputs,
        out,
        "--vary",
        f"grow_while_production_below={values}",
        "--max-variants",
        "1000",
        "--jobs",
        "1",
        "--budget-s",
        "20",
    )
    assert code == 0, output
    data = json.loads((out / "advise.json").read_text())
    assert len(data["variants"]) == 600  # 0.35, the current value, is the current policy
    missed = [v for v in data["variants"] if v["problem"] is not None]
    assert missed, "every variant finished: the test no longer exercises the budget"
    assert all(v["problem"] == "not reached in the 20 s budget" for v in missed)
    assert data["variants"][0]["summary"] is not None

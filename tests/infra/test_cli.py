"""``render``, ``diff``, ``demo`` and the bad-input contract of ``validate``/``render``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from infra.output import MANIFEST
from infra.render import ADAPTER_DIR, KUSTOMIZATION, PRODUCTION_DIR
from policy import DEFAULT_POLICY
from runtime.cli.app import app
from tests.infra.policies import edited

runner = CliRunner()


def write_policy(tmp_path: Path, doc: Any, name: str = "pool.yaml") -> Path:
    """A policy file beside a copy of the model configs it names."""
    path = tmp_path / name
    with path.open("w") as fh:
        YAML(typ="rt").dump(doc, fh)
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    for config in (DEFAULT_POLICY.parent / "models").iterdir():
        (models / config.name).write_text(config.read_text())
    return path


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_render_writes_every_object_and_is_deterministic(tmp_path: Path) -> None:
    out = tmp_path / "build"
    first = runner.invoke(app, ["render", str(DEFAULT_POLICY), "--out", str(out)])
    assert first.exit_code == 0, first.output
    before = _tree(out)
    assert "gpupool-flex/deployment-llama-8b-flex.yaml" in before
    assert KUSTOMIZATION in before and MANIFEST in before
    second = runner.invoke(app, ["render", str(DEFAULT_POLICY), "--out", str(out)])
    assert second.exit_code == 0
    assert _tree(out) == before
    assert f"{len(before) - 1} unchanged" in second.output


def test_render_karpenter_target_and_stale_cleanup(tmp_path: Path) -> None:
    out = tmp_path / "build"
    assert runner.invoke(app, ["render", "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["render", "--out", str(out), "--target", "karpenter"])
    assert result.exit_code == 0, result.output
    assert (out / "_cluster/nodepool-gpu-flex.yaml").is_file()
    assert not (out / "_cluster/node-gpupool-worker2.yaml").exists()
    assert "2 stale removed" in result.output


def test_render_rejects_an_unknown_target(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", "--out", str(tmp_path), "--target", "gke"])
    assert result.exit_code != 0
    assert not any(tmp_path.iterdir())


def test_diff_prints_object_level_changes(tmp_path: Path) -> None:
    old = write_policy(tmp_path, edited(), "old.yaml")
    new = write_policy(
        tmp_path, edited({"autoscaling.scale_down_stabilization_s": 600}), "new.yaml"
    )
    result = runner.invoke(app, ["diff", str(old), str(new)])
    assert result.exit_code == 0, result.output
    # the HPA, and the policy copy the compaction sidecars read (it restates the whole policy)
    assert result.output.startswith("0 added, 0 removed, 2 changed\n")
    assert "~ gpupool-flex/horizontalpodautoscaler-llama-8b-flex.yaml" in result.output
    assert "~ gpupool-flex/configmap-gpupool-policy.yaml" in result.output
    assert "-      stabilizationWindowSeconds: 300" in result.output
    assert "+      stabilizationWindowSeconds: 600" in result.output
    assert runner.invoke(app, ["diff", str(old), str(new), "--exit-code"]).exit_code == 1
    same = runner.invoke(app, ["diff", str(old), str(old), "--exit-code"])
    assert (same.exit_code, same.output) == (0, "no differences\n")


@pytest.mark.heavy
def test_demo_validates_renders_and_summarises(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    # Objects only: the kustomizations, the prometheus-adapter fragment and the production
    # Component's values are not objects.
    files = [
        p
        for p in tmp_path.rglob("*.yaml")
        if p.name != "kustomization.yaml" and not {ADAPTER_DIR, PRODUCTION_DIR} & set(p.parts)
    ]
    assert (tmp_path / ADAPTER_DIR / "values.yaml").is_file()
    for word in ("gpu-prod", "gpu-flex", "gpupool-idle-inference", "llama-8b-flex"):
        assert word in result.output
    assert f"Objects ({len(files)})" in result.output
    assert "HPA up 180 s / down 300 s" in result.output
    assert (tmp_path / "gpupool-flex/horizontalpodautoscaler-llama-8b-flex.yaml").is_file()


_AUTO = next(ln for ln in DEFAULT_POLICY.read_text().splitlines() if "max_replicas: auto" in ln)
"""The shipped flex workload's ``max_replicas`` line (with its comment)."""
_MANY = _AUTO.replace("auto", "many", 1)

BAD_INPUTS = {
    "unknown key": (
        DEFAULT_POLICY.read_text().replace(
            "  name: demo-cluster\n", "  name: demo-cluster\n  bogus: 1\n"
        ),
        "  bogus: 1",
        "cluster.bogus: unknown field",
    ),
    "wrong type": (
        DEFAULT_POLICY.read_text().replace(_AUTO, _MANY),
        _MANY,
        "workloads.0.max_replicas: expected auto or a whole number of replicas from 1 to 5000, "
        "found 'many'",
    ),
    "invalid yaml": ("cluster:\n  name: [unclosed\nnode_pools: 1\n", None, "invalid YAML"),
}


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_located_line(tmp_path: Path, command: str, case: str) -> None:
    text, key_line, words = BAD_INPUTS[case]
    source = tmp_path / "pool.yaml"
    source.write_text(text)
    out = tmp_path / "build"
    args = [command, str(source)] + (["--out", str(out)] if command == "render" else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith(f"{source}:")]
    assert lines, result.output
    match = re.match(rf"{re.escape(str(source))}:(\d+): ", lines[0])
    assert match, lines[0]
    assert words in lines[0]
    if key_line is not None:  # a valid document with one bad field: exactly that line
        assert int(match.group(1)) == text.splitlines().index(key_line) + 1
        assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("command", ["validate", "render", "diff"])
def test_missing_file(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nope.yaml"
    args = [command, str(missing)] + ([str(missing)] if command == "diff" else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[0] == f"{missing}:0: file not found"
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize(
    ("hf_config", "named"),
    [("models/absent.json", "models/absent.json"), ("models/empty", "models/empty/config.json")],
    ids=["missing", "directory without config.json"],
)
def test_a_bad_model_config_points_at_the_workload(
    tmp_path: Path, command: str, hf_config: str, named: str
) -> None:
    """``validate`` runs the model-config checks ``render`` runs: the same line, exit 1."""
    source = write_policy(tmp_path, edited({"workloads.0.hf_config": hf_config}))
    (tmp_path / "models/empty").mkdir()
    out = tmp_path / "build"
    result = runner.invoke(
        app, [command, str(source), "--out", str(out)][: 4 if command == "render" else 2]
    )
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    field_line = source.read_text().splitlines().index(f"  hf_config: {hf_config}") + 1
    assert line.startswith(f"{source}:{field_line}: workloads.0.hf_config: ")
    assert f"{tmp_path / named}: <file>: file not found" in line
    assert not out.exists()


def _in_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The current directory is a policy repository whose policy differs from the default."""
    (tmp_path / "policy").mkdir()
    write_policy(tmp_path / "policy", edited({"autoscaling.scale_down_stabilization_s": 600}))
    monkeypatch.chdir(tmp_path)


REPOSITORY_NOTE = "policy: policy/pool.yaml (from the current directory)\n"
EXAMPLE_NOTE = f"policy: {DEFAULT_POLICY} (the packaged example, --example)\n"


def test_without_file_the_repository_policy_is_used_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _in_repository(tmp_path, monkeypatch)
    valid = runner.invoke(app, ["validate"])
    assert valid.exit_code == 0 and valid.stderr.startswith(REPOSITORY_NOTE)  # then warnings
    assert valid.stdout == "policy/pool.yaml: ok (2 node pools, 1 flex workloads)\n"
    rendered = runner.invoke(app, ["render", "--out", "build"])
    assert rendered.exit_code == 0 and rendered.stderr.startswith(REPOSITORY_NOTE)
    hpa = tmp_path / "build/gpupool-flex/horizontalpodautoscaler-llama-8b-flex.yaml"
    assert "stabilizationWindowSeconds: 600" in hpa.read_text()
    changed = runner.invoke(app, ["diff", str(DEFAULT_POLICY)])  # NEW: the repository's
    assert (changed.exit_code, changed.stderr) == (0, REPOSITORY_NOTE)
    assert "+      stabilizationWindowSeconds: 600" in changed.stdout


def test_without_file_outside_a_repository_only_example_reads_the_packaged_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside a policy repository nothing falls back to the packaged example (every command:
    tests/quickstart/test_one_policy.py); ``--example`` uses it and says so."""
    monkeypatch.chdir(tmp_path)
    refused = runner.invoke(app, ["validate"])
    assert refused.exit_code == 2 and "gpupool init" in refused.stderr
    valid = runner.invoke(app, ["validate", "--example"])
    assert valid.exit_code == 0 and valid.stderr.startswith(EXAMPLE_NOTE)
    assert valid.stdout.startswith(f"{DEFAULT_POLICY}: ok (")
    same = runner.invoke(app, ["diff", str(DEFAULT_POLICY), "--example"])
    assert (same.exit_code, same.stdout, same.stderr) == (0, "no differences\n", EXAMPLE_NOTE)
    named = runner.invoke(app, ["validate", str(DEFAULT_POLICY)])  # FILE given: no note
    assert "policy: " not in named.stderr


def test_an_unreadable_repository_policy_is_an_error_not_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``./policy/pool.yaml`` that exists but is no file is reported, never swapped for the
    packaged policy (which would validate ok and render the wrong cluster)."""
    (tmp_path / "policy/pool.yaml").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for args in (["validate"], ["render", "--out", "build"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1
        assert result.stderr.splitlines()[0] == REPOSITORY_NOTE.strip()
        assert result.stderr.splitlines()[1] == (
            "policy/pool.yaml:0: expected a regular file, found a directory"
        )
    assert not (tmp_path / "build").exists()


@pytest.mark.parametrize("command", ["validate", "render"])
def test_validate_and_render_print_warnings_located_and_still_accept(
    tmp_path: Path, command: str
) -> None:
    source = write_policy(tmp_path, edited({"cluster.runtime_image": "gpupool/gpupool:0.1.0"}))
    extra = ["--out", str(tmp_path / "build")] if command == "render" else []
    result = runner.invoke(app, [command, str(source), *extra])
    assert result.exit_code == 0, result.output
    image_line = source.read_text().splitlines().index("  runtime_image: gpupool/gpupool:0.1.0")
    assert (
        f"{source}:{image_line + 1}: warning: cluster.runtime_image: gpupool/gpupool:0.1.0 is "
        "referenced by tag only" in result.stderr
    )
    ok = f"{source}: ok (" if command == "validate" else f"{tmp_path / 'build'}: "
    assert result.stdout.startswith(ok)


def test_render_out_naming_a_file_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "build"
    target.write_text("mine\n")
    result = runner.invoke(app, ["render", str(DEFAULT_POLICY), "--out", str(target)])
    assert result.exit_code == 1
    assert result.output == (
        f"error: {target}: not a folder (this command writes a folder of files)\n"
    )
    assert target.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]


def test_render_and_diff_take_the_hpa_tolerance_stack_option(tmp_path: Path) -> None:
    """``--hpa-tolerance behavior`` renders per-HPA tolerance 0; ``diff`` shows exactly that."""
    hpa = "gpupool-flex/horizontalpodautoscaler-llama-8b-flex.yaml"
    for option, expected in (("cluster", False), ("behavior", True)):
        out = tmp_path / option
        result = runner.invoke(app, ["render", "--out", str(out), "--hpa-tolerance", option])
        assert result.exit_code == 0, result.output
        assert ("tolerance: '0'" in (out / hpa).read_text()) is expected
    same = runner.invoke(
        app, ["diff", str(DEFAULT_POLICY), str(DEFAULT_POLICY), "--hpa-tolerance", "behavior"]
    )
    assert same.exit_code == 0 and "no differences" in same.output
    refused = runner.invoke(app, ["render", "--out", str(tmp_path / "x"), "--hpa-tolerance", "0"])
    assert refused.exit_code != 0

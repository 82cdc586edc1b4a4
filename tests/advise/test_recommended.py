"""``recommended.yaml``: the owner's file with only the changed values edited, comments kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from policy import DEFAULT_POLICY, load_policy
from runtime.advise.levers import Variant, grid, parse_vary
from runtime.advise.recommended import DIFF, POLICY, RecommendedError, recommended_files
from runtime.tuner.yamledit import ValueEdit, YamlEditError, edit_values

SHIPPED = DEFAULT_POLICY.read_text()


def _value(line: str) -> str:
    """``key: value`` of a line, without indentation and comment."""
    return line.partition("#")[0].strip()


def _changed(before: str, after: str) -> list[tuple[str, str]]:
    pairs = zip(before.splitlines(), after.splitlines(), strict=True)
    return [(a, b) for a, b in pairs if a != b]


def test_values_are_replaced_where_they_stand_and_comments_stay() -> None:
    edits = [
        ValueEdit(("node_pools", 0, "reserve_ratio"), 0.05),
        ValueEdit(("node_pools", 0, "lend_idle"), False),
        ValueEdit(("node_pools", 1, "nodes"), ["gpupool-worker2", "gpu-node-7.example"]),
        ValueEdit(("workloads", 0, "max_replicas"), 12),
        ValueEdit(("cluster", "name"), "true"),  # a string that plain YAML would read as a bool
    ]
    out, document = edit_values(SHIPPED, edits)
    changed = _changed(SHIPPED, out)
    assert [(_value(a), _value(b)) for a, b in changed] == [
        ("name: demo-cluster", 'name: "true"'),
        ("reserve_ratio: 0.20", "reserve_ratio: 0.05"),
        ("lend_idle: true", "lend_idle: false"),
        ("nodes: [gpupool-worker2]", "nodes: [gpupool-worker2, gpu-node-7.example]"),
        ("max_replicas: auto", "max_replicas: 12"),
    ]
    for before, after in changed:  # a trailing comment stays, in its column
        assert before.partition("#")[1:] == after.partition("#")[1:]
        assert before.find("#") == after.find("#")
    assert document["cluster"]["name"] == "true"


def test_a_missing_key_gets_its_own_line_in_its_mapping_before_the_next_comment() -> None:
    slots = {"replicas": 2, "of": "inference/llama-70b-prod"}
    out, _ = edit_values(SHIPPED, [ValueEdit(("node_pools", 0, "reserve"), slots)])
    added = [line for line in out.splitlines() if line not in SHIPPED.splitlines()]
    assert added == ["    reserve: {replicas: 2, of: inference/llama-70b-prod}"]
    lines = out.splitlines()
    at = lines.index(added[0])
    assert lines[at - 1].startswith("    nodes: [gpupool-worker]")
    assert lines[at + 1].startswith("    # taints:")  # the comment of the next field stays below
    assert [line for line in SHIPPED.splitlines() if line.lstrip().startswith("#")] == [
        line for line in lines if line.lstrip().startswith("#")
    ]


def test_the_tuner_still_refuses_a_field_not_written() -> None:
    from runtime.tuner.proposals import Change
    from runtime.tuner.yamledit import edit_scalars

    with pytest.raises(YamlEditError, match="not written in the policy file"):
        edit_scalars(SHIPPED, [Change(("kv_cache", "no_such_field"), 1, 2)])


def test_a_value_spanning_lines_is_refused_not_mangled() -> None:
    text = "a:\n  b: [1,\n     2]\n  c: 3\n"
    with pytest.raises(YamlEditError, match="spans lines"):
        edit_values(text, [ValueEdit(("a", "b"), [3])])


def test_the_recommended_files_validate_beside_their_model_configs(tmp_path: Path) -> None:
    policy = load_policy()
    (variant,) = grid(policy, [parse_vary("gpu-prod.reserve_ratio=0.05")])[1:]
    files = recommended_files(DEFAULT_POLICY, policy, variant, target="labels")
    assert set(files) == {POLICY, DIFF, "models/llama-3.1-8b-instruct.json"}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    edited = load_policy(tmp_path / POLICY)
    assert edited.prod_pool.reserve_ratio == 0.05
    assert len(_changed(SHIPPED, files[POLICY].decode())) == 1
    diff = files[DIFF].decode()
    # the policy ConfigMap and the budget's recording rule (the reserve is a term of it)
    assert diff.startswith("0 added, 0 removed, 2 changed\n~ gpupool-flex/configmap-gpupool-policy")
    assert "-      reserve_ratio: 0.2" in diff and "+      reserve_ratio: 0.05" in diff
    assert "~ gpupool-system/prometheusrule-" in diff


def test_model_configs_outside_the_policy_folder_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "repo" / "policy"
    folder.mkdir(parents=True)
    shutil.copytree(DEFAULT_POLICY.parent / "models", tmp_path / "repo" / "models")
    text = SHIPPED.replace("hf_config: models/", "hf_config: ../models/")
    (folder / "pool.yaml").write_text(text)
    policy = load_policy(folder / "pool.yaml")
    with pytest.raises(RecommendedError, match="leaves the policy's folder"):
        recommended_files(folder / "pool.yaml", policy, Variant(()), target="labels")

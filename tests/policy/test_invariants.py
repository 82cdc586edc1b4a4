"""Each cross-field rule is a validation error naming the fields, the values and the line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from policy import DEFAULT_POLICY, PolicyError, load_policy
from tests.harness.policy_docs import set_path

yaml = YAML(typ="rt")


def _default() -> Any:
    return yaml.load(DEFAULT_POLICY.read_text())


def _write(doc: Any, tmp_path: Path) -> Path:
    out = tmp_path / "pool.yaml"
    with out.open("w") as fh:
        yaml.dump(doc, fh)
    return out


CASES = [
    (
        "elastic.shed_while_production_above",
        0.30,
        "elastic.grow_while_production_below",
        ["0.35", "0.3", "shed_while_production_above"],
    ),
    ("disruption.termination_grace_s", 35, "disruption.termination_grace_s", ["35", "= 40"]),
    ("disruption.termination_grace_s", 20, "disruption.termination_grace_s", ["30"]),
    (
        "disruption.prestop_delay_s",
        3,
        "disruption.prestop_delay_s",
        ["readiness_period_s (1)", "readiness_failure_threshold (3)", "= 3 s", "(3)", "SIGTERM"],
    ),
    (
        "disruption.readiness_period_s",
        2,
        "disruption.prestop_delay_s",
        ["readiness_period_s (2)", "= 6 s", "prestop_delay_s (5)"],
    ),
    ("priorities.training.value", 2000000, "priorities.production.value", ["1000000", "2000000"]),
    ("priorities.training.value", -5, "priorities.training.value", ["-5", "above 0"]),
    ("priorities.idle_inference.value", 0, "priorities.idle_inference.value", ["below 0"]),
    ("kv_cache.max_gpu_memory_share", 0.95, "kv_cache.max_gpu_memory_share", ["0.95", "0.08"]),
    (
        "disruption.pdb_min_available",
        8,
        "workloads.0.min_replicas",
        ["(1)", "(8)", "pdb_min_available", "best-effort"],
    ),
    ("workloads.0.pool", "gpu-prod", "workloads.0.pool", ["gpu-prod", "not a flex pool"]),
    ("workloads.0.gpus_per_replica", 16, "workloads.0.gpus_per_replica", ["16", "8"]),
    ("node_pools.1.role", "prod", "node_pools", ["exactly one", "found 2"]),
    ("node_pools.1.name", "gpu-prod", "node_pools.1.name", ["repeated"]),
    (
        "autoscaling.scale_down_stabilization_s",
        60,
        "autoscaling.scale_down_stabilization_s",
        ["60", "180"],
    ),
    (
        "alerting.routing.by_severity.critical",
        "nobody",
        "alerting.routing.by_severity.critical",
        ["nobody"],
    ),
    ("kv_cache.compaction_usage_below", 0.9, "kv_cache.compaction_usage_below", ["0.9", "0.8"]),
]


@pytest.mark.parametrize(("field", "value", "reported_path", "words"), CASES)
def test_invariant_rejected_precisely(
    tmp_path: Path, field: str, value: Any, reported_path: str, words: list[str]
) -> None:
    doc = _default()
    set_path(doc, field, value)
    source = _write(doc, tmp_path)
    with pytest.raises(PolicyError) as caught:
        load_policy(source)
    problems = [p for p in caught.value.problems if p.path == reported_path]
    assert problems, f"no problem at {reported_path}: {caught.value}"
    text = problems[0].message
    for word in words:
        assert word in text, text
    line = source.read_text().splitlines()[problems[0].line - 1]
    assert reported_path.split(".")[-1] in line, (problems[0].line, line)


def test_min_replicas_above_an_explicit_max_replicas_is_rejected(tmp_path: Path) -> None:
    """A number caps the workload: min_replicas above it is refused at min_replicas' line;
    with ``auto`` (the shipped value) the bound is what the pools hold, 96 here."""
    doc = _default()
    set_path(doc, "workloads.0.max_replicas", 8)
    set_path(doc, "workloads.0.min_replicas", 9)
    source = _write(doc, tmp_path)
    with pytest.raises(PolicyError) as caught:
        load_policy(source)
    (problem,) = [p for p in caught.value.problems if p.path == "workloads.0.min_replicas"]
    assert "(9)" in problem.message and "(8)" in problem.message, problem.message
    assert "min_replicas:" in source.read_text().splitlines()[problem.line - 1]

    set_path(doc, "workloads.0.max_replicas", "auto")
    policy = load_policy(_write(doc, tmp_path))
    assert policy.replica_bound(policy.workloads[0]) == 96


def test_every_problem_reported_at_once(tmp_path: Path) -> None:
    doc = _default()
    set_path(doc, "elastic.shed_while_production_above", 0.2)
    set_path(doc, "disruption.termination_grace_s", 31)
    set_path(doc, "kv_cache.bogus", 1)
    set_path(doc, "workloads.0.max_replicas", "many")
    with pytest.raises(PolicyError) as caught:
        load_policy(_write(doc, tmp_path))
    paths = {p.path for p in caught.value.problems}
    assert {
        "elastic.grow_while_production_below",
        "disruption.termination_grace_s",
        "kv_cache.bogus",
        "workloads.0.max_replicas",
    } <= paths


def test_line_numbers_point_at_the_key(tmp_path: Path) -> None:
    doc = _default()
    set_path(doc, "disruption.drain_s", "slow")
    source = _write(doc, tmp_path)
    with pytest.raises(PolicyError) as caught:
        load_policy(source)
    (problem,) = caught.value.problems
    line = source.read_text().splitlines()[problem.line - 1]
    assert line.strip().startswith("drain_s:")
    assert "'slow'" in problem.message
    assert str(problem).startswith(f"{source}:{problem.line}: disruption.drain_s: ")


def test_model_is_frozen() -> None:
    policy = load_policy()
    with pytest.raises(Exception, match="frozen"):
        policy.elastic.shed_while_production_above = 0.9  # type: ignore[misc]
    clone = copy.deepcopy(policy)
    assert clone == policy


@pytest.mark.parametrize(
    ("section", "old", "words"),
    [
        ("elastic", "scale_up_below", ["grow_while_production_below", "production"]),
        ("elastic", "shed_above", ["shed_while_production_above", "production"]),
        ("elastic", "idle_gpu_below", ["removed", "delete the line"]),
        ("elastic", "flex_target_utilization", ["removed"]),
        ("kv_cache", "compaction_worker_port", ["renamed kv_cache.compaction_sidecar_port"]),
    ],
)
def test_a_policy_from_before_the_rename_says_what_replaced_each_field(
    tmp_path: Path, section: str, old: str, words: list[str]
) -> None:
    doc = _default()
    doc[section][old] = 0.5
    source = _write(doc, tmp_path)
    with pytest.raises(PolicyError) as caught:
        load_policy(source)
    (problem,) = caught.value.problems
    assert problem.path == f"{section}.{old}"
    assert "unknown field" not in problem.message
    for word in words:
        assert word in problem.message, problem.message
    assert old in source.read_text().splitlines()[problem.line - 1]

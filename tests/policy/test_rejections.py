"""What render or the API server would reject is refused by validation, at its line.

One case per rule: an edit of the shipped policy, the field path the problem must name, and
the words that say what was expected. Each policy goes through ``infra.inputs.load_inputs``
(the gate of ``validate``, ``render``, ``diff`` and Pulumi) and through ``gpupool render``,
which must print the same located line and write nothing.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from infra.inputs import load_inputs
from policy import (
    DEFAULT_POLICY,
    PolicyError,
    Problem,
    load_policy,
    parse_policy,
    policy_warnings,
)
from policy.base import MAX_REPLICAS
from runtime.cli.app import app
from tests.harness.policy_docs import set_path

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
"""Published model configs (Qwen2-7B: 28 attention heads, 4 KV heads)."""

yaml = YAML(typ="rt")
runner = CliRunner()

Edit = Callable[[Any], None]


def _set(**edits: Any) -> Edit:
    """Set dotted paths (``workloads__0__port`` for ``workloads.0.port``)."""

    def apply(doc: Any) -> None:
        for path, value in edits.items():
            set_path(doc, path.replace("__", "."), value)

    return apply


def _second_workload(**fields: Any) -> Edit:
    def apply(doc: Any) -> None:
        second = copy.deepcopy(doc["workloads"][0])
        second.update(fields)
        doc["workloads"].append(second)

    return apply


def _write(doc: Any, directory: Path) -> Path:
    """The policy beside a copy of the shipped and the fixture model configs."""
    models = directory / "models"
    shutil.copytree(DEFAULT_POLICY.parent / "models", models, dirs_exist_ok=True)
    shutil.copy(MODELS / "qwen2-7b.json", models / "qwen2-7b.json")
    path = directory / "pool.yaml"
    with path.open("w") as fh:
        yaml.dump(doc, fh)
    return path


def _policy_file(edit: Edit, directory: Path) -> Path:
    doc = yaml.load(DEFAULT_POLICY.read_text())
    edit(doc)
    return _write(doc, directory)


CASES: list[tuple[str, Edit, str, list[str]]] = [
    (
        "tp-attention-heads",
        _set(workloads__0__hf_config="models/qwen2-7b.json", workloads__0__gpus_per_replica=8),
        "workloads.0.gpus_per_replica",
        ["tensor parallel 8", "28 attention heads", "expected one of [1, 2, 4]"],
    ),
    (
        "tp-kv-heads",
        _set(workloads__0__gpus_per_replica=3),
        "workloads.0.gpus_per_replica",
        ["8 KV heads", "expected one of [1, 2, 4, 8, 16]"],
    ),
    (
        "hf-config-missing",
        _set(workloads__0__hf_config="models/missing.json"),
        "workloads.0.hf_config",
        ["missing.json", "file not found", "expected a Hugging Face config.json"],
    ),
    (
        "hf-config-directory",
        _set(workloads__0__hf_config="models"),
        "workloads.0.hf_config",
        ["models/config.json", "file not found", "or a directory holding one"],
    ),
    (
        "gpu-too-small",
        _set(node_pools__1__gpu_memory_gib=8),
        "workloads.0.gpus_per_replica",
        ["exceed the 8.00 GiB GPU", "expected them to fit"],
    ),
    (
        "context-beyond-model",
        _set(workloads__0__max_model_len=200_000),
        "workloads.0.max_model_len",
        ["max_position_embeddings 131072", "expected at most 131072"],
    ),
    (
        "workload-beside-its-compaction-service",
        _second_workload(name="llama-8b-flex-kv-compaction", port=8001),
        "workloads.1.name",
        ["Service gpupool-flex/llama-8b-flex-kv-compaction", "expected distinct names"],
    ),
    (
        "derived-service-name-too-long",
        _set(workloads__0__name="a" * 50),
        "workloads.0.name",
        ["'" + "a" * 50 + "-kv-compaction'", "expected a workload name of at most 49"],
    ),
    (
        "node-in-two-pools",
        _set(node_pools__1__nodes=["gpupool-worker"]),
        "node_pools.1.nodes.0",
        ["'gpupool-worker'", "in pool 'gpu-prod' too", "expected each node once"],
    ),
    (
        "node-twice-in-a-pool",
        _set(node_pools__1__nodes=["gpupool-worker2", "gpupool-worker2"]),
        "node_pools.1.nodes.1",
        ["twice in this pool", "expected each node once"],
    ),
    (
        "one-namespace-for-both",
        _set(cluster__system_namespace="gpupool-flex"),
        "cluster.system_namespace",
        ["'gpupool-flex'", "expected two different namespaces"],
    ),
    (
        "service-name-starting-with-a-digit",
        _set(workloads__0__name="8b-llama"),
        "workloads.0.name",
        ["expected a Service name (DNS-1035 label", "starting with a letter", "'8b-llama'"],
    ),
    (
        "node-name-not-a-subdomain",
        _set(node_pools__1__nodes=["Worker_2"]),
        "node_pools.1.nodes.0",
        ["expected a DNS-1123 subdomain", "ip-10-0-1-23.ec2.internal", "'Worker_2'"],
    ),
    (
        "access-mode-free-string",
        _set(workloads__0__snapshot_volume__access_mode="rwx"),
        "workloads.0.snapshot_volume.access_mode",
        ["'ReadWriteOnce', 'ReadWriteMany' or 'ReadWriteOncePod'", "'rwx'"],
    ),
    (
        "empty-image",
        _set(workloads__0__image=""),
        "workloads.0.image",
        ["expected an image reference", "found ''"],
    ),
    (
        "vllm-port-is-the-sidecar-port",
        _set(workloads__0__port=9400),
        "workloads.0.port",
        ["port 9400", "compaction_sidecar_port", "expected a different port"],
    ),
    (
        "absurd-max-replicas",
        _set(workloads__0__max_replicas=1_000_000),
        "workloads.0.max_replicas",
        [f"expected auto or a whole number of replicas from 1 to {MAX_REPLICAS}", "1000000"],
    ),
    (
        "max-replicas-neither-auto-nor-a-number",
        _set(workloads__0__max_replicas="all"),
        "workloads.0.max_replicas",
        ["expected auto or a whole number", "found 'all'"],
    ),
    (
        "flex-pool-lends",
        _set(node_pools__1__lend_idle=True),
        "node_pools.1.lend_idle",
        ["a flex pool always serves flex workloads", "lend_idle is for prod pools"],
    ),
    (
        "slot-reserve-beside-a-ratio",
        _set(node_pools__0__reserve={"replicas": 2, "of": "inference/llama-70b-prod"}),
        "node_pools.0.reserve",
        ["give reserve", "or reserve_ratio (0.2", "not both"],
    ),
    (
        "slot-reserve-of-an-unknown-workload",
        _set(
            node_pools__0__reserve_ratio=0.0,
            node_pools__0__reserve={"replicas": 2, "of": "inference/llama-8b-prod"},
        ),
        "node_pools.0.reserve.of",
        [
            "'inference/llama-8b-prod' is not a production workload",
            "expected namespace/name of one of: inference/llama-70b-prod",
        ],
    ),
    (
        "slot-reserve-beyond-the-pool",
        _set(
            node_pools__0__reserve_ratio=0.0,
            node_pools__0__reserve={"replicas": 17, "of": "inference/llama-70b-prod"},
        ),
        "node_pools.0.reserve.replicas",
        ["17 slots of 4 GPUs do not fit", "(8 nodes x 2 slots)", "lower replicas"],
    ),
    (
        "absurd-production-max-replicas",
        _set(production__0__max_replicas=1_000_000),
        "production.0.max_replicas",
        [f"less than or equal to {MAX_REPLICAS}"],
    ),
    (
        "system-priority-class",
        _set(priorities__training__name="system-training"),
        "priorities.training.name",
        ["without the system- prefix", "'system-training'"],
    ),
    (
        "kube-namespace",
        _set(cluster__flex_namespace="kube-flex"),
        "cluster.flex_namespace",
        ["not default and not kube-*", "'kube-flex'"],
    ),
    (
        "default-namespace",
        _set(cluster__system_namespace="default"),
        "cluster.system_namespace",
        ["not default and not kube-*", "'default'"],
    ),
    (
        "pool-label-under-kubernetes-io",
        _set(cluster__pool_label="node.kubernetes.io/pool"),
        "cluster.pool_label",
        ["outside kubernetes.io, k8s.io, karpenter.sh", "NodeRestriction"],
    ),
    (
        "pool-label-under-k8s-io",
        _set(cluster__pool_label="k8s.io/pool"),
        "cluster.pool_label",
        ["outside kubernetes.io, k8s.io, karpenter.sh", "'k8s.io/pool'"],
    ),
    (
        "instance-label-not-a-prometheus-label",
        _set(metrics__instance_labels=["namespace", "pod-name"]),
        "metrics.instance_labels.1",
        ["expected a Prometheus label name", "'pod-name'"],
    ),
    (
        "rule-selector-label-key",
        _set(metrics__rule_selector_labels={"bad key!": "x"}),
        "metrics.rule_selector_labels.bad key!.[key]",
        ["expected a label key [PREFIX/]NAME", "'bad key!'"],
    ),
    (
        "pdb-blocks-every-drain",
        _set(disruption__pdb_min_available=1),
        "workloads.0.min_replicas",
        ["(1)", "expected pdb_min_available below 1", "best-effort"],
    ),
    (
        "snapshot-mounted-over-the-cache",
        _set(
            workloads__0__snapshot_volume__mount_path="/var/lib/gpupool/cache",
            kv_cache__kv_preservation="filesystem",
            workloads__0__kv_compaction=False,
        ),
        "workloads.0.snapshot_volume.mount_path",
        ["mounts twice at /var/lib/gpupool/cache", "expected a path no other mount"],
    ),
    (
        "snapshot-mounted-over-tmp",
        _set(
            workloads__0__snapshot_volume__mount_path="/tmp",
            kv_cache__kv_preservation="filesystem",
            workloads__0__kv_compaction=False,
        ),
        "workloads.0.snapshot_volume.mount_path",
        ["mounts twice at /tmp", "expected a path no other mount"],
    ),
    (
        "taint-key-is-pool-label",
        _set(node_pools__0__taints=[{"key": "gpupool.io/pool", "effect": "PreferNoSchedule"}]),
        "node_pools.0.taints.0.key",
        ["is cluster.pool_label", "expected another key"],
    ),
    (
        "karpenter-grace-below-pod-grace",
        _set(node_pools__1__karpenter__termination_grace_period="30s"),
        "node_pools.1.karpenter.termination_grace_period",
        ["shorter than disruption.termination_grace_s (45 s)", "expected at least 45s"],
    ),
    (
        "compaction-beside-a-connector",
        _set(kv_cache__kv_preservation="filesystem"),
        "workloads.0.kv_compaction",
        ["OffloadingConnector", "expected kv_compaction: false or kv_preservation: off"],
    ),
    (
        "restored-blocks-hashed-with-a-random-seed",
        _set(
            kv_cache__kv_preservation="filesystem",
            workloads__0__kv_compaction=False,
            kv_cache__prefix_caching_hash_algo="xxhash",
        ),
        "kv_cache.prefix_caching_hash_algo",
        ["seeds xxhash block hashes at random", "expected prefix_caching_hash_algo sha256"],
    ),
    (
        "snapshot-volume-one-node-many-replicas",
        _set(
            kv_cache__kv_preservation="filesystem",
            workloads__0__kv_compaction=False,
            workloads__0__snapshot_volume__access_mode="ReadWriteOnce",
        ),
        "workloads.0.snapshot_volume.access_mode",
        ["Multi-Attach", "expected ReadWriteMany", "or max_replicas: 1"],
    ),
    (
        "tier-capacity-beyond-the-volume",
        _set(workloads__0__snapshot_volume__tier_capacity="300Gi"),
        "workloads.0.snapshot_volume.tier_capacity",
        ["at most size (200Gi"],
    ),
    (
        "tier-capacity-not-a-share",
        _set(workloads__0__snapshot_volume__tier_capacity="120%"),
        "workloads.0.snapshot_volume.tier_capacity",
        ["expected a percentage in (0, 100]"],
    ),
]


@pytest.mark.parametrize(
    ("edit", "path", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rejected_at_its_line_with_what_was_expected(
    tmp_path: Path, edit: Edit, path: str, words: list[str]
) -> None:
    assert_rejected_at_its_line(_policy_file(edit, tmp_path), path, words)


def assert_rejected_at_its_line(source: Path, path: str, words: list[str]) -> None:
    """``source`` is refused with one problem at ``path``, at the line of that field (or of
    its deepest part in the file), saying
    ``words``; ``render`` prints it without a traceback and writes nothing."""
    with pytest.raises(PolicyError) as caught:
        load_inputs(source)
    problems = [p for p in caught.value.problems if p.path == path]
    assert problems, f"no problem at {path}: {caught.value}"
    (problem,) = problems
    assert problem.file == str(source)
    for word in words:
        assert word in problem.message, problem.message
    # At the field's line or, for a missing field, the deepest part of it the file has.
    line = source.read_text().splitlines()[problem.line - 1]
    keys = [p for p in path.split(".") if not p.isdigit() and p != "[key]"]
    assert any(f"{k}:" in line for k in keys) or line.lstrip().startswith("- "), (
        problem.line,
        line,
    )

    out = source.parent / "build"
    result = runner.invoke(app, ["render", str(source), "--out", str(out)])
    assert result.exit_code == 1
    assert str(problem) in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_a_bad_policy_leaves_an_existing_render_untouched(tmp_path: Path) -> None:
    """load_inputs refuses before render writes a file: the previous build/ stays as it was."""
    good = _policy_file(_set(), tmp_path / "good")
    out = tmp_path / "build"
    assert runner.invoke(app, ["render", str(good), "--out", str(out)]).exit_code == 0
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    bad = _policy_file(_second_workload(name="llama-8b-flex-kv-compaction", port=8001), tmp_path)
    result = runner.invoke(app, ["render", str(bad), "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "workloads.1.name" in result.output
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_eks_node_names_are_valid(tmp_path: Path) -> None:
    source = _policy_file(_set(node_pools__1__nodes=["ip-10-0-1-23.ec2.internal"]), tmp_path)
    assert load_inputs(source).policy.flex_pools[0].nodes == ("ip-10-0-1-23.ec2.internal",)


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    """Model, name and policy problems come together, sorted by line, never one at a time."""

    def several(doc: Any) -> None:
        _second_workload(name="b" * 50, port=8001)(doc)
        _set(workloads__0__max_model_len=200_000)(doc)

    with pytest.raises(PolicyError) as caught:
        load_inputs(_policy_file(several, tmp_path))
    paths = [p.path for p in caught.value.problems]
    assert paths == ["workloads.0.max_model_len", "workloads.1.name"]


def _warnings(edit: Edit, directory: Path) -> list[Problem]:
    """The capacity warnings load_inputs returns (the image warnings are not about this)."""
    inputs = load_inputs(_policy_file(edit, directory))
    return [w for w in inputs.warnings if w.path.endswith("max_replicas")]


@pytest.mark.parametrize(
    ("lend", "fit", "pools"),
    [(True, 96, "('gpu-flex', 'gpu-prod')"), (False, 32, "('gpu-flex')")],
    ids=["lending", "not-lending"],
)
def test_more_replicas_than_the_pools_hold_is_a_warning(
    tmp_path: Path, lend: bool, fit: int, pools: str
) -> None:
    """gpu-flex: 4 nodes x 8 GPUs, and the lending gpu-prod 8 x 8 more; one more one-GPU
    replica than they hold cannot all be scheduled."""

    def replicas(n: int) -> Edit:
        return _set(node_pools__0__lend_idle=lend, workloads__0__max_replicas=n)

    assert _warnings(replicas(fit), tmp_path / "fits") == []
    (warning,) = _warnings(replicas(fit + 1), tmp_path)
    assert warning.severity == "warning"
    assert warning.path == "workloads.0.max_replicas"
    for words in (f"max_replicas ({fit + 1})", f"at most {fit}", pools, "max_replicas: auto"):
        assert words in warning.message, warning.message
    assert str(warning).startswith(f"{tmp_path / 'pool.yaml'}:{warning.line}: warning: ")
    line = (tmp_path / "pool.yaml").read_text().splitlines()[warning.line - 1]
    assert "max_replicas:" in line


@pytest.mark.parametrize(("lend", "fit"), [(False, 4), (True, 4 + 8 * 2)])
def test_replicas_are_counted_per_node(tmp_path: Path, lend: bool, fit: int) -> None:
    """4-GPU replicas on 6-GPU flex nodes: one per node, so 4 nodes hold 4 replicas although
    5 x 4 = 20 GPUs is below the pool's 24; the lending gpu-prod adds 2 per 8-GPU node."""

    def replicas(n: int) -> Edit:
        return _set(
            node_pools__0__lend_idle=lend,
            node_pools__1__gpus_per_node=6,
            workloads__0__gpus_per_replica=4,
            workloads__0__max_replicas=n,
        )

    assert _warnings(replicas(fit), tmp_path / "fits") == []
    (warning,) = _warnings(replicas(fit + 1), tmp_path)
    assert f"at most {fit} such replicas fit" in warning.message, warning.message


def test_auto_max_replicas_is_never_a_capacity_warning(tmp_path: Path) -> None:
    """``auto`` is what the pools hold, so it cannot exceed them, however large the replicas."""
    edit = _set(node_pools__1__gpus_per_node=6, workloads__0__gpus_per_replica=4)
    assert _warnings(edit, tmp_path) == []


def test_warnings_without_a_document_are_still_reported() -> None:
    """policy_warnings on a policy with no YAML behind it (the tuner's proposals): line 1."""
    doc = yaml.load(DEFAULT_POLICY.read_text())
    set_path(doc, "workloads.0.max_replicas", 97)  # gpu-flex and the lending gpu-prod hold 96
    warnings = [w for w in policy_warnings(parse_policy(doc)) if w.path.endswith("replicas")]
    assert [(w.file, w.line, w.severity) for w in warnings] == [("<policy>", 1, "warning")]


def test_the_shipped_policy_has_no_capacity_warning() -> None:
    assert [w for w in policy_warnings(load_policy()) if "replicas" in w.path] == []

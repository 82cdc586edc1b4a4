"""Rendering is deterministic, file names are stable, and writes are atomic and clean up."""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from infra.diff import diff_documents
from infra.output import MANIFEST, write_documents
from infra.render import KUSTOMIZATION, DuplicateObject, render_documents
from policy import PoolPolicy, load_policy
from tests.infra.policies import explicit_args, policy_with, two_workloads


def render(policy: PoolPolicy, target: str = "labels") -> dict[str, str]:
    return render_documents(
        build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]
    )


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_render_is_byte_for_byte_deterministic(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    write_documents(first, render(load_policy()))
    write_documents(second, render(load_policy()))
    assert _tree(first) == _tree(second)
    assert len(_tree(first)) == len(render(load_policy())) + 1  # + the manifest


def test_each_document_parses_back_to_its_object() -> None:
    policy = load_policy()
    objs = build_bundle(policy, stack=StackOptions("karpenter"), vllm_args=explicit_args(policy))
    docs = render_documents(objs)
    loader = YAML(typ="safe")
    parsed = [loader.load(text) for name, text in docs.items() if name != KUSTOMIZATION]
    assert parsed == objs
    kustomization = loader.load(docs[KUSTOMIZATION])
    assert kustomization["resources"] == [n for n in docs if n != KUSTOMIZATION]


def test_file_names_do_not_depend_on_position() -> None:
    one, two = render(load_policy()), render(two_workloads())
    shared = one.keys() & two.keys()
    assert one.keys() - {KUSTOMIZATION} <= two.keys()
    assert "gpupool-flex/deployment-qwen-14b-flex.yaml" in two.keys() - one.keys()
    assert "_cluster/priorityclass-gpupool-idle-inference.yaml" in shared


def test_duplicate_objects_are_refused() -> None:
    policy = load_policy()
    objs = build_bundle(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))
    with pytest.raises(DuplicateObject, match="namespace-gpupool-flex"):
        render_documents([*objs, objs[0]])


def test_rewrite_removes_stale_files_and_keeps_foreign_ones(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not gpupool's\n")
    first = write_documents(tmp_path, render(two_workloads()))
    assert not first.removed and first.written
    second = write_documents(tmp_path, render(load_policy()))
    assert "gpupool-flex/deployment-qwen-14b-flex.yaml" in second.removed
    assert not (tmp_path / "gpupool-flex/deployment-qwen-14b-flex.yaml").exists()
    assert (tmp_path / "README.md").read_text() == "not gpupool's\n"
    assert set(second.unchanged) >= {"_cluster/namespace-gpupool-flex.yaml"}
    assert (tmp_path / MANIFEST).read_text().splitlines() == sorted(render(load_policy()))
    assert not list(tmp_path.rglob("*.tmp"))


def test_stale_folders_disappear(tmp_path: Path) -> None:
    karpenter = render(load_policy(), "karpenter")
    write_documents(tmp_path, karpenter)
    moved = render(policy_with({"cluster.flex_namespace": "flex-b"}), "karpenter")
    result = write_documents(tmp_path, moved)
    assert "gpupool-flex/service-llama-8b-flex.yaml" in result.removed
    assert not (tmp_path / "gpupool-flex").exists()


def test_write_refuses_paths_outside_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside"):
        write_documents(tmp_path / "out", {"../escape.yaml": "x: 1\n"})
    assert not (tmp_path / "escape.yaml").exists()


def test_diff_reports_object_level_changes() -> None:
    old = render(load_policy())
    new = render(two_workloads())
    text = diff_documents(old, new)
    assert text.splitlines()[0].startswith(f"{len(new.keys() - old.keys())} added, 0 removed")
    assert "+ gpupool-flex/horizontalpodautoscaler-qwen-14b-flex.yaml" in text
    # required anti-affinity changed the existing Deployment: shown as a unified diff
    assert "~ gpupool-flex/deployment-llama-8b-flex.yaml" in text
    assert "--- a/gpupool-flex/deployment-llama-8b-flex.yaml" in text
    assert "+          requiredDuringSchedulingIgnoredDuringExecution:" in text
    reverse = diff_documents(new, old)
    assert "- gpupool-flex/horizontalpodautoscaler-qwen-14b-flex.yaml" in reverse
    assert diff_documents(old, dict(old)) == ""

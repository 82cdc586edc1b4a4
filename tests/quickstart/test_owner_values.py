"""Values only the owner knows have no default (the runtime image, the repository the tuner
clones); a field needed only by a feature that is off is not required; init's placeholders
are warned about until they are replaced."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from infra.builders.workload import flex_workload
from policy import PolicyError, parse_policy
from policy.loader import policy_warnings
from tests.infra.policies import edited


def _problems(document: Any) -> list[tuple[str, str]]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(document)
    return [(p.path, p.message) for p in caught.value.problems]


def _without(path: str) -> Any:
    document = copy.deepcopy(edited())
    *parents, last = path.split(".")
    node = document
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    del node[int(last) if last.isdigit() else last]
    return document


@pytest.mark.parametrize("path", ["cluster.runtime_image", "tuner.policy_repo_url", "tuner"])
def test_owner_only_values_are_required(path: str) -> None:
    assert (path, "required field is missing") in _problems(_without(path))


def test_no_storage_class_is_needed_while_nothing_renders_the_volume() -> None:
    document = _without("workloads.0.snapshot_volume")
    policy = parse_policy(document)
    assert policy.kv_cache.kv_preservation == "off"
    assert policy.workloads[0].snapshot_volume.storage_class is None
    kinds = [o["kind"] for o in flex_workload(policy, policy.workloads[0], [])]
    assert "PersistentVolumeClaim" not in kinds


def test_preservation_needs_the_storage_class_of_the_volume_it_renders() -> None:
    document = _without("workloads.0.snapshot_volume.storage_class")
    document["kv_cache"]["kv_preservation"] = "filesystem"
    document["workloads"][0]["kv_compaction"] = False
    ((path, message),) = _problems(document)
    assert path == "workloads.0.snapshot_volume.storage_class"
    assert "kv_preservation: filesystem" in message and "StorageClass" in message
    document["workloads"][0]["snapshot_volume"]["storage_class"] = "nfs-rwx"
    policy = parse_policy(document)
    (claim,) = [
        o
        for o in flex_workload(policy, policy.workloads[0], [])
        if o["kind"] == "PersistentVolumeClaim"
    ]
    assert claim["spec"]["storageClassName"] == "nfs-rwx"


def test_placeholders_are_warned_about_until_replaced() -> None:
    placeholder = edited(
        {
            "cluster.runtime_image": "registry.example.invalid/gpupool/gpupool:0.1.0",
            "tuner.policy_repo_url": "git@git.example.invalid:you/policy.git",
            "alerting.routing.receivers.2.url": "https://alerts.example.invalid/x",
        }
    )
    warned = [
        p.path for p in policy_warnings(parse_policy(placeholder)) if "placeholder" in p.message
    ]
    assert warned == [
        "alerting.routing.receivers.2.url",
        "cluster.runtime_image",
        "tuner.policy_repo_url",
    ]
    real = [p for p in policy_warnings(parse_policy(edited())) if "placeholder" in p.message]
    assert real == []

"""Policies for infra tests: the shipped default, edited at dotted paths, and explicit vLLM args."""

from __future__ import annotations

import copy
from typing import Any

from ruamel.yaml import YAML

from policy import DEFAULT_POLICY, PoolPolicy, parse_policy
from tests.harness.policy_docs import set_path

BASE: Any = YAML(typ="safe").load(DEFAULT_POLICY.read_text())


def edited(edits: dict[str, Any] | None = None) -> Any:
    """The default document with ``{"a.b.0.c": value}`` edits applied."""
    doc = copy.deepcopy(BASE)
    for path, value in (edits or {}).items():
        set_path(doc, path, value)
    return doc


def policy_with(edits: dict[str, Any] | None = None) -> PoolPolicy:
    """A validated policy: the default with ``edits``."""
    return parse_policy(edited(edits))


def two_workloads() -> PoolPolicy:
    """The default plus a second, 2-GPU workload with required anti-affinity."""
    doc = edited({"disruption.anti_affinity": "required"})
    second = copy.deepcopy(doc["workloads"][0])
    second |= {"name": "qwen-14b-flex", "gpus_per_replica": 2, "max_replicas": 3, "port": 8001}
    doc["workloads"].append(second)
    return parse_policy(doc)


def explicit_args(policy: PoolPolicy) -> dict[str, list[str]]:
    """Stand-in vLLM args: builders pass them through verbatim (runtime.vllm makes real ones)."""
    return {w.name: ["--model", w.model, "--port", str(w.port)] for w in policy.workloads}

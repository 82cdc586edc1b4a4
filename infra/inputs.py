"""Edge: a policy file -> everything the pure builders need (the policy and the vLLM args).

A workload's ``hf_config`` is relative to the policy file's directory; ``runtime.vllm`` turns
the model config and the policy into the vLLM server arguments. A model config that is
missing or does not fit is reported like any other policy problem: at the workload's line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy import PolicyError, PoolPolicy, Problem, parse_policy
from policy.loader import read_yaml
from runtime.vllm import (
    BackendError,
    KvPlanError,
    ModelConfigError,
    load_model_spec,
    serve_args,
)


@dataclass(frozen=True)
class BundleInputs:
    """A validated policy and the vLLM container args of each of its workloads."""

    policy: PoolPolicy
    vllm_args: dict[str, list[str]]
    """Workload name -> vLLM server arguments."""


def load_inputs(policy_path: Path) -> BundleInputs:
    """Read and validate the policy, then derive the vLLM args of every workload.

    Raises PolicyError listing every problem (policy or model config) before anything is built.
    """
    document = read_yaml(policy_path)
    policy = parse_policy(document, str(policy_path))
    args: dict[str, list[str]] = {}
    problems: list[Problem] = []
    for i, workload in enumerate(policy.workloads):
        try:
            model = load_model_spec(policy_path.parent / workload.hf_config)
            args[workload.name] = serve_args(policy, workload, model)
        except (ModelConfigError, KvPlanError, BackendError) as exc:
            line = _workload_line(document, i)
            problems.append(Problem(str(policy_path), line, f"workloads.{i}", str(exc)))
    if problems:
        raise PolicyError(problems)
    return BundleInputs(policy, args)


def _workload_line(document: Any, index: int) -> int:
    """1-based line where workload ``index`` starts in the round-trip YAML document."""
    line, _column = document["workloads"].lc.item(index)
    return int(line) + 1

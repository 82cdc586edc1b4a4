"""Edge: a policy file -> everything the pure builders need (the policy and the vLLM args).

A workload's ``hf_config`` is relative to the policy file's directory; ``runtime.vllm`` turns
the model config and the policy into the vLLM server arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from policy import PoolPolicy, load_policy
from runtime.vllm import load_model_spec, serve_args


@dataclass(frozen=True)
class BundleInputs:
    """A validated policy and the vLLM container args of each of its workloads."""

    policy: PoolPolicy
    vllm_args: dict[str, list[str]]


def vllm_args_for(policy: PoolPolicy, policy_dir: Path) -> dict[str, list[str]]:
    """Workload name -> vLLM args, from each workload's model config."""
    return {
        w.name: serve_args(policy, w, load_model_spec(policy_dir / w.hf_config))
        for w in policy.workloads
    }


def load_inputs(policy_path: Path) -> BundleInputs:
    """Read and validate the policy, then derive the vLLM args of its workloads."""
    policy = load_policy(policy_path)
    return BundleInputs(policy, vllm_args_for(policy, policy_path.parent))

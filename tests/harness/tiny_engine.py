"""The tiny test engine's arguments, derived by runtime.vllm from tests/fixtures/tiny-policy.yaml.

The session ``vllm_server`` fixture starts vLLM with exactly these, so every engine test also
proves that the generated arguments start and serve on the real engine.
"""

from __future__ import annotations

from pathlib import Path

from policy import load_policy
from runtime.vllm import KvCachePlan, load_model_spec, plan_kv_cache
from tests.harness.servers import REPO, TINY_MODEL

TINY_POLICY = REPO / "tests" / "fixtures" / "tiny-policy.yaml"
"""CPU backend, a pretend 128 MiB accelerator, max_model_len 512, 16 sequences."""

TEST_ONLY_ARGS = ("--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager")
"""Random weights and token-id prompts: the tiny model has only a config.json."""


def tiny_plan(port: int, policy_file: Path = TINY_POLICY) -> KvCachePlan:
    """The plan for the tiny model, served from its absolute path on ``port``."""
    policy = load_policy(policy_file)
    workload = policy.workloads[0].model_copy(update={"model": str(TINY_MODEL), "port": port})
    return plan_kv_cache(policy, workload, load_model_spec(TINY_MODEL))

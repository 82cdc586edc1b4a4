"""Shared inputs of the vLLM argument tests: the shipped policy and the published configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy import DEFAULT_POLICY, PoolPolicy, load_policy
from policy.workloads import FlexWorkload
from runtime.vllm import ModelSpec, load_model_spec

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
"""Published config.json files; each names its source in ``_source``."""


@pytest.fixture(scope="session")
def policy() -> PoolPolicy:
    """The shipped default policy: H200 flex pool (140 GiB), 75 % KV cap, 8 % reserve."""
    return load_policy(DEFAULT_POLICY)


@pytest.fixture(scope="session")
def workload(policy: PoolPolicy) -> FlexWorkload:
    return policy.workloads[0]


def model(name: str) -> ModelSpec:
    return load_model_spec(MODELS / f"{name}.json")

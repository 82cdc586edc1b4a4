"""Shared fixtures of the alert tests: the test policy and its rendered bundle."""

from __future__ import annotations

from pathlib import Path

import pytest

from alerts.render import render
from policy import PoolPolicy, load_policy
from tests.harness.servers import REPO

ALERT_TESTS = REPO / "alerts" / "tests"
TEST_POLICY = ALERT_TESTS / "policy.yaml"


@pytest.fixture(scope="session")
def test_policy() -> PoolPolicy:
    return load_policy(TEST_POLICY)


@pytest.fixture(scope="session")
def bundle(test_policy: PoolPolicy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test policy rendered by ``alerts render``: what promtool and amtool check."""
    out = tmp_path_factory.mktemp("bundle") / "out"
    render(test_policy, out)
    return out

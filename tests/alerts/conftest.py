"""Shared fixtures of the alert tests: the test policy and its rendered bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from alerts.render import render
from policy import PoolPolicy, load_policy, parse_policy
from tests.harness.servers import REPO

ALERT_TESTS = REPO / "alerts" / "tests"
TEST_POLICY = ALERT_TESTS / "policy.yaml"
FAST_POLICY = Path(__file__).with_name("fast_policy.yaml")


def fast_policy(
    webhook_url: str,
    *,
    tuner: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
    **metrics: Any,
) -> PoolPolicy:
    """The second-scale policy of the real-server tests, receivers at ``webhook_url``;
    ``tuner`` sets fields of the policy's ``tuner`` section (e.g. where Alertmanager finds
    Secrets), ``routing`` those of ``alerting.routing`` (other receivers)."""
    document = YAML(typ="safe").load(FAST_POLICY.read_text().replace("{webhook}", webhook_url))
    document["metrics"].update(metrics)
    if tuner is not None:
        document["tuner"] = {**document["tuner"], **tuner}
    document["alerting"]["routing"].update(routing or {})
    return parse_policy(document, str(FAST_POLICY))


@pytest.fixture(scope="session")
def test_policy() -> PoolPolicy:
    return load_policy(TEST_POLICY)


@pytest.fixture(scope="session")
def bundle(test_policy: PoolPolicy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test policy rendered by ``alerts render``: what promtool and amtool check."""
    out = tmp_path_factory.mktemp("bundle") / "out"
    render(test_policy, out)
    return out

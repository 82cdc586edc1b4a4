"""amtool on the generated alertmanager.yml: valid, and every alert reaches its receivers."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from alerts.bundle import alert_names, all_groups
from alerts.routing import alertmanager_config, inhibit_rules, paired_alertnames
from infra.yaml_text import to_yaml
from policy import PoolPolicy
from tests.harness.servers import require_binary

pytestmark = pytest.mark.process

# Receivers the test policy (alerts/tests/policy.yaml) promises for each alert: severity
# routes, plus the tuner for the alerts that start a tuning cycle.
EXPECTED = {
    "FlexEvictionRateHigh": "gpupool-tuner,platform",
    "KVCacheHitRateLow": "gpupool-tuner,platform",
    "FlexNotGrowing": "platform",
    "GPUMemoryPressure": "platform",
    "ProdCapacityAtRisk": "oncall",
    "GpupoolMetricsStale": "platform",
    "GpupoolMetricMissing": "platform",
    "NodePoolLabelsMissing": "platform",
    "GPUExporterDown": "platform",
    "GPUsNotReporting": "platform",
    "GPUPodAttributionMissing": "platform",
    "KVSnapshotTierThrashing": "platform",
    "KVSnapshotGCStalled": "platform",
    "KVSnapshotGCErrors": "platform",
    "KVSnapshotFlushDropped": "platform",
    "ServingRequestsShed": "platform",
    "ServingEndpointMetricsStale": "platform",
    "ServingRequestsToTerminatingPod": "platform",
}


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("amtool"), *args], capture_output=True, text=True, check=False
    )


def test_generated_config_passes_amtool(bundle: Path) -> None:
    result = _amtool("check-config", str(bundle / "alertmanager.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 receivers" in result.stdout
    assert "0 inhibit rules" in result.stdout


def test_every_alert_is_routed_here(test_policy: PoolPolicy) -> None:
    assert set(EXPECTED) == set(alert_names(test_policy))


def test_no_inhibit_rule_without_an_alert_at_both_severities(test_policy: PoolPolicy) -> None:
    """Each alert's severity is one policy knob, so no name exists at both severities and an
    inhibit rule would match nothing: none is rendered."""
    assert paired_alertnames(all_groups(test_policy)) == []
    assert alertmanager_config(test_policy)["inhibit_rules"] == []


def _rule(name: str, severity: str) -> dict[str, Any]:
    return {"alert": name, "expr": "vector(1)", "labels": {"severity": severity}}


def test_an_alert_at_both_severities_gets_its_inhibit_rule() -> None:
    groups = [
        {"name": "a", "rules": [_rule("Pair", "critical"), _rule("Lonely", "critical")]},
        {"name": "b", "rules": [_rule("Pair", "warning"), _rule("Info", "info")]},
        {"name": "c", "rules": [{"record": "x", "expr": "vector(1)"}]},
    ]
    assert paired_alertnames(groups) == ["Pair"]
    assert inhibit_rules(groups) == [
        {
            "source_matchers": ['severity="critical"', 'alertname=~"Pair"'],
            "target_matchers": ['severity="warning"', 'alertname=~"Pair"'],
            "equal": ["alertname", "namespace"],
        }
    ]


def test_a_rendered_inhibit_rule_passes_amtool(test_policy: PoolPolicy, tmp_path: Path) -> None:
    groups = [{"name": "a", "rules": [_rule("Pair", "critical"), _rule("Pair", "warning")]}]
    config = {**alertmanager_config(test_policy), "inhibit_rules": inhibit_rules(groups)}
    path = tmp_path / "alertmanager.yml"
    path.write_text(to_yaml(config, sort_keys=False))
    result = _amtool("check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 inhibit rules" in result.stdout


def _alert_labels(policy: PoolPolicy) -> dict[str, dict[str, str]]:
    return {
        rule["alert"]: {"alertname": rule["alert"], **rule["labels"]}
        for group in all_groups(policy)
        for rule in group["rules"]
        if "alert" in rule
    }


@pytest.mark.parametrize("alertname", sorted(EXPECTED))
def test_each_alert_reaches_its_receivers(
    bundle: Path, test_policy: PoolPolicy, alertname: str
) -> None:
    labels = _alert_labels(test_policy)[alertname]
    result = _amtool(
        "config",
        "routes",
        "test",
        f"--config.file={bundle / 'alertmanager.yml'}",
        f"--verify.receivers={EXPECTED[alertname]}",
        *(f"{k}={v}" for k, v in sorted(labels.items())),
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_unknown_alert_falls_back_to_the_default_receiver(bundle: Path) -> None:
    result = _amtool(
        "config",
        "routes",
        "test",
        f"--config.file={bundle / 'alertmanager.yml'}",
        "--verify.receivers=platform",
        "alertname=SomethingElse",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_the_tuner_receiver_sends_the_bearer_token(test_policy: PoolPolicy) -> None:
    """The tuner answers 401 without its token; the other receivers get no credentials."""
    receivers = {
        r["name"]: r["webhook_configs"][0] for r in alertmanager_config(test_policy)["receivers"]
    }
    tuner = test_policy.tuner
    assert receivers["gpupool-tuner"]["http_config"] == {
        "authorization": {
            "type": "Bearer",
            "credentials_file": (
                f"{tuner.alertmanager_secrets_dir}/{tuner.webhook_token_secret}/"
                f"{tuner.webhook_token_key}"
            ),
        }
    }
    assert [n for n, hook in receivers.items() if "http_config" in hook] == ["gpupool-tuner"]

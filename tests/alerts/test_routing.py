"""amtool on the generated alertmanager.yml: valid, and every alert reaches its receivers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from alerts.bundle import all_groups
from alerts.routing import alertmanager_config
from policy import PoolPolicy
from tests.harness.servers import require_binary

# Receivers the test policy (alerts/tests/policy.yaml) promises for each alert: severity
# routes, plus the tuner for the alerts that start a tuning cycle.
EXPECTED = {
    "FlexEvictionRateHigh": "gpupool-tuner,platform",
    "KVCacheHitRateLow": "gpupool-tuner,platform",
    "ClusterGPUUtilizationLow": "gpupool-tuner,platform",
    "GPUMemoryPressure": "platform",
    "ProdCapacityAtRisk": "oncall",
    "GpupoolMetricsStale": "platform",
}


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("amtool"), *args], capture_output=True, text=True, check=False
    )


def test_generated_config_passes_amtool(bundle: Path) -> None:
    result = _amtool("check-config", str(bundle / "alertmanager.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 receivers" in result.stdout
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

"""promtool on the rules generated from the test policy: syntax, and every alert at its edge."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from alerts.bundle import alert_names
from policy import PoolPolicy
from tests.alerts.conftest import ALERT_TESTS
from tests.harness.servers import require_binary

pytestmark = pytest.mark.process

UNIT_TESTS = sorted(ALERT_TESTS.glob("*.test.yaml"))


def test_every_generated_rule_file_passes_promtool_check(bundle: Path) -> None:
    files = sorted((bundle / "rules").glob("*.yaml"))
    assert len(files) >= 7
    result = subprocess.run(
        [require_binary("promtool"), "check", "rules", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("unit_test", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass_on_generated_rules(bundle: Path, unit_test: Path) -> None:
    """The committed unit tests run beside the freshly generated rule files they name."""
    shutil.copy(unit_test, bundle / unit_test.name)
    result = subprocess.run(
        [require_binary("promtool"), "test", "rules", unit_test.name],
        cwd=bundle,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test(test_policy: PoolPolicy) -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        for case in YAML(typ="safe").load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(alert_names(test_policy))
    assert names == {
        "FlexEvictionRateHigh",
        "KVCacheHitRateLow",
        "GPUMemoryPressure",
        "FlexNotGrowing",
        "ProdCapacityAtRisk",
        "GpupoolMetricsStale",
        "GpupoolMetricMissing",
        "NodePoolLabelsMissing",
        "GPUExporterDown",
        "GPUsNotReporting",
        "GPUPodAttributionMissing",
        "KVSnapshotTierThrashing",
        "KVSnapshotGCStalled",
        "KVSnapshotGCErrors",
        "KVSnapshotFlushDropped",
        "ServingRequestsShed",
        "ServingEndpointMetricsStale",
        "ServingRequestsToTerminatingPod",
    }
    assert names - fires == set(), "alerts without a firing unit test"
    assert names - quiet == set(), "alerts without a quiet unit test"

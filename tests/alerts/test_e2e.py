"""End to end with the real servers: a scripted exporter, Prometheus evaluating the rules
generated from a policy, Alertmanager routing them to a local webhook."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alerts.render import render
from alerts.routing import alertmanager_config
from policy import PoolPolicy
from tests.alerts.conftest import fast_policy
from tests.alerts.scenario_exporter import Exporter, Scenario, serve
from tests.alerts.webhook import Webhook, start_webhook
from tests.harness.servers import Server, free_port, start_alertmanager, start_prometheus

QUIET_EVALUATIONS = 8
"""Rule evaluations (1 s apart) the healthy phase must pass with nothing firing or delivered:
over twice for (3 s) + group_wait (1 s) + one evaluation."""
DELIVERY_TIMEOUT_S = 90.0
TUNER_TOKEN = "e2e-tuner-token"


@dataclass
class Stack:
    policy: PoolPolicy
    exporter: Exporter
    webhook: Webhook
    prometheus: Server
    alertmanager: Server


def query(prometheus: Server, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """Instant query (at ``at`` seconds since the epoch, default now); the result vector."""
    params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
    url = f"{prometheus.url}/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def rule_evaluations(prometheus: Server) -> dict[str, float]:
    """How many times Prometheus has evaluated each rule group (its own counter)."""
    with urllib.request.urlopen(f"{prometheus.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        labels: float(value)
        for labels, value in (
            line.removeprefix("prometheus_rule_group_iterations_total").rsplit(" ", 1)
            for line in text.splitlines()
            if line.startswith("prometheus_rule_group_iterations_total{")
        )
    }


def assert_quiet(stack: Stack, evaluations: int, timeout_s: float = 60) -> None:
    """Nothing fires and nothing is delivered while every rule group is evaluated
    ``evaluations`` more times: counted on Prometheus' clock, failing at the first alert."""
    start = rule_evaluations(stack.prometheus)
    assert start, "Prometheus reports no rule groups"
    deadline = time.monotonic() + timeout_s
    while True:
        assert stack.webhook.snapshot() == []
        assert query(stack.prometheus, 'ALERTS{alertstate="firing"}') == []
        now = rule_evaluations(stack.prometheus)
        if all(now.get(group, 0) >= count + evaluations for group, count in start.items()):
            return
        assert time.monotonic() < deadline, "Prometheus stopped evaluating its rules"
        time.sleep(0.25)


def wait_for_value(prometheus: Server, promql: str, timeout_s: float = 60) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = query(prometheus, promql)
        if result:
            return float(result[0]["value"][1])
        time.sleep(0.5)
    raise AssertionError(f"{promql} had no value after {timeout_s} s:\n{prometheus.log_tail()}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("e2e")
    webhook = start_webhook()
    # The tuner's token where Alertmanager finds its Secrets (prometheus-operator layout):
    # the generated config reads it from there unchanged.
    secrets = workdir / "secrets"
    policy = fast_policy(webhook.url, tuner={"alertmanager_secrets_dir": str(secrets)})
    token_file = Path(policy.tuner.webhook_credentials_file)
    token_file.parent.mkdir(parents=True)
    token_file.write_text(TUNER_TOKEN + "\n")
    render(policy, workdir / "bundle")
    alertmanager_yml = (workdir / "bundle" / "alertmanager.yml").read_text()
    exporter = serve(Scenario(), free_port())
    alertmanager = start_alertmanager(alertmanager_yml, workdir / "am")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(workdir / "bundle" / "rules" / "*.yaml")],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [alertmanager.url.removeprefix("http://")]}]}
            ]
        },
        "scrape_configs": [
            {
                "job_name": "scenario",
                "honor_labels": True,
                "static_configs": [{"targets": [exporter.url]}],
            }
        ],
    }
    prometheus = start_prometheus(json.dumps(config), workdir / "prom")
    try:
        yield Stack(policy, exporter, webhook, prometheus, alertmanager)
    finally:
        prometheus.stop()
        alertmanager.stop()
        exporter.stop()
        webhook.stop()


@pytest.mark.slow
def test_healthy_then_unhealthy_scenario(stack: Stack) -> None:
    """Healthy: the recorded series show it and nothing is delivered within a bounded wait.
    Then evictions and a low hit rate: both alerts reach the platform and tuner receivers."""
    prom = stack.prometheus
    hit = wait_for_value(prom, 'gpupool:kv_cache_hit_rate:ratio{pod="flex-a"}')
    assert hit == pytest.approx(0.95, abs=0.01)
    assert wait_for_value(prom, "gpupool:flex_evictions:per_minute") == 0
    assert query(prom, 'gpupool:kv_cache_hit_rate:ratio{pod="flex-idle"}') == []
    assert_quiet(stack, QUIET_EVALUATIONS)
    assert stack.webhook.snapshot() == []

    stack.exporter.scenario.evictions_per_s = 1.0
    stack.exporter.scenario.hit_ratio = 0.5

    for alertname, description_bits in {
        "FlexEvictionRateHigh": ["limit 5 per minute for 3s", "relax the reserve"],
        "KVCacheHitRateLow": ["minimum 80% for 3s", "flex-a", "compact the KV cache"],
    }.items():
        for path, receiver in (("/platform", "platform"), ("/tuner", "gpupool-tuner")):
            delivery = stack.webhook.wait_for(path, alertname, DELIVERY_TIMEOUT_S)
            assert delivery is not None, f"{alertname} never reached {path}:\n{prom.log_tail()}"
            payload = delivery.payload
            assert payload["version"] == "4"
            assert payload["receiver"] == receiver
            expected_auth = f"Bearer {TUNER_TOKEN}" if receiver == "gpupool-tuner" else None
            assert delivery.authorization == expected_auth
            assert payload["groupLabels"] == {"alertname": alertname, "namespace": "gpupool-flex"}
            labels = payload["commonLabels"]
            assert labels["severity"] == "warning"
            assert labels["cluster"] == "e2e-cluster"
            assert labels["gpupool_tuner"] == "true"
            annotations = payload["commonAnnotations"]
            assert annotations["runbook_url"].endswith(f"#{alertname.lower()}")
            for bit in description_bits:
                assert bit in annotations["description"], annotations
            assert all(a["labels"].get("pod") != "flex-idle" for a in payload["alerts"])
    deliveries = [
        d for d in stack.webhook.snapshot() if "InhibitProbe" not in json.dumps(d.payload)
    ]
    delivered = {d.payload["groupLabels"]["alertname"] for d in deliveries}
    assert delivered == {"FlexEvictionRateHigh", "KVCacheHitRateLow"}
    assert not [d for d in deliveries if d.path == "/oncall"]


def _post_alerts(alertmanager: Server, alerts: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(
        alertmanager.url + "/api/v2/alerts",
        json.dumps(alerts).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.mark.slow
def test_no_inhibit_rule_silences_a_warning(stack: Stack) -> None:
    """No generated alert exists at both severities, so the generated config has no inhibit
    rule, and a warning sharing alertname and namespace with a firing critical alert still
    reaches its receiver (posted to Alertmanager directly)."""
    rendered = alertmanager_config(stack.policy)
    assert rendered["inhibit_rules"] == []

    def alert(severity: str, namespace: str) -> dict[str, Any]:
        labels = {"alertname": "InhibitProbe", "severity": severity, "namespace": namespace}
        return {"labels": labels, "annotations": {"summary": severity}}

    _post_alerts(stack.alertmanager, [alert("critical", "ns-a")])
    assert stack.webhook.wait_for("/oncall", "InhibitProbe", DELIVERY_TIMEOUT_S) is not None
    _post_alerts(stack.alertmanager, [alert("warning", "ns-a"), alert("warning", "ns-b")])
    assert stack.webhook.wait_for("/platform", "InhibitProbe", DELIVERY_TIMEOUT_S) is not None
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    to_platform: set[str] = set()
    while time.monotonic() < deadline and to_platform != {"ns-a", "ns-b"}:
        to_platform = {
            a["labels"]["namespace"]
            for d in stack.webhook.snapshot()
            if d.path == "/platform" and d.payload["groupLabels"].get("alertname") == "InhibitProbe"
            for a in d.payload["alerts"]
        }
        time.sleep(0.25)
    assert to_platform == {"ns-a", "ns-b"}

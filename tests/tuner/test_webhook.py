"""A real Alertmanager delivers a notification to the tuner's webhook, which triggers an
immediate evaluation; requests without the token are refused; repeats are ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from alerts.routing import alertmanager_config
from alerts.rules import TUNER_LABEL
from infra.builders.runtime_components import (
    REPO_PATH,
    clone_container,
    tuner_command,
    tuner_deployment,
)
from policy import DEFAULT_POLICY, load_policy, parse_policy
from runtime.tuner.cycle import CycleReport, Target, run_cycle
from runtime.tuner.prometheus import connect
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.webhook import TOKEN_ENV, Triggers, run_loop, serve
from tests.harness.containers import run_container
from tests.harness.servers import REPO, Server, free_port, start_alertmanager
from tests.tuner import scenarios

pytestmark = pytest.mark.slow
TOKEN = "s3cret-test-token"


class Tuner:
    """The webhook and the tuning loop, as ``gpupool tune --listen`` runs them."""

    def __init__(self, prometheus: Server, repo: Path) -> None:
        self.metrics = TunerMetrics.create()
        self.triggers = Triggers()
        self.reports: list[tuple[str, CycleReport]] = []
        self.port = free_port()
        self.server = serve(
            ("127.0.0.1", self.port), token=TOKEN, triggers=self.triggers, metrics=self.metrics
        )

        def cycle(trigger: str) -> None:
            report = run_cycle(
                client=connect(prometheus.url),
                target=Target(repo=repo),
                settings=TunerSettings(),
                metrics=self.metrics,
                at=scenarios.evaluation_time("idle"),
                trigger=trigger,
            )
            self.reports.append((trigger, report))

        self.loop = threading.Thread(
            target=run_loop,
            kwargs={"cycle": cycle, "triggers": self.triggers, "interval_s": 3600},
            daemon=True,
        )
        self.loop.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, payload: dict[str, Any], token: str | None) -> int:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(
            self.url + "/alerts", data=json.dumps(payload).encode(), headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def close(self) -> None:
        self.triggers.close()
        self.loop.join(timeout=30)
        self.server.shutdown()


@pytest.fixture
def tuner(scenario_prometheus: Server, policy_repo: Path) -> Iterator[Tuner]:
    t = Tuner(scenario_prometheus, policy_repo)
    yield t
    t.close()


def _wait_for(condition: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def _alertmanager_config(webhook: str, secrets_dir: Path) -> str:
    """The Alertmanager config generated from the shipped policy, unchanged: the policy points
    the tuner receiver at this test's webhook, Alertmanager's Secrets directory at
    ``secrets_dir`` (where the token Secret's file is written, as prometheus-operator mounts
    it) and waits 1 s instead of 30 s before the first notification."""
    document = YAML(typ="safe").load(DEFAULT_POLICY.read_text())
    routing = document["alerting"]["routing"]
    routing["group_wait"] = "1s"
    for receiver in routing["receivers"]:
        if receiver["name"] == routing["tuner_receiver"]:
            receiver["webhook_url"] = webhook
    document["tuner"]["alertmanager_secrets_dir"] = str(secrets_dir)
    policy = parse_policy(document)
    token_file = Path(policy.tuner.webhook_credentials_file)
    token_file.parent.mkdir(parents=True)
    token_file.write_text(TOKEN + "\n")
    return json.dumps(alertmanager_config(policy))


def test_alertmanager_notification_triggers_an_evaluation(tuner: Tuner, tmp_path: Path) -> None:
    _wait_for(lambda: len(tuner.reports) == 1)  # the cycle at start
    assert tuner.reports[0][1].outcome == "created"
    config = _alertmanager_config(tuner.url + "/alerts", tmp_path / "secrets")
    alertmanager = start_alertmanager(config, tmp_path / "am")
    try:
        alert = [
            {
                "labels": {
                    "alertname": "ClusterGPUUtilizationLow",
                    "severity": "info",
                    TUNER_LABEL: "true",
                },
                "annotations": {"summary": "flex should grow"},
            }
        ]
        request = urllib.request.Request(
            alertmanager.url + "/api/v2/alerts",
            data=json.dumps(alert).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        _wait_for(lambda: len(tuner.reports) == 2)
    finally:
        alertmanager.stop()
    trigger, report = tuner.reports[1]
    assert trigger == "alert"
    # it evaluated the metrics: the same idle-cluster proposal, held back by the cooldown
    assert any(
        n.rule == "idle-flex-demand" and "cooldown" in n.reason for n in report.decision.noops
    )
    assert (
        tuner.metrics.registry.get_sample_value("gpupool_tuner_cycles_total", {"trigger": "alert"})
        == 1
    )
    assert (
        tuner.metrics.registry.get_sample_value(
            "gpupool_tuner_notifications_total", {"outcome": "triggered"}
        )
        == 1
    )
    with urllib.request.urlopen(tuner.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'gpupool_tuner_cycles_total{trigger="alert"} 1.0' in text
    assert "gpupool_tuner_query_seconds_count" in text


def test_webhook_refuses_missing_token_and_ignores_repeats(tuner: Tuner) -> None:
    _wait_for(lambda: len(tuner.reports) == 1)
    payload = {
        "version": "4",
        "status": "firing",
        "receiver": "gpupool-tuner",
        "groupKey": '{}:{alertname="FlexEvictionRateHigh"}',
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "FlexEvictionRateHigh"},
                "fingerprint": "abc123",
                "startsAt": "2026-01-01T00:00:00Z",
            }
        ],
    }
    assert tuner.post(payload, token=None) == 401
    assert tuner.post(payload, token="wrong") == 401
    assert tuner.post(payload, token=TOKEN) == 202
    assert tuner.post(payload, token=TOKEN) == 200  # a repeat: no second evaluation
    _wait_for(lambda: len(tuner.reports) == 2)
    assert tuner.triggers.pending_reasons == []  # the repeat queued no second evaluation
    assert [t for t, _ in tuner.reports] == ["start", "alert"]
    samples = {
        outcome: tuner.metrics.registry.get_sample_value(
            "gpupool_tuner_notifications_total", {"outcome": outcome}
        )
        for outcome in ("unauthorized", "triggered", "duplicate")
    }
    assert samples == {"unauthorized": 2, "triggered": 1, "duplicate": 1}


def _deployment_command(policy_repo: Path, prometheus: Server, state: Path) -> list[str]:
    """The tuner Deployment's pod, run here: its init container clones ``policy_repo`` (the
    policy's ``tuner.policy_repo_url``) into ``state``, then its command line runs as a process
    with only the listen address, Prometheus URL and volume path mapped to this machine."""
    document = YAML(typ="safe").load(DEFAULT_POLICY.read_text())
    document["tuner"]["policy_repo_url"] = f"file://{policy_repo}"
    policy = parse_policy(document)
    clone = state / "repo"
    state.mkdir()
    init = run_container(clone_container(policy), REPO_DIR=str(clone), HOME=str(state))
    assert init.returncode == 0, init.stderr
    mapped = {REPO_PATH: str(clone), policy.cluster.prometheus_url: prometheus.url}
    command = [mapped.get(arg, arg) for arg in tuner_command(policy)]
    assert command[0] == "gpupool"
    return [sys.executable, "-m", "runtime.cli.app", *command[1:]]


def _readiness_path() -> str:
    """The path of the tuner Deployment's readiness probe."""
    (container,) = tuner_deployment(load_policy(DEFAULT_POLICY))["spec"]["template"]["spec"][
        "containers"
    ]
    path: str = container["readinessProbe"]["httpGet"]["path"]
    return path


def test_listen_process_serves_webhook_and_metrics_and_stops_on_sigterm(
    scenario_prometheus: Server, policy_repo: Path, tmp_path: Path
) -> None:
    """The Deployment's init container and command line as real processes."""
    port = free_port()
    command = _deployment_command(policy_repo, scenario_prometheus, tmp_path / "state")
    command[command.index("--listen") + 1] = f"127.0.0.1:{port}"
    log = (tmp_path / "tuner.log").open("wb")
    process = subprocess.Popen(
        [*command, "--at", str(scenarios.evaluation_time("idle"))],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, TOKEN_ENV: TOKEN},
    )
    url = f"http://127.0.0.1:{port}"

    def metric(name: str) -> float | None:
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    try:
        _wait_for(lambda: metric('gpupool_tuner_cycles_total{trigger="start"}') == 1)
        probe = _readiness_path()
        with urllib.request.urlopen(url + probe, timeout=10) as response:
            assert response.status == 200  # the readiness probe passes
        payload = {
            "status": "firing",
            "groupKey": "g",
            "alerts": [
                {
                    "labels": {"alertname": "ClusterGPUUtilizationLow"},
                    "fingerprint": "f1",
                    "startsAt": "2026-01-01T00:00:00Z",
                }
            ],
        }
        request = urllib.request.Request(
            url + "/alerts",
            data=json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 202
        _wait_for(lambda: metric('gpupool_tuner_cycles_total{trigger="alert"}') == 1)
        assert (
            metric('gpupool_tuner_proposals_total{outcome="created",rule="idle-flex-demand"}') == 1
        )
        branches = subprocess.run(
            ["git", "-C", str(tmp_path / "state" / "repo"), "branch", "--list", "gpupool-tuner/*"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "gpupool-tuner/idle-flex-demand-" in branches  # proposed in the pod's clone
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()

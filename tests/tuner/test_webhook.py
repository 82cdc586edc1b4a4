"""A real Alertmanager delivers a notification to the tuner's webhook, which triggers an
immediate evaluation; requests without the token are refused; repeats are ignored. Bad
requests on a real socket (lengths, types, nesting, slow clients, too many clients) are
refused, counted by reason, and trigger nothing."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import socket
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
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from alerts.routing import alertmanager_config
from alerts.rules import TUNER_LABEL
from infra.builders.runtime_components import (
    REPO_PATH,
    WEBHOOK_TOKEN_DIR,
    clone_container,
    tuner_command,
    tuner_deployment,
)
from policy import DEFAULT_POLICY, load_policy, parse_policy
from runtime.tuner.cycle import CycleReport, run_cycle
from runtime.tuner.prometheus import connect
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.target import Target
from runtime.tuner.webhook import (
    DEFAULT_LIMITS,
    TOKEN_ENV,
    Refusal,
    Triggers,
    WebhookLimits,
    notification_key,
    parse_notification,
    run_loop,
    serve,
    serve_ops,
)
from tests.harness.containers import run_container
from tests.harness.servers import REPO, Server, free_port, start_alertmanager
from tests.tuner import scenarios

TOKEN = "s3cret-test-token"


class Tuner:
    """The webhook and the tuning loop, as ``gpupool tune --listen`` runs them."""

    def __init__(self, prometheus: Server, repo: Path) -> None:
        self.metrics = TunerMetrics.create()
        self.triggers = Triggers()
        self.reports: list[tuple[str, CycleReport]] = []
        self.port, self.ops_port = free_port(), free_port()
        self.server = serve(
            ("127.0.0.1", self.port), token=TOKEN, triggers=self.triggers, metrics=self.metrics
        )
        self.ops = serve_ops(("127.0.0.1", self.ops_port), metrics=self.metrics)

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
        self.ops.shutdown()


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
            receiver["url"] = webhook
    document["tuner"]["alertmanager_secrets_dir"] = str(secrets_dir)
    policy = parse_policy(document)
    token_file = Path(policy.tuner.webhook_credentials_file)
    token_file.parent.mkdir(parents=True)
    token_file.write_text(TOKEN + "\n")
    return json.dumps(alertmanager_config(policy))


@pytest.mark.slow
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
    ops = f"http://127.0.0.1:{tuner.ops_port}"
    with urllib.request.urlopen(ops + "/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'gpupool_tuner_cycles_total{trigger="alert"} 1.0' in text
    assert "gpupool_tuner_query_seconds_count" in text


@pytest.mark.slow
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
        for outcome in ("triggered", "duplicate")
    }
    assert samples == {"triggered": 1, "duplicate": 1}
    assert (
        tuner.metrics.registry.get_sample_value(
            "gpupool_tuner_webhook_rejected_total", {"reason": "unauthorized"}
        )
        == 2
    )


def _deployment_command(policy_repo: Path, prometheus: Server, state: Path) -> list[str]:
    """The tuner Deployment's pod, run here: its init container clones ``policy_repo`` (the
    policy's ``tuner.policy_repo_url``) into ``state``, then its command line runs as a process
    with only the listen address, Prometheus URL, volume path and the webhook token Secret's
    mounted file mapped to this machine."""
    document = YAML(typ="safe").load(DEFAULT_POLICY.read_text())
    document["tuner"]["policy_repo_url"] = f"file://{policy_repo}"
    policy = parse_policy(document)
    clone = state / "repo"
    state.mkdir()
    init = run_container(clone_container(policy), REPO_DIR=str(clone), HOME=str(state))
    assert init.returncode == 0, init.stderr
    token_file = state / "webhook-token" / policy.tuner.webhook_token_key
    token_file.parent.mkdir()
    token_file.write_text(TOKEN + "\n")  # the Secret's file, as the kubelet mounts it
    mapped = {
        REPO_PATH: str(clone),
        policy.cluster.prometheus_url: prometheus.url,
        f"{WEBHOOK_TOKEN_DIR}/{policy.tuner.webhook_token_key}": str(token_file),
    }
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


@pytest.mark.slow
def test_listen_process_serves_webhook_and_metrics_and_stops_on_sigterm(
    scenario_prometheus: Server, policy_repo: Path, tmp_path: Path
) -> None:
    """The Deployment's init container and command line as real processes."""
    port, ops_port = free_port(), free_port()
    command = _deployment_command(policy_repo, scenario_prometheus, tmp_path / "state")
    command[command.index("--listen") + 1] = f"127.0.0.1:{port}"
    command[command.index("--ops-listen") + 1] = f"127.0.0.1:{ops_port}"
    log = (tmp_path / "tuner.log").open("wb")
    process = subprocess.Popen(
        [*command, "--at", str(scenarios.evaluation_time("idle"))],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k != TOKEN_ENV},  # the file, not $ENV
    )
    url, ops = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ops_port}"

    def metric(name: str) -> float | None:
        try:
            with urllib.request.urlopen(ops + "/metrics", timeout=5) as response:
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
        with urllib.request.urlopen(ops + probe, timeout=10) as response:
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


# --- bad clients, on a real socket, without Prometheus or Alertmanager ---

SMALL = WebhookLimits(
    max_body_bytes=4096,
    max_json_depth=8,
    read_timeout_s=1.0,
    max_handlers=2,
    max_per_client=2,
    queue_wait_s=5.0,
)
"""Limits of the fast tests: small enough that a refusal is quick to provoke."""
AUTH = ("Authorization", f"Bearer {TOKEN}")


class Webhook:
    """``serve`` and ``serve_ops`` on ephemeral ports with their own metrics and triggers;
    counts read as the change since the last ``fresh`` (one server serves a whole module:
    each shutdown waits out ``serve_forever``'s 0.5 s poll)."""

    def __init__(self, limits: WebhookLimits) -> None:
        self.metrics = TunerMetrics.create()
        self.triggers = Triggers()
        self.server = serve(
            ("127.0.0.1", 0),
            token=TOKEN,
            triggers=self.triggers,
            metrics=self.metrics,
            limits=limits,
        )
        self.ops = serve_ops(("127.0.0.1", 0), metrics=self.metrics, limits=limits)
        self.port = int(self.server.server_address[1])
        self.ops_port = int(self.ops.server_address[1])
        self._start: dict[tuple[str, str], float] = {}

    def fresh(self) -> Webhook:
        """Start counting (and collecting trigger reasons) from now."""
        self._start = {
            (sample.name, json.dumps(sample.labels, sort_keys=True)): sample.value
            for family in self.metrics.registry.collect()
            for sample in family.samples
        }
        self.triggers.pending_reasons.clear()
        return self

    def count(self, name: str, **labels: str) -> float:
        now = self.metrics.registry.get_sample_value(name, labels) or 0.0
        return now - self._start.get((name, json.dumps(labels, sort_keys=True)), 0.0)

    def rejected(self, reason: str) -> float:
        return self.count("gpupool_tuner_webhook_rejected_total", reason=reason)

    def close(self) -> None:
        for server in (self.server, self.ops):
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def module_webhook() -> Iterator[Webhook]:
    w = Webhook(SMALL)
    yield w
    w.close()


@pytest.fixture
def webhook(module_webhook: Webhook) -> Webhook:
    return module_webhook.fresh()


_serial = itertools.count()


def firing(fingerprint: str | None = None) -> bytes:
    """A well-formed firing notification; a new one (never a repeat) unless ``fingerprint``
    names one sent before."""
    fingerprint = fingerprint or f"f{next(_serial)}"
    return json.dumps(
        {
            "version": "4",
            "status": "firing",
            "groupKey": f"g-{fingerprint}",
            "truncatedAlerts": 0,
            "alerts": [
                {
                    "status": "firing",
                    "labels": {"alertname": "FlexEvictionRateHigh"},
                    "fingerprint": fingerprint,
                    "startsAt": "2026-01-01T00:00:00Z",
                }
            ],
        }
    ).encode()


def request_bytes(
    body: bytes = b"",
    headers: list[tuple[str, str]] | None = None,
    start: str = "POST /alerts HTTP/1.1",
) -> bytes:
    """A raw request; ``headers`` default to the token and the body's true length."""
    if headers is None:
        headers = [AUTH, ("Content-Length", str(len(body)))]
    lines = [start, "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(
    port: int, data: bytes, *, half_close: bool = False, timeout_s: float = 20
) -> tuple[int | None, bytes]:
    """Send ``data``, read until the server closes; the status (None: closed unanswered)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    reply = b"".join(chunks)
    if not reply:
        return None, b""
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_token_still_guards_and_well_formed_notifications_are_answered(webhook: Webhook) -> None:
    # a wrong token is refused before the (absent) huge body is read
    wrong = [("Authorization", "Bearer nope"), ("Content-Length", "999999999")]
    assert exchange(webhook.port, request_bytes(headers=wrong))[0] == 401
    assert exchange(webhook.port, request_bytes(headers=[("Content-Length", "0")]))[0] == 401
    assert exchange(webhook.port, request_bytes(firing("once")))[0] == 202
    assert exchange(webhook.port, request_bytes(firing("once")))[0] == 200  # a repeat
    resolved = json.dumps({"status": "resolved", "alerts": []}).encode()
    assert exchange(webhook.port, request_bytes(resolved))[0] == 200
    assert webhook.rejected("unauthorized") == 2
    assert webhook.triggers.pending_reasons == ["alert FlexEvictionRateHigh"]
    outcomes = {
        o: webhook.count("gpupool_tuner_notifications_total", outcome=o)
        for o in ("triggered", "duplicate", "resolved")
    }
    assert outcomes == {"triggered": 1, "duplicate": 1, "resolved": 1}


@pytest.mark.parametrize(
    ("headers", "status", "reason", "says"),
    [
        ([AUTH], 411, "length_required", "Content-Length is required"),
        ([AUTH, ("Transfer-Encoding", "chunked")], 411, "length_required", "Transfer-Encoding"),
        ([AUTH, ("Content-Length", "abc")], 400, "bad_length", "'abc' is not a non-negative"),
        ([AUTH, ("Content-Length", "-1")], 400, "bad_length", "'-1' is not a non-negative"),
        ([AUTH, ("Content-Length", "+5")], 400, "bad_length", "'+5' is not a non-negative"),
        ([AUTH, ("Content-Length", "1_0")], 400, "bad_length", "'1_0' is not a non-negative"),
        (
            [AUTH, ("Content-Length", "5"), ("Content-Length", "5")],
            400,
            "bad_length",
            "more than one Content-Length",
        ),
        (
            [AUTH, ("Content-Length", "4097")],
            413,
            "too_large",
            "Content-Length 4097 is above the limit of 4096 bytes",
        ),
        ([AUTH, ("Content-Length", "9" * 30)], 413, "too_large", "above the limit of 4096 bytes"),
    ],
)
def test_content_length_is_refused_before_the_body_is_read(
    webhook: Webhook, headers: list[tuple[str, str]], status: int, reason: str, says: str
) -> None:
    """Only headers are sent: an answer (not a timeout) proves no body was awaited."""
    got, body = exchange(webhook.port, request_bytes(headers=headers))
    assert (got, reason) == (status, reason)
    assert says in body.decode()
    assert webhook.rejected(reason) == 1
    assert webhook.rejected("timeout") == 0
    assert webhook.triggers.pending_reasons == []


def _payload(**fields: Any) -> bytes:
    return json.dumps({"status": "firing", "alerts": [], **fields}).encode()


@pytest.mark.parametrize(
    ("body", "reason", "says"),
    [
        (b"not json", "malformed", "not JSON"),
        (b"\xff\xfe\x00", "malformed", "not JSON"),
        (b"[1, 2]", "invalid", "payload: Input should be a valid dictionary"),
        (_payload(alerts="x"), "invalid", "alerts: Input should be a valid list"),
        (_payload(alerts=[3]), "invalid", "alerts[0]: Input should be a valid dictionary"),
        (_payload(alerts=[{"labels": []}]), "invalid", "alerts[0].labels: Input should be"),
        (
            _payload(alerts=[{"labels": {"alertname": 5}}]),
            "invalid",
            "alerts[0].labels.alertname: Input should be a valid string, found 5",
        ),
        (_payload(alerts=[{"fingerprint": 1}]), "invalid", "alerts[0].fingerprint:"),
        (_payload(alerts=[{"startsAt": None}]), "invalid", "alerts[0].startsAt:"),
        (_payload(groupKey=["g"]), "invalid", "groupKey: Input should be a valid string"),
        (_payload(truncatedAlerts="3"), "invalid", "truncatedAlerts: Input should be"),
        (_payload(status="maybe"), "invalid", "status: Input should be 'firing' or 'resolved'"),
        (json.dumps({"alerts": []}).encode(), "invalid", "status: required field is missing"),
        (
            _payload(groupKey="a", x="[" * 40),
            "accepted",
            "",
        ),  # brackets inside a string do not nest
        (
            _payload(groupKey="b", x=[[[[[[[1]]]]]]]),
            "accepted",
            "",
        ),  # depth 8 (with the payload): the limit
        (_payload(x=[[[[[[[[1]]]]]]]]), "too_deep", "deeper than 8"),
        (_payload(x="!").replace(b'"!"', b"[" * 2000 + b"]" * 2000), "too_deep", "deeper"),
    ],
)
def test_payload_types_and_nesting_are_checked(
    webhook: Webhook, body: bytes, reason: str, says: str
) -> None:
    status, reply = exchange(webhook.port, request_bytes(body))
    if reason == "accepted":
        assert status == 202, reply
        return
    assert status == 400
    assert says in reply.decode()
    assert webhook.rejected(reason) == 1
    assert webhook.triggers.pending_reasons == []


def test_truncated_body_is_refused(webhook: Webhook) -> None:
    """The client declares more than it sends and half-closes: 400, not a wait."""
    data = request_bytes(firing()[:10], headers=[AUTH, ("Content-Length", "100")])
    status, reply = exchange(webhook.port, data, half_close=True)
    assert (status, reply) == (400, b"body ended after 10 of 100 bytes\n")
    assert webhook.rejected("truncated") == 1


def test_http_server_refusals_are_counted(webhook: Webhook) -> None:
    """http.server's own refusals, as one plain line like the webhook's."""
    brew = exchange(webhook.port, b"BREW /alerts HTTP/1.1\r\n\r\n")
    assert brew == (
        501,
        b"501 Unsupported method ('BREW'): Server does not support this operation\n",
    )
    assert exchange(webhook.port, b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n")[0] == 414
    many = b"POST /alerts HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n"
    too_many = (431, b"431 Too many headers: got more than 100 headers\n")
    assert exchange(webhook.port, many) == too_many
    assert webhook.rejected("protocol") == 3


def _dropped_after(port: int, first: bytes, trickle: bytes) -> bool:
    """Send ``first``, then ``trickle`` a byte every 0.1 s; whether the server closes the
    connection before 15 s (the deadline under test is 1 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(first)
        sock.settimeout(0.1)
        deadline = time.monotonic() + 15
        for byte in trickle * 200:
            if time.monotonic() > deadline:
                return False
            try:
                if sock.recv(1024) == b"":
                    return True
            except TimeoutError:
                pass
            except ConnectionResetError:
                return True
            try:
                sock.send(bytes([byte]))
            except OSError:
                return True
    return False


@pytest.mark.parametrize(
    ("first", "trickle"),
    [
        (b"POST /alerts HTTP/1.1\r\n", b"X-Slow: yes\r\n"),  # slow headers
        (request_bytes(headers=[AUTH, ("Content-Length", "4000")]), b" "),  # slow body
    ],
)
def test_slow_client_is_dropped_at_the_deadline(
    webhook: Webhook, first: bytes, trickle: bytes
) -> None:
    """A byte every 0.1 s never trips a per-read timeout; the 1 s deadline drops it."""
    assert _dropped_after(webhook.port, first, trickle)
    _wait_for(lambda: webhook.rejected("timeout") == 1, timeout_s=10)
    assert exchange(webhook.port, request_bytes(firing()))[0] == 202


def test_handlers_are_bounded_and_an_extra_connection_gets_503() -> None:
    one = Webhook(dataclasses.replace(SMALL, max_handlers=1, queue_wait_s=1.0, read_timeout_s=30))
    try:
        with socket.create_connection(("127.0.0.1", one.port), timeout=20) as holder:
            holder.sendall(b"POST /alerts HTTP/1.1\r\n")  # takes the only handler
            status, reply = exchange(one.port, b"")  # queued behind it, then refused
            assert (status, reply) == (503, b"busy: every handler is taken, retry\n")
            assert one.rejected("busy") == 1
        # the holder hung up: its handler is free again
        assert exchange(one.port, request_bytes(firing()))[0] == 202
    finally:
        one.close()


class SlowClients:
    """``count`` slow-loris sockets from ``source`` (a loopback address of their own, so the
    per-client share applies to them, not to the test's own requests from 127.0.0.1): each
    sends ``first``, then a byte of ``trickle`` per ``drip`` until the server hangs up."""

    def __init__(self, port: int, source: str, count: int, first: bytes, trickle: bytes) -> None:
        self.trickle, self.sent = trickle, 0
        self.open: list[socket.socket] = []
        self.replies: list[bytes] = []  # what each socket the server closed had received
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), 10, (source, 0))
            sock.sendall(first)
            sock.setblocking(False)
            self.open.append(sock)

    def drip(self) -> None:
        """One byte to every open socket; those the server closed are moved to ``replies``."""
        byte = bytes([self.trickle[self.sent % len(self.trickle)]])
        self.sent += 1
        for sock in list(self.open):
            received = b""
            try:
                while chunk := sock.recv(65536):
                    received += chunk
                closed = True  # b"": the server hung up
            except BlockingIOError:
                closed = False
            except OSError:
                closed = True
            if not closed:
                try:
                    sock.send(byte)
                except BlockingIOError:
                    pass
                except OSError:
                    closed = True
            if closed:
                self.open.remove(sock)
                self.replies.append(received)
                sock.close()

    def close(self) -> None:
        for sock in self.open:
            sock.close()


def _drip_until(clients: list[SlowClients], done: Any, limit_s: float = 60) -> None:
    """Drip every 0.05 s until ``done()``; the limit only guards against a hang."""
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, "the slow clients were never dropped"
        for c in clients:
            c.drip()
        time.sleep(0.05)


SHARE = WebhookLimits(read_timeout_s=5.0, max_handlers=8, max_per_client=4, queue_wait_s=6)
"""A deadline far above what a probe and an alert take, so none passes before they are
answered, even on a loaded machine."""
SLOW_HEADERS = b"POST /alerts HTTP/1.1\r\n"
SLOW_BODY = request_bytes(headers=[AUTH, ("Content-Length", "4000")])


def _unstarved(shapes: list[tuple[bool, int, bytes, bytes]]) -> None:
    """Slow clients of the given shapes (on the ops listener?, sockets, first bytes,
    trickle), each client from a loopback address of its own: each gets
    ``min(sockets, max_per_client)`` handlers and a 503 for the rest; while those are open
    (no deadline passed yet) a probe and a valid alert are answered; then every admitted one
    is dropped at its deadline although it keeps sending, without a reply."""
    hook = Webhook(SHARE).fresh()
    clients = [
        SlowClients(hook.ops_port if ops else hook.port, f"127.0.0.{i + 2}", n, first, trickle)
        for i, (ops, n, first, trickle) in enumerate(shapes)
    ]
    share = [min(n, SHARE.max_per_client) for _, n, _, _ in shapes]
    try:
        _drip_until(clients, lambda: sum(len(c.open) for c in clients) <= sum(share))
        assert [len(c.open) for c in clients] == share
        assert hook.rejected("per_client") == sum(n for _, n, _, _ in shapes) - sum(share)
        # A refused socket that dripped another byte before reading may see the server's close
        # as a reset (Linux resets a close with unread data), which drops the 503 it had been
        # sent: b"" there; the count above is the server's own, every reply seen is a 503.
        refusals = {r.split(b"\r\n")[0] for c in clients for r in c.replies} - {b""}
        assert refusals <= {b"HTTP/1.0 503 Service Unavailable"}
        probe = exchange(hook.ops_port, b"GET /healthz HTTP/1.0\r\n\r\n")
        alert = exchange(hook.port, request_bytes(firing()))
        assert (probe, alert[0]) == ((200, b"ok\n"), 202)
        # answered while the slow ones were held: none had reached its deadline yet
        assert hook.rejected("timeout") == 0
        assert hook.triggers.pending_reasons == ["alert FlexEvictionRateHigh"]
        _drip_until(clients, lambda: not any(c.open for c in clients))
        assert hook.rejected("timeout") == sum(share)  # dropped by the deadline
        for c, admitted in zip(clients, share, strict=True):
            assert c.replies[len(c.replies) - admitted :] == [b""] * admitted
    finally:
        for c in clients:
            c.close()
        hook.close()


@pytest.mark.heavy
@pytest.mark.parametrize("first", [SLOW_HEADERS, SLOW_BODY], ids=["headers", "body"])
def test_slow_clients_cannot_starve_the_probes_or_delay_an_alert(first: bytes) -> None:
    """Forty slow-loris sockets on each listener, a header line dripped a byte at a time."""
    _unstarved(
        [
            (False, 40, first, b"X-Slow: yes\r\n"),
            (True, 40, b"GET /healthz HTTP/1.1\r\n", b"X: y\r\n"),
        ]
    )


_NEVER_DONE = [
    (SLOW_HEADERS, b"X-Slow: yes\r\n"),
    (SLOW_HEADERS, b"x"),
    (b"POST /al", b"x"),
    (b"GET /healthz HTTP/1.1\r\nX: ", b"y"),
]
"""First bytes and trickles that never complete a request's headers within the deadline
(under 100 header lines, no empty line): a server that answers one early has read a
request, which is not what this tests."""
_slow_client = st.one_of(
    st.tuples(st.booleans(), st.integers(1, 50), *map(st.just, pair)) for pair in _NEVER_DONE
) | st.tuples(st.just(False), st.integers(1, 50), st.just(SLOW_BODY), st.sampled_from([b" ", b"{"]))
"""A slow client: listener (ops?), sockets, first bytes, trickle. A slow body only on the
webhook's port (the ops listener answers a complete POST with 501 at once)."""


@pytest.mark.slow
@settings(max_examples=4, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(shapes=st.lists(_slow_client, min_size=1, max_size=2, unique_by=lambda c: c[0]))
def test_no_slow_client_starves_the_probes_or_an_alert(
    shapes: list[tuple[bool, int, bytes, bytes]],
) -> None:
    """A slow client on either listener or both, of any request shape, trickle and number
    of sockets (one example takes the 5 s deadline: few examples, no shrinking). One client
    per listener: two take all eight handlers of one (4 each), and then a probe waits for
    the first deadline, as docs/design/webhook.md says."""
    _unstarved(shapes)


def test_each_listener_serves_only_its_own_paths(webhook: Webhook) -> None:
    """The webhook port has no probe to starve, the ops port takes no alert."""
    assert exchange(webhook.port, b"GET /healthz HTTP/1.0\r\n\r\n")[0] == 404
    assert exchange(webhook.port, b"GET /metrics HTTP/1.0\r\n\r\n")[0] == 404
    assert exchange(webhook.ops_port, request_bytes(firing()))[0] == 501
    status, body = exchange(webhook.ops_port, b"GET /metrics HTTP/1.0\r\n\r\n")
    assert status == 200 and b"gpupool_tuner_webhook_rejected_total" in body
    assert webhook.triggers.pending_reasons == []


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=12,
)
_alert = st.fixed_dictionaries(
    {},
    optional={
        "labels": st.dictionaries(st.sampled_from(["alertname", "x"]), st.text() | _json) | _json,
        "fingerprint": st.text() | _json,
        "startsAt": st.text() | _json,
    },
)
_shaped = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved"]) | _json,
        "alerts": st.lists(_alert | _json, max_size=3) | _json,
    },
    optional={"groupKey": st.text() | _json, "truncatedAlerts": st.integers() | _json},
)
"""Alertmanager-shaped payloads with any value anywhere, and any JSON at all."""


def _usable_or_refused(body: bytes) -> None:
    """Parsing ends in a payload the handler can use (key, alert names) or a 400 Refusal."""
    try:
        payload = parse_notification(body, max_depth=8)
    except Refusal as refusal:
        assert refusal.status == 400 and str(refusal)
        return
    assert payload["status"] in ("firing", "resolved")
    assert notification_key(payload)
    assert all(isinstance(a.get("labels", {}).get("alertname", ""), str) for a in payload["alerts"])


@given(_shaped | _json)
def test_any_json_is_usable_or_refused_never_raised(document: Any) -> None:
    _usable_or_refused(json.dumps(document).encode())


@given(st.binary(max_size=512))
def test_any_bytes_are_usable_or_refused_never_raised(body: bytes) -> None:
    _usable_or_refused(body)


def test_every_limit_is_documented_with_its_default() -> None:
    docs = (REPO / "docs" / "tuner.md").read_text()
    for field in dataclasses.fields(WebhookLimits):
        default = getattr(DEFAULT_LIMITS, field.name)
        rows = [line for line in docs.splitlines() if line.startswith(f"| `{field.name}` |")]
        assert len(rows) == 1, f"docs/tuner.md has no row for {field.name}"
        assert f"`{default}`" in rows[0], f"docs/tuner.md gives another default for {field.name}"


def test_nesting_beyond_the_recursion_limit_is_refused_even_with_a_huge_bound() -> None:
    """A bound set above Python's recursion limit leaves ``json.loads`` to hit it: still a
    400, never a RecursionError."""
    with pytest.raises(Refusal, match="deeper than 1000000") as refused:
        parse_notification(b"[" * 100_000 + b"]" * 100_000, max_depth=1_000_000)
    assert (refused.value.status, refused.value.reason) == (400, "too_deep")

"""The rendered drain commands, run against a stand-in /health: the marker decides readiness.

Fast and local (no vLLM): a stdlib HTTP server answers ``/health`` with the status the test
sets, and the commands run exactly as the Deployment renders them (tests/serving/pod.py).
The real-server sequence is tests/serving/test_eviction_sequence.py.
"""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.builders.vllm_container import DRAIN_MARKER
from policy import PoolPolicy
from tests.harness.servers import free_port
from tests.infra.policies import policy_with
from tests.serving.pod import PodCommands, pod_commands, probe_passes

pytestmark = pytest.mark.process


class Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    Health.status = 200


def _policy(port: int, prestop: int = 2) -> PoolPolicy:
    return policy_with(
        {
            "workloads.0.port": port,
            "disruption.readiness_period_s": 1,
            "disruption.readiness_failure_threshold": 1,
            "disruption.prestop_delay_s": prestop,
        }
    )


def _commands(port: int, drain: Path, prestop: int = 2) -> PodCommands:
    policy = _policy(port, prestop)
    return pod_commands(policy, policy.workloads[0], drain)


def test_probe_follows_health_while_no_marker(
    server: http.server.HTTPServer, tmp_path: Path
) -> None:
    commands = _commands(server.server_port, tmp_path)
    assert probe_passes(commands)
    Health.status = 503  # vLLM's answer once the engine is dead
    assert not probe_passes(commands)


def test_probe_fails_on_a_closed_port(tmp_path: Path) -> None:
    assert not probe_passes(_commands(free_port(), tmp_path))  # nothing listens there


def test_marker_fails_the_probe_while_health_passes(
    server: http.server.HTTPServer, tmp_path: Path
) -> None:
    commands = _commands(server.server_port, tmp_path, prestop=2)
    assert probe_passes(commands)
    started = time.monotonic()
    subprocess.run(commands.prestop, check=True, timeout=30)
    slept = time.monotonic() - started
    marker = tmp_path / Path(DRAIN_MARKER).name
    assert marker.exists()
    assert slept >= 2  # the hook returns (and the kubelet sends SIGTERM) only after the sleep
    assert not probe_passes(commands)  # /health still answers 200: the marker decides
    subprocess.run(commands.poststart, check=True, timeout=30)
    assert not marker.exists()
    assert probe_passes(commands)


def test_probe_fails_while_the_prestop_hook_still_sleeps(
    server: http.server.HTTPServer, tmp_path: Path
) -> None:
    commands = _commands(server.server_port, tmp_path, prestop=10)
    hook = subprocess.Popen(commands.prestop)
    try:
        deadline = time.monotonic() + 10
        while probe_passes(commands):
            assert time.monotonic() < deadline, "readiness still passes under the preStop hook"
            time.sleep(0.05)
        assert hook.poll() is None  # readiness failed before the hook returned
    finally:
        hook.kill()
        hook.wait()

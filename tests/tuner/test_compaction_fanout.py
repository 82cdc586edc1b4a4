"""The tuner's fan-out to every pod behind a headless Service, against real sidecar servers.

Two sidecar HTTP servers (``serve_http``) listen on 127.0.0.1 and 127.0.0.2 at the same port,
as two pods behind one Service would; the resolver stands in for cluster DNS and returns
their addresses. No plugin is needed: a request is only queued until the next poll.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policy import DEFAULT_POLICY, load_policy
from runtime.cli.app import app
from runtime.kvcache.control import ControlClient
from runtime.kvcache.sidecar.service import CompactionSidecar, serve_http
from runtime.tuner import compaction
from runtime.tuner.proposals import CompactionRequest, Evidence
from tests.harness.servers import free_port

POLICY = load_policy(DEFAULT_POLICY)
ADDRESSES = ["127.0.0.1", "127.0.0.2"]
TOKEN = secrets.token_hex(8)
PAYLOAD = compaction.compaction_payload(
    CompactionRequest("sparse cache", (Evidence("s", "c", "v"),)), policy=POLICY, at=1.0
)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[tuple[int, list[CompactionSidecar]]]:
    """Two sidecars of the shipped policy's first workload on one port, two addresses."""
    port = free_port()
    workers, servers = [], []
    client = ControlClient(tmp_path / "absent.sock", TOKEN)
    for address in ADDRESSES:
        worker = CompactionSidecar(
            POLICY, "file:///absent", client, workload=POLICY.workloads[0].name
        )
        try:
            servers.append(serve_http(worker, address, port, TOKEN))
        except OSError as exc:
            pytest.fail(f"cannot bind {address}:{port} (loopback range expected): {exc}")
        workers.append(worker)
    yield port, workers
    for server in servers:
        server.shutdown()
        server.server_close()


def test_every_resolved_pod_receives_the_request(
    pods: tuple[int, list[CompactionSidecar]],
) -> None:
    port, workers = pods
    asked: list[tuple[str, int]] = []

    def resolver(host: str, at: int) -> list[str]:
        asked.append((host, at))
        return list(ADDRESSES)

    service = f"llama-8b-flex-kv-compaction.gpupool-flex.svc:{port}"
    report = compaction.fan_out(service, PAYLOAD, token=TOKEN, resolver=resolver)
    assert asked == [("llama-8b-flex-kv-compaction.gpupool-flex.svc", port)]
    assert report.accepted == tuple(ADDRESSES) and report.failed == ()
    assert [w.compaction_order and w.compaction_order.id for w in workers] == [PAYLOAD["id"]] * 2


def test_refusals_and_dead_pods_are_counted_not_raised(
    pods: tuple[int, list[CompactionSidecar]],
) -> None:
    port, workers = pods
    dead = "127.0.0.3"  # nothing listens there
    report = compaction.fan_out(
        f"svc:{port}", PAYLOAD, token="wrong", resolver=lambda _h, _p: [*ADDRESSES, dead]
    )
    assert report.accepted == ()
    assert [address for address, _ in report.failed] == [*ADDRESSES, dead]
    assert "401" in report.failed[0][1]
    assert all(w.compaction_order is None for w in workers)


def test_a_name_without_addresses_is_a_failure() -> None:
    report = compaction.fan_out("nothing.invalid:9400", PAYLOAD, token=TOKEN)
    assert report.accepted == ()
    assert report.failed == (("nothing.invalid:9400", "resolves to no address"),)


def test_resolve_uses_the_system_resolver() -> None:
    assert "127.0.0.1" in compaction.resolve("localhost", 9400) or "::1" in compaction.resolve(
        "localhost", 9400
    )
    assert compaction.resolve("nothing.invalid", 9400) == []


def test_outcome_is_partial_when_some_targets_failed(
    pods: tuple[int, list[CompactionSidecar]],
) -> None:
    port, _ = pods
    reachable = f"127.0.0.1:{port}"
    assert compaction.send(PAYLOAD, None, [reachable], TOKEN) == "delivered"
    assert compaction.send(PAYLOAD, None, [reachable, "nothing.invalid:1"], TOKEN) == "partial"
    assert compaction.send(PAYLOAD, None, ["nothing.invalid:1"], TOKEN) == "failed"


def test_cli_refuses_a_service_without_a_port(tmp_path: Path) -> None:
    args = ["tune", "--prometheus", "http://127.0.0.1:1", "--repo", str(tmp_path), "--once"]
    result = CliRunner().invoke(app, [*args, "--compaction-service", "nohostport"])
    assert result.exit_code == 1
    assert "--compaction-service: expected HOST:PORT, found 'nohostport'" in result.output

"""The sidecar picks up a changed policy file between polls, the way the kubelet changes it.

Real files in a temporary directory: the ConfigMap text the Pulumi program renders, mounted
either as a plain file or in the kubelet's layout (``pool.yaml -> ..data/pool.yaml``,
``..data -> ..<timestamp>``, swapped by renaming a new ``..data`` symlink over the old one).
The plugin's side of the control socket is a real ``ControlServer`` answering for a pool that
never changes; the instance's ``/metrics`` page is a file read through a ``file://`` URL.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from infra.builders.compaction_sidecar import POLICY_DIR, POLICY_VOLUME, compaction_sidecar
from infra.builders.policy_config import policy_text, sidecar_policy
from policy import DEFAULT_POLICY, PolicyError, PoolPolicy, load_policy
from runtime.cli.app import app
from runtime.kvcache.control import ControlClient, ControlServer
from runtime.kvcache.sidecar.policy_file import PolicyFile
from runtime.kvcache.sidecar.service import CompactionSidecar
from tests.harness.servers import free_port

USAGE = 0.45
"""KV usage the instance reports: between the two thresholds the tests switch between."""
LOW, HIGH = 0.40, 0.50
METRICS = (
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    f'vllm:kv_cache_usage_perc{{engine="0"}} {USAGE}\n'
    "# TYPE vllm:prefix_cache_queries counter\n"
    'vllm:prefix_cache_queries_total{engine="0"} 640.0\n'
    "# TYPE vllm:prefix_cache_hits counter\n"
    'vllm:prefix_cache_hits_total{engine="0"} 600.0\n'
)
POOL = {
    "usable_blocks": 1000, "original_blocks": 1000, "occupied_blocks": 120, "held_blocks": 120,
    "max_model_len": 512, "block_size": 32, "blocks_short": 0,
}  # fmt: skip

Writer = Callable[[str], None]


def configmap_text(compaction_usage_below: float) -> str:
    """What the ``gpupool-policy`` ConfigMap holds for the shipped policy with one threshold."""
    policy = load_policy(DEFAULT_POLICY)
    kv = policy.kv_cache.model_copy(update={"compaction_usage_below": compaction_usage_below})
    return policy_text(sidecar_policy(policy.model_copy(update={"kv_cache": kv})))


def invalid_text() -> tuple[str, int]:
    """A version whose threshold breaks an invariant, and the line it is on."""
    lines = configmap_text(HIGH).splitlines()
    index = next(i for i, line in enumerate(lines) if "compaction_usage_below:" in line)
    lines[index] = "  compaction_usage_below: 0.9"
    return "\n".join(lines) + "\n", index + 1


class KubeletVolume:
    """A ConfigMap volume as the kubelet writes it (its AtomicWriter's symlink swap)."""

    def __init__(self, root: Path) -> None:
        self.root, self.versions = root, 0
        self.path = root / "pool.yaml"

    def write(self, text: str) -> None:
        self.versions += 1
        data = self.root / "..data"
        old = data.resolve() if data.exists() else None
        fresh = self.root / f"..2026_11_30_03_00_{self.versions:02d}.000000001"
        fresh.mkdir()
        (fresh / "pool.yaml").write_text(text)
        staging = self.root / "..data_tmp"
        staging.symlink_to(fresh.name)
        os.rename(staging, data)
        if not self.path.is_symlink():
            self.path.symlink_to("..data/pool.yaml")
        if old is not None:
            shutil.rmtree(old)


@pytest.fixture(params=["kubelet", "in-place"])
def mounted(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Writer]:
    """The policy file's path and how a new version reaches it."""
    if request.param == "kubelet":
        volume = KubeletVolume(tmp_path / "policy")
        volume.root.mkdir()
        return volume.path, volume.write
    path = tmp_path / "pool.yaml"
    return path, path.write_text


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[ControlClient, list[str]]]:
    """A control socket answering for an unchanging pool; the list records the ops asked."""
    asked: list[str] = []

    def handle(op: str, args: dict[str, Any]) -> dict[str, Any]:
        asked.append(op)
        if op == "status":
            return dict(POOL)
        return {"status": "done", "usable_blocks": args.get("num_blocks", POOL["usable_blocks"])}

    token = secrets.token_hex(8)
    (tmp_path / "token").write_text(token)  # for the command line
    server = ControlServer(tmp_path / "ctl" / "kv.sock", token, handle)
    yield ControlClient(server.path, token), asked
    server.close()


def started_worker(
    mounted: tuple[Path, Writer], client: ControlClient, tmp_path: Path, threshold: float
) -> CompactionSidecar:
    path, write = mounted
    write(configmap_text(threshold))
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(METRICS)
    policy_file = PolicyFile(path)
    return CompactionSidecar(policy_file.load(), metrics.as_uri(), client, policy_file)


def value(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    found = registry.get_sample_value(name, labels or {})
    assert found is not None, f"{name} is not exported"
    return found


def test_a_valid_change_decides_the_next_poll(
    mounted: tuple[Path, Writer], plugin: tuple[ControlClient, list[str]], tmp_path: Path
) -> None:
    client, asked = plugin
    worker = started_worker(mounted, client, tmp_path, LOW)
    held, _ = worker.poll()
    assert held.action == "none" and f">= {LOW:.2f}" in held.reason, held

    mounted[1](configmap_text(HIGH))
    decision, reply = worker.poll()
    assert worker.policy.kv_cache.compaction_usage_below == HIGH
    assert decision.action == "shrink" and f"< {HIGH:.2f}" in decision.reason, decision
    assert reply is not None and reply["status"] == "done" and asked[-1] == "shrink"
    assert value(worker.registry, "gpupool_kv_sidecar_policy_generation") == 2
    assert worker.policy_file is not None
    assert value(
        worker.registry, "gpupool_kv_sidecar_policy_info", {"sha256": worker.policy_file.digest}
    )
    assert value(worker.registry, "gpupool_kv_sidecar_policy_reload_errors_total") == 0


def test_an_invalid_change_keeps_the_last_good_policy_and_is_reported_once(
    mounted: tuple[Path, Writer],
    plugin: tuple[ControlClient, list[str]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path, write = mounted
    worker = started_worker(mounted, plugin[0], tmp_path, LOW)
    assert worker.policy_file is not None
    good_digest = worker.policy_file.digest
    text, line = invalid_text()
    write(text)
    with caplog.at_level(logging.ERROR, logger="runtime.kvcache.sidecar.service"):
        for _ in range(3):
            decision, _ = worker.poll()
            assert decision.action == "none" and f">= {LOW:.2f}" in decision.reason, decision
    assert worker.policy.kv_cache.compaction_usage_below == LOW
    assert value(worker.registry, "gpupool_kv_sidecar_policy_reload_errors_total") == 1
    assert value(worker.registry, "gpupool_kv_sidecar_policy_generation") == 1
    assert worker.policy_file.digest == good_digest
    assert len(caplog.records) == 1, caplog.text
    assert f"{path}:{line}: kv_cache.compaction_usage_below" in caplog.text

    write(configmap_text(HIGH))  # the fix arrives: taken as usual
    decision, _ = worker.poll()
    assert decision.action == "shrink", decision
    assert value(worker.registry, "gpupool_kv_sidecar_policy_generation") == 2
    assert value(worker.registry, "gpupool_kv_sidecar_policy_reload_errors_total") == 1


def test_an_unchanged_file_is_not_reloaded(mounted: tuple[Path, Writer]) -> None:
    path, write = mounted
    write(configmap_text(LOW))
    policy_file = PolicyFile(path)
    first = policy_file.load()
    digest = policy_file.digest
    assert policy_file.refresh().outcome == "unchanged"
    write(configmap_text(LOW))  # same content again (for the kubelet: a new directory)
    assert policy_file.refresh().outcome == "unchanged"
    assert (policy_file.generation, policy_file.digest) == (1, digest)
    assert first.kv_cache.compaction_usage_below == LOW


def test_the_kubelet_swap_is_seen_through_the_symlink(tmp_path: Path) -> None:
    volume = KubeletVolume(tmp_path)
    volume.write(configmap_text(LOW))
    policy_file = PolicyFile(volume.path)
    policy_file.load()
    before = volume.path.resolve()
    volume.write(configmap_text(HIGH))
    assert volume.path.resolve() != before and not before.exists()
    reload = policy_file.refresh()
    assert reload.outcome == "loaded" and reload.policy is not None
    assert reload.policy.kv_cache.compaction_usage_below == HIGH


def test_a_missing_file_keeps_the_policy_and_a_bad_first_version_is_fatal(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(configmap_text(LOW))
    policy_file = PolicyFile(path)
    policy_file.load()
    path.unlink()
    gone = policy_file.refresh()
    assert gone.outcome == "rejected" and "file not found" in str(gone.problems[0])
    assert policy_file.refresh().outcome == "unchanged"
    assert policy_file.generation == 1

    path.write_text(invalid_text()[0])
    with pytest.raises(PolicyError, match="compaction_usage_below"):
        PolicyFile(path).load()


def test_without_a_policy_file_the_policy_stays_fixed(
    plugin: tuple[ControlClient, list[str]], tmp_path: Path
) -> None:
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(METRICS)
    policy: PoolPolicy = load_policy(DEFAULT_POLICY)
    worker = CompactionSidecar(policy, metrics.as_uri(), plugin[0])
    worker.poll()
    assert worker.policy is policy
    assert value(worker.registry, "gpupool_kv_sidecar_policy_generation") == 0


def test_the_sidecar_command_starts_only_on_a_valid_policy(
    mounted: tuple[Path, Writer], plugin: tuple[ControlClient, list[str]], tmp_path: Path
) -> None:
    path, write = mounted
    token_file = tmp_path / "token"  # written by the plugin fixture
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(METRICS)
    command = [
        "kv-sidecar", "run", "--policy", str(path), "--socket", str(plugin[0].path),
        "--token-file", str(token_file), "--metrics-url", metrics.as_uri(),
        "--listen", f"127.0.0.1:{free_port()}", "--polls", "1",
    ]  # fmt: skip
    text, line = invalid_text()
    write(text)
    refused = CliRunner().invoke(app, command)
    assert refused.exit_code == 1 and f"{path}:{line}: kv_cache" in refused.output, refused.output
    write(configmap_text(LOW))
    one_poll = CliRunner().invoke(app, command)
    assert one_poll.exit_code == 0, one_poll.output
    assert json.loads(one_poll.stderr.strip().splitlines()[-1])["decision"]["action"] == "none"


def test_the_sidecar_mounts_the_whole_configmap_directory() -> None:
    """The kubelet never updates a ``subPath`` mount, so the policy must be mounted whole."""
    policy = load_policy(DEFAULT_POLICY)
    if not policy.workloads:
        pytest.fail("the shipped policy declares no flex workload to attach the sidecar to")
    container = compaction_sidecar(policy, policy.workloads[0])
    mount = next(m for m in container["volumeMounts"] if m["name"] == POLICY_VOLUME)
    assert "subPath" not in mount and mount["mountPath"] == POLICY_DIR
    args = container["args"]
    assert Path(args[args.index("--policy") + 1]).parent == Path(POLICY_DIR)

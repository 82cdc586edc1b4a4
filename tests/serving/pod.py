"""The flex pod's shutdown commands, taken from the rendered Deployment and run outside Kubernetes.

The tests run exactly the commands ``infra.builders.vllm_container`` renders (postStart, readiness
probe, preStop) with one substitution: the drain ``emptyDir``, mounted in the pod at
``DRAIN_DIR``, is a temporary directory here, the way a volume mount maps a path.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from infra.builders.meta import Manifest
from infra.builders.vllm_container import DRAIN_DIR
from infra.builders.workload import deployment
from policy import PoolPolicy
from policy.workloads import FlexWorkload


@dataclass(frozen=True)
class PodCommands:
    """The vLLM container's lifecycle and readiness commands, rebased onto a local drain dir."""

    poststart: list[str]
    prestop: list[str]
    readiness: list[str]
    readiness_timeout_s: int
    readiness_period_s: int
    readiness_failures: int


def vllm_container(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """The rendered vLLM container of ``workload``'s Deployment."""
    pod = deployment(policy, workload, ["--model", workload.model])["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    return container


def pod_commands(policy: PoolPolicy, workload: FlexWorkload, drain_dir: Path) -> PodCommands:
    """The rendered commands with the drain volume's mount path replaced by ``drain_dir``."""
    container = vllm_container(policy, workload)
    probe = container["readinessProbe"]

    def local(command: list[str]) -> list[str]:
        return [part.replace(DRAIN_DIR, str(drain_dir)) for part in command]

    return PodCommands(
        poststart=local(container["lifecycle"]["postStart"]["exec"]["command"]),
        prestop=local(container["lifecycle"]["preStop"]["exec"]["command"]),
        readiness=local(probe["exec"]["command"]),
        readiness_timeout_s=probe["timeoutSeconds"],
        readiness_period_s=probe["periodSeconds"],
        readiness_failures=probe["failureThreshold"],
    )


def probe_passes(commands: PodCommands) -> bool:
    """One readiness probe, as the kubelet runs it: exit 0 within ``timeoutSeconds``."""
    try:
        result = subprocess.run(
            commands.readiness,
            capture_output=True,
            timeout=commands.readiness_timeout_s + 1,  # the kubelet's own exec overhead
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


@dataclass
class Kubelet:
    """The kubelet's readiness bookkeeping for one container: a probe every period, Ready
    turns false after ``failureThreshold`` consecutive failures (and true after one pass)."""

    commands: PodCommands
    ready: bool = False
    failures: int = 0
    unready_at: float | None = None
    """``time.monotonic()`` when Ready last turned false after having been true."""

    def probe(self) -> bool:
        """Run one probe and update Ready; return Ready."""
        if probe_passes(self.commands):
            self.failures = 0
            self.ready = True
        else:
            self.failures += 1
            if self.ready and self.failures >= self.commands.readiness_failures:
                self.ready = False
                self.unready_at = time.monotonic()
        return self.ready

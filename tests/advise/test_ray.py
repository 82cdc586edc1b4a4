"""A sweep on a real local Ray cluster gives what the process pool gives."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from policy import DEFAULT_POLICY, load_policy
from runtime.advise.front import rate, recommend
from runtime.advise.levers import grid, parse_vary
from runtime.advise.sweep import Sweep, run_sweep
from runtime.sim.options import DEMO
from tests.harness.servers import free_port

RAY = Path(sys.executable).with_name("ray")


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``ray start --head`` on a free port (2 CPUs) with token authentication (the default
    of local clusters since Ray 2.59: the driver needs the same token), stopped after the
    module."""
    if not RAY.is_file():
        pytest.fail(f"{RAY} is missing: `make install-test` installs gpupool[ray]")
    port = free_port()
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    temp = tmp_path_factory.mktemp("ray")
    command = [str(RAY), "start", "--head", f"--port={port}", "--num-cpus=2"]
    command += ["--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"]
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(temp, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _front(sweep: Sweep) -> tuple[set[str], str | None, list[float]]:
    rated = rate(sweep.points, sweep.fixed)
    pick = recommend(rated)
    harvest = [p.summary.harvested_gpu_h for p in sweep.points if p.summary is not None]
    front = {r.point.variant.name for r in rated if r.on_front}
    return front, None if pick is None else pick.point.variant.name, harvest


@pytest.mark.slow
def test_ray_and_the_process_pool_agree(ray_head: str) -> None:
    policy = load_policy()
    variants = grid(
        policy,
        [parse_vary("gpu-prod.lend_idle=true,false"), parse_vary("gpu-prod.reserve_ratio=0,0.2")],
    )
    options = replace(DEMO, hours=1.0)
    common = {"jobs": 2, "budget_s": 600.0}
    local = run_sweep(policy, DEFAULT_POLICY.parent, variants, options, **common)  # type: ignore[arg-type]
    remote = run_sweep(
        policy,
        DEFAULT_POLICY.parent,
        variants,
        options,
        ray_address=ray_head,
        **common,  # type: ignore[arg-type]
    )
    assert all(p.summary is not None for p in remote.points), [p.problem for p in remote.points]
    assert (local.backend, remote.backend) == ("processes", f"ray {ray_head}")
    assert _front(remote) == _front(local)
    assert remote.fixed == local.fixed

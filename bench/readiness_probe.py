"""Benchmark: the CPU cost of the flex pods' exec readiness probe (docs/serving.md).

    .venv/bin/python bench/readiness_probe.py [--probes 200]

The probe (``infra.builders.vllm_container.readiness_command``, as rendered) starts ``sh`` and
``python3 -I -S`` every ``disruption.readiness_period_s`` to ask vLLM's ``/health``. Here it
runs against a local stdlib HTTP server answering ``/health`` with 200 (what it costs is the
probe's processes, not vLLM's handler), ``--probes`` times in a row. CPU is the children's
user + system time (``getrusage``). Baselines in the same run: ``sh -c true`` (the least any
exec probe costs), the same check through ``urllib.request``, and ``python3 -I -S -c pass``
(the interpreter's start alone). ``python3`` is this interpreter's real binary, put first on
``PATH`` (a version manager's ``python3`` shim would add its own start-up to every run; the
vLLM image's ``python3`` is a binary). Printed:
CPU ms and wall ms per probe, the ratios to both baselines, and the share of one core the
probe takes at the policy's period. Not measured here: the container runtime's own exec work
on a node (runc/shim), which every exec probe pays the same.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.builders.vllm_container import readiness_command
from policy import DEFAULT_POLICY, load_policy

URLLIB_CHECK = "import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=1)"
"""The stdlib HTTP client doing the probe's check (gpupool's probe before it spoke raw HTTP)."""


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(command: list[str], probes: int, env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per run of ``command``; every run must exit 0."""
    cpu, start = _children_cpu_s(), time.perf_counter()
    for _ in range(probes):
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL, env=env)
    return (_children_cpu_s() - cpu) / probes, (time.perf_counter() - start) / probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=200)
    args = parser.parse_args()
    period_s = load_policy(DEFAULT_POLICY).disruption.readiness_period_s
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/health"
    rows = {
        "readiness probe (as rendered)": readiness_command(port, period_s),
        "baseline: sh -c true": ["sh", "-c", "true"],
        "baseline: the same check with urllib": ["python3", "-I", "-S", "-c", URLLIB_CHECK, url],
        "baseline: python3 -I -S -c pass": ["python3", "-I", "-S", "-c", "pass"],
    }
    with tempfile.TemporaryDirectory() as bin_dir:
        os.symlink(os.path.realpath(sys.executable), Path(bin_dir) / "python3")
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        for command in rows.values():  # warm the page cache
            subprocess.run(command, check=True, env=env)
        load = os.getloadavg()
        results = {name: measure(command, args.probes, env) for name, command in rows.items()}
    server.shutdown()
    probe_cpu, probe_wall = results["readiness probe (as rendered)"]
    print(f"{args.probes} runs each; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name, (cpu, wall) in results.items():
        print(
            f"{name:38} cpu {cpu * 1e3:6.2f} ms  wall {wall * 1e3:6.2f} ms  "
            f"probe/this cpu {probe_cpu / cpu:5.2f}x"
        )
    print(
        f"at readiness_period_s={period_s}: {probe_cpu / period_s * 100:.2f} % of one core "
        f"per flex pod ({probe_wall * 1e3:.1f} ms of the {period_s * 1e3:.0f} ms period)"
    )


if __name__ == "__main__":
    main()

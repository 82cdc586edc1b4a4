"""Peak memory of reading and replaying a 200 MB trace, and the time to validate a policy
listing 150,000 nodes, each against a floor measured in the same run.

Memory is each child process's own peak RSS (``ru_maxrss``), so one measurement never sees
another's. The replay is measured twice: over ``--hours`` and over the whole trace (to its
last arrival), which shows whether its memory grows with the requests it replays. Floors:
the interpreter with gpupool imported, and the whole-file read the trace readers did before
streaming (bytes, text and a string a line, before any parsing). For the nodes, the floor is
the round-trip YAML parse of the same file, which the loader used before it parsed with
libyaml (bench/policy_parse.py times ``gpupool validate`` itself).

    python bench/bounded.py [--megabytes 200] [--nodes 150000] [--hours 1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policy import DEFAULT_POLICY  # noqa: E402
from tests.harness.hostile import write_azure_trace, write_mooncake_trace  # noqa: E402

IMPORTS = (
    "import sys\nfrom pathlib import Path\nfrom runtime.cli.app import app\n"
    "from runtime.sim.traces import load_flex_trace\n"
)
REPLAY = (
    "sys.argv = ['gpupool', 'whatif', '--flex-trace', FILE, '--hours', HOURS]\n"
    "try:\n    app()\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
)
"""What every child imports first: the floor is the same for all."""

PEAK = "import resource\nprint('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"

FLOORS = {
    "imports": "",
    "whole-file read": "lines = Path(FILE).read_bytes().decode().split('\\n')\n",
    "load": "trace = load_flex_trace(Path(FILE))\n",
    "replay": REPLAY,
}


def child(program: str) -> str:
    """The standard output of ``program`` run by a fresh interpreter in the repository."""
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
        cwd=ROOT,
    ).stdout


def peak_mib(code: str, file: Path, hours: float) -> float:
    """Peak RSS of a child running ``code`` (``FILE``: the trace, ``HOURS``: the replay)."""
    body = code.replace("FILE", repr(str(file))).replace("HOURS", repr(f"{hours:g}"))
    program = IMPORTS + body + PEAK
    line = next(x for x in reversed(child(program).splitlines()) if x.startswith("peak "))
    return int(line.split()[1]) / 1024


def span_h(file: Path) -> float:
    """The trace's length in hours, rounded up, read in a child: a child's ``ru_maxrss``
    starts from its parent's at the fork, so the parent must not load a trace itself."""
    code = f"print(load_flex_trace(Path({str(file)!r})).duration_s)\n"
    return math.ceil(float(child(IMPORTS + code).split()[-1]) / 36) / 100


def nodes_policy(folder: Path, nodes: int) -> Path:
    """The default policy with ``nodes`` node names listed in its first pool."""
    names = ", ".join(f"node-{i}.ec2.internal" for i in range(nodes))
    text = DEFAULT_POLICY.read_text().replace(
        "    nodes: [gpupool-worker]", f"    nodes: [{names}]", 1
    )
    path = folder / "pool.yaml"
    path.write_text(text)
    (folder / "models").symlink_to(DEFAULT_POLICY.parent / "models")
    return path


def timed_s(code: str, path: Path) -> float:
    program = (
        "import time\nfrom pathlib import Path\n"
        "from policy.loader import read_document, read_yaml, parse_policy, PolicyError\n"
        f"path = Path({str(path)!r})\nstart = time.perf_counter()\n{code}"
        "print('took', time.perf_counter() - start)\n"
    )
    return float(child(program).split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=200)
    parser.add_argument("--nodes", type=int, default=150_000)
    parser.add_argument("--hours", type=float, default=1)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="gpupool-bounded-") as scratch:
        folder = Path(scratch)
        for name, write in (("azure", write_azure_trace), ("mooncake", write_mooncake_trace)):
            path = folder / f"{name}.{'csv' if name == 'azure' else 'jsonl'}"
            write(path, int(args.megabytes * 1024 * 1024))
            size = path.stat().st_size / 1024 / 1024
            figures = {k: round(peak_mib(c, path, args.hours), 1) for k, c in FLOORS.items()}
            full_h = span_h(path)
            figures[f"full-length replay ({full_h:g} h)"] = round(peak_mib(REPLAY, path, full_h), 1)
            results[name] = {"file_mib": round(size, 1), "peak_rss_mib": figures}
            print(f"{name}: {size:.0f} MiB file, peak RSS MiB {figures}", flush=True)
        policy = nodes_policy(folder, args.nodes)
        parse = timed_s("document = read_yaml(path)\n", policy)
        validate = timed_s(
            "try:\n    parse_policy(read_document(path), str(path))\n"
            "except PolicyError:\n    pass\n",
            policy,
        )
        checks = timed_s(
            "document = read_yaml(path)\nstart = time.perf_counter()\n"
            "try:\n    parse_policy(document, str(path))\nexcept PolicyError:\n    pass\n",
            policy,
        )
        results["nodes"] = {
            "nodes": args.nodes,
            "policy_mib": round(policy.stat().st_size / 1024 / 1024, 1),
            "yaml_parse_s": round(parse, 2),
            "parse_and_validate_s": round(validate, 2),
            "validate_only_s": round(checks, 2),
        }
        print(f"nodes: {results['nodes']}", flush=True)
    print(f"load average after: {os.getloadavg()}")
    print(json.dumps(results))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"bench took {time.perf_counter() - start:.0f} s")

"""Time to validate a policy listing 150,000 nodes (a 3.6 MiB file): ``gpupool validate``
end to end, against the round-trip YAML parse the loader used before, measured in the same
run. Each figure is one child process, the load average printed before and after.

    python bench/policy_parse.py [--nodes 150000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bounded import nodes_policy  # noqa: E402

CHILDREN = {
    "round-trip parse alone (the old loader's floor)": (
        "from ruamel.yaml import YAML\nYAML(typ='rt').load(Path(FILE).read_text())\n"
    ),
    "libyaml parse alone": (
        "from policy import fast_yaml\nfast_yaml.parse(Path(FILE).read_text())\n"
    ),
    "gpupool validate, end to end": (
        "from runtime.cli.app import app\nsys.argv = ['gpupool', 'validate', FILE]\n"
        "try:\n    app()\nexcept SystemExit as exc:\n    print('exit', exc.code)\n"
    ),
}


def timed_s(code: str, file: Path) -> float:
    """Seconds a child takes to run ``code`` (imports included: what a user waits for)."""
    program = "import sys\nfrom pathlib import Path\n" + code.replace("FILE", repr(str(file)))
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
        cwd=ROOT,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=150_000)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="gpupool-policy-parse-") as scratch:
        policy = nodes_policy(Path(scratch), args.nodes)
        print(f"{args.nodes:,} nodes, {policy.stat().st_size / 1024 / 1024:.1f} MiB")
        for name, code in CHILDREN.items():
            print(f"{name}: {timed_s(code, policy):.2f} s", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

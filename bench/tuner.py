"""One tuning cycle against a Prometheus holding a 10,000-GPU cluster (synthetic backfill).

    python bench/tuner.py [--gpus 10000] [--repeats 20]

Backfills 30 minutes of per-GPU dcgm-exporter series (``DCGM_FI_DEV_GPU_UTIL`` and
``DCGM_FI_DEV_FB_USED``, one series per GPU) plus the recorded ``gpupool:*`` series the
tuner reads (per workload or instance where the catalogue records so, evictions per
reason), starts a real Prometheus on it, and times, in the same run (the packaged policy
with its flex workload capped at 8 replicas, so the idle-demand lever has a ceiling to
raise):

- baseline: one instant query of one recorded series;
- the tuner's cycle (``run_cycle`` in dry-run: git read, one range-selector query per
  series, decisions, YAML edit and PR text with its manifest diff and the what-if of both
  policies), and one committing cycle;
- reference: the cluster-utilization window computed from the raw per-GPU series with the
  catalogue's standalone query (what one window costs without recording rules).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policy import load_policy
from runtime.metrics import catalogue
from runtime.metrics.evictions import PRECEDENCE
from runtime.tuner.cycle import CycleReport, run_cycle
from runtime.tuner.manifests import PolicyChange, manifest_diff, whatif_comparison
from runtime.tuner.prometheus import connect
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.signals import SIGNALS
from runtime.tuner.target import Target
from runtime.tuner.yamledit import edit_scalars
from tests.harness.servers import REPO, require_binary, start_prometheus

END = 1_767_225_600 + 3600
STEP_S = 30
SPAN_S = 30 * 60
WORKLOADS = 50


def write_openmetrics(path: Path, gpus: int) -> int:
    """Every family contiguous, each series in time order; returns the sample count."""
    times = list(range(END - SPAN_S, END + 1, STEP_S))
    count = 0
    with path.open("w") as out:
        gpu_series: list[tuple[str, Callable[[int], float]]] = [
            ("DCGM_FI_DEV_GPU_UTIL", lambda g: float(g * 37 % 40)),
            ("DCGM_FI_DEV_FB_USED", lambda g: float(40_000 + g % 1000)),
        ]
        for family, value_of in gpu_series:
            out.write(f"# TYPE {family} gauge\n")
            for g in range(gpus):
                labels = f'gpu="{g % 8}",UUID="GPU-{g:08d}",Hostname="node-{g // 8:05d}"'
                text = repr(value_of(g))
                out.write("".join(f"{family}{{{labels}}} {text} {t}\n" for t in times))
                count += len(times)
        policy = load_policy(REPO / "policy" / "pool.yaml")
        first = policy.workloads[0].name  # the policy's workload, so its bound can be widened

        def per_workload(w: int) -> str:
            name = first if w == 0 else f"w{w:03d}"
            return f'cluster="bench",namespace="gpupool-flex",workload="{name}"'

        def per_instance(w: int) -> str:
            return f'{per_workload(w)},pod="{first if w == 0 else f"w{w:03d}"}-0"'

        recorded: dict[str, tuple[float, list[str]]] = {
            catalogue.PRODUCTION_GPU_UTILIZATION: (0.195, ['cluster="bench"']),
            catalogue.FLEX_EVICTIONS: (
                0.0,
                [f'cluster="bench",namespace="gpupool-flex",reason="{r}"' for r in PRECEDENCE],
            ),
            catalogue.PROD_PODS_PENDING: (0.0, ['cluster="bench"']),
            catalogue.FLEX_HEADROOM_GPUS: (120.0, ['cluster="bench",pool="gpu-flex"']),
            catalogue.VLLM_QUEUE_DEPTH: (3.0, [per_workload(w) for w in range(WORKLOADS)]),
            catalogue.FLEX_HPA_AT_MAX: (1.0, [per_workload(w) for w in range(WORKLOADS)]),
            catalogue.KV_CACHE_USAGE: (0.6, [per_instance(w) for w in range(WORKLOADS)]),
            catalogue.KV_CACHE_HIT_RATE: (0.9, [per_instance(w) for w in range(WORKLOADS)]),
        }
        assert recorded.keys() == SIGNALS.keys()
        for family, (value, label_sets) in recorded.items():
            out.write(f"# TYPE {family} gauge\n")
            for labels in label_sets:
                out.write("".join(f"{family}{{{labels}}} {value!r} {t}\n" for t in times))
                count += len(times)
        out.write("# EOF\n")
    return count


def median_s(action: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def git_repo(root: Path) -> Path:
    repo = root / "repo"
    (repo / "policy").mkdir(parents=True)
    # a numeric ceiling: the idle-demand lever raises a number and leaves ``auto`` alone
    text = (REPO / "policy" / "pool.yaml").read_text()
    capped = text.replace("    max_replicas: auto ", "    max_replicas: 8    ", 1)
    assert capped != text, "the packaged policy's flex workload no longer says max_replicas: auto"
    (repo / "policy" / "pool.yaml").write_text(capped)
    shutil.copytree(REPO / "policy" / "models", repo / "policy" / "models")
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-qm", "init"],
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    return repo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tuner-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        samples = write_openmetrics(root / "series.om", args.gpus)
        generated = time.perf_counter() - started
        subprocess.run(
            [
                require_binary("promtool"),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(root / "series.om"),
                str(root / "data"),
            ],
            check=True,
            capture_output=True,
        )
        backfilled = time.perf_counter() - started - generated
        (root / "series.om").unlink()
        server = start_prometheus(
            "global:\n  scrape_interval: 30s\n", root / "prom", data_dir=root / "data"
        )
        try:
            client = connect(server.url)
            at = f"{END:.3f}"
            series = int(
                client.custom_query('count({__name__=~".+"})', params={"time": at})[0]["value"][1]
            )
            settings = TunerSettings()
            repo = git_repo(root)
            metrics = TunerMetrics.create()

            def cycle(dry_run: bool = True) -> CycleReport:
                return run_cycle(
                    client=client,
                    target=Target(repo=repo),
                    settings=settings,
                    metrics=metrics,
                    at=float(END),
                    dry_run=dry_run,
                )

            report = cycle()
            proposal = report.decision.proposal
            assert proposal is not None, report.lines()  # idle cluster with queued demand
            queries_before = (
                metrics.registry.get_sample_value("gpupool_tuner_query_seconds_count") or 0
            )
            cycle()
            queries = (
                metrics.registry.get_sample_value("gpupool_tuner_query_seconds_count") or 0
            ) - queries_before
            baseline = median_s(
                lambda: client.custom_query(
                    catalogue.PRODUCTION_GPU_UTILIZATION, params={"time": at}
                ),
                args.repeats,
            )
            spent_before = metrics.registry.get_sample_value("gpupool_tuner_query_seconds_sum")
            dry = median_s(cycle, args.repeats)
            spent = (metrics.registry.get_sample_value("gpupool_tuner_query_seconds_sum") or 0) - (
                spent_before or 0
            )
            committing = median_s(lambda: cycle(dry_run=False), 1)
            policy = load_policy(repo / "policy" / "pool.yaml")
            base_text = (repo / "policy" / "pool.yaml").read_text()
            new_text, _ = edit_scalars(base_text, proposal.changes)
            head = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "HEAD"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            change = PolicyChange(repo, head, "policy/pool.yaml", policy, base_text, new_text)
            rendering = median_s(
                lambda: manifest_diff(change, target="labels"), max(3, args.repeats // 4)
            )
            comparing = median_s(
                lambda: whatif_comparison(change, hours=settings.whatif_hours),
                max(3, args.repeats // 4),
            )
            raw_expr = catalogue.build_catalogue(load_policy(REPO / "policy" / "pool.yaml")).query(
                catalogue.CLUSTER_GPU_UTILIZATION
            )
            raw = median_s(
                lambda: client.custom_query(
                    f"({raw_expr})[{settings.window}:{STEP_S}s]", params={"time": at}
                ),
                max(3, args.repeats // 4),
            )
        finally:
            server.stop()
    print(f"GPUs {args.gpus}, series in Prometheus {series}, samples {samples}")
    print(f"setup: generate {generated:.1f} s, promtool backfill {backfilled:.1f} s")
    print(f"queries per cycle: {queries:.0f} (one per recorded series: {len(SIGNALS)})")
    per_cycle = spent / args.repeats

    def row(label: str, seconds: float) -> None:
        print(f"{label:<58} {seconds * 1e3:8.2f} ms {seconds / baseline:6.1f}x")

    row("baseline: one instant query of a recorded series", baseline)
    row("tuner cycle, dry run (git read, queries, decide, PR text)", dry)
    row(f"  of which the {queries:.0f} Prometheus queries (mean)", per_cycle)
    row("  of which the rendered-manifest diff (two renders)", rendering)
    row(f"  of which the what-if of both policies ({settings.whatif_hours:g} h each)", comparing)
    row("tuner cycle committing a proposal branch (one run)", committing)
    row("reference: utilization window from raw per-GPU series", raw)


if __name__ == "__main__":
    main()

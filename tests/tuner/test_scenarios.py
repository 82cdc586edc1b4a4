"""Real Prometheus and real git: raw exporter series backfilled, the shipped recording rules
evaluated over them with promtool (``scenarios.build_prometheus``, one Prometheus for the
module), the tuner's own query path, and each scenario yields exactly the expected
proposal, or none, as a commit on a new branch of a temporary repository."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from policy import parse_policy
from runtime.tuner.cycle import CycleReport, run_cycle
from runtime.tuner.prometheus import connect
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.target import Target
from tests.harness.git import git
from tests.harness.servers import REPO, Server, start_prometheus
from tests.tuner import scenarios

pytestmark = pytest.mark.slow
SHIPPED = scenarios.POLICY_TEXT


def edited(prefix: str, before: str, after: str) -> tuple[str, str]:
    """The one shipped line ``prefix + before`` (whatever its comment says) and the same line
    with the value spliced as the tuner does: the comment keeps its column."""
    [line] = [x for x in SHIPPED.splitlines() if x.startswith(prefix + before)]
    rest = line[len(prefix + before) :]
    if not rest.lstrip(" ").startswith("#"):
        return line, prefix + after + rest
    column = len(line) - len(rest.lstrip(" "))
    return line, (prefix + after).ljust(column - 1) + " " + rest.lstrip(" ")


RESERVE = "    reserve_ratio: "


def _tuner_branches(repo: Path) -> list[str]:
    out = git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/gpupool-tuner/")
    return out.split()


RESERVE_AT_BOUND = TunerSettings(reserve_ratio_max=0.2)
"""The shipped prod reserve (0.20) is already at the tuner's bound."""


def _cycle(
    server: Server,
    repo: Path,
    scenario: str,
    metrics: TunerMetrics | None = None,
    settings: TunerSettings | None = None,
    **kw: Any,
) -> CycleReport:
    return run_cycle(
        client=connect(server.url),
        target=Target(repo=repo),
        # The PR body's what-if replays take seconds; one test keeps them (storm).
        settings=settings or TunerSettings(whatif_hours=0),
        metrics=metrics or TunerMetrics.create(),
        at=scenarios.evaluation_time(scenario),
        **kw,
    )


def _proposed_text(repo: Path, branch: str) -> str:
    return git(repo, "show", f"{branch}:policy/pool.yaml")


def _changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    pairs = list(zip(before.splitlines(), after.splitlines(), strict=True))
    return [(a, b) for a, b in pairs if a != b]


def _assert_single_proposal(
    report: CycleReport, repo: Path, expected: list[tuple[str, str]]
) -> str:
    assert report.outcome == "created", report.lines()
    assert _tuner_branches(repo) == [report.branch]
    assert report.branch is not None
    text = _proposed_text(repo, report.branch)
    assert _changed_lines(SHIPPED, text) == expected
    parse_policy(YAML(typ="rt").load(text), "proposed")  # validates
    # the user's checkout is untouched: still on main, clean, pool.yaml as shipped
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "policy" / "pool.yaml").read_text() == SHIPPED
    return text


def test_quiet_cluster_proposes_nothing(scenario_prometheus: Server, policy_repo: Path) -> None:
    report = _cycle(scenario_prometheus, policy_repo, "quiet")
    assert report.decision.proposal is None and report.decision.compaction is None
    assert _tuner_branches(policy_repo) == []
    assert {n.rule for n in report.decision.noops} == {
        "eviction-storm",
        "kv-hit-rate",
        "idle-flex-demand",
    }


def test_eviction_storm_with_pending_production_raises_reserve(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    report = _cycle(scenario_prometheus, policy_repo, "storm", settings=TunerSettings())
    _assert_single_proposal(
        report,
        policy_repo,
        [edited(RESERVE, "0.20", "0.25")],
    )
    assert report.body is not None and "gpupool:flex_evictions:per_minute" in report.body
    assert "| `node_pools.0.reserve_ratio` | 0.2 | 0.25 |" in report.body
    # The closed-loop replay of both policies, the same comparison `gpupool whatif` writes.
    whatif = report.body[report.body.index("## What-if") :]
    assert "-> `proposed`, 6 h replay" in whatif and "harvested GPU-h" in whatif
    assert "Closed-loop checks (head):" in whatif
    message = git(policy_repo, "log", "-1", "--format=%B", report.branch or "")
    assert message.startswith("Raise the production reserve to 0.25")
    assert report.body_path is not None and report.body_path.read_text().endswith(report.body)


def test_idle_cluster_with_queued_flex_demand_widens_replicas(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    report = _cycle(scenario_prometheus, policy_repo, "idle")
    text = _assert_single_proposal(report, policy_repo, [edited("    max_replicas: ", "8", "10")])
    assert edited(RESERVE, "0.20", "0.20")[0] in text  # comments survive
    assert report.body is not None
    assert "-  maxReplicas: 8\n+  maxReplicas: 10" in report.body  # the rendered HPA diff
    assert "## What-if" not in report.body  # whatif_hours 0 leaves the section out
    assert text.count("#") == SHIPPED.count("#")


def test_low_hit_rate_with_full_cache_raises_kv_share(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    report = _cycle(scenario_prometheus, policy_repo, "kv_full")
    _assert_single_proposal(
        report,
        policy_repo,
        [edited("  max_gpu_memory_share: ", "0.75", "0.8")],
    )
    assert report.decision.compaction is None
    assert report.body is not None
    assert "~ gpupool-flex/deployment-llama-8b-flex.yaml" in report.body
    assert "- --kv-cache-memory-bytes" in report.body


def test_eviction_storm_without_pending_production_raises_reserve(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    """Flex preempted with no production pod seen pending and production near the shed
    threshold: still the reserve (flex gives GPUs back earlier), never a higher threshold."""
    report = _cycle(scenario_prometheus, policy_repo, "storm_near_shed")
    _assert_single_proposal(report, policy_repo, [edited(RESERVE, "0.20", "0.25")])
    assert report.body is not None
    assert "| `gpupool:prod_pods_pending` | > 0 pending in 0% of samples |" in report.body


def test_reserve_at_its_bound_lowers_the_shed_threshold(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    """The same storm with the reserve at its bound: production's utilization stayed in the
    band just below the shed threshold, so flex sheds one step earlier."""
    report = _cycle(scenario_prometheus, policy_repo, "storm_near_shed", settings=RESERVE_AT_BOUND)
    _assert_single_proposal(
        report, policy_repo, [edited("  shed_while_production_above: ", "0.65", "0.6")]
    )
    assert report.body is not None
    assert 'gpupool:flex_evictions:per_minute{reason="preemption"}' in report.body
    assert "gpupool:production_gpu_utilization:ratio" in report.body
    assert "~ gpupool-system/prometheusrule-gpupool.yaml" in report.body  # the budget rule


def test_one_sample_near_the_shed_threshold_never_lowers_it(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    """The same storm with production in that band in one sample only, the reserve at its
    bound: no proposal, a no-op naming the bound for a person."""
    report = _cycle(scenario_prometheus, policy_repo, "storm_blip", settings=RESERVE_AT_BOUND)
    assert report.decision.proposal is None, report.lines()
    assert _tuner_branches(policy_repo) == []
    noop = next(n for n in report.decision.noops if n.rule == "eviction-storm")
    assert noop.fail_closed is None
    assert "reserve_ratio 0.2 is at its bound" in noop.reason
    assert "a person must look" in noop.reason


@pytest.mark.parametrize(
    ("scenario", "rule", "reason"),
    [
        ("quiet", "eviction-storm", "below the 90% needed"),
        ("blips", "eviction-storm", "below the 90% needed"),
        ("blips", "idle-flex-demand", "production utilization below"),
        ("drain", "eviction-storm", "the Eviction API (kubectl drain"),
        ("idle_below_max", "idle-flex-demand", "gpupool:flex_hpa_at_max"),
        ("kv_split", "kv-hit-rate", "none of them was also full"),
    ],
)
def test_silence(
    scenario_prometheus: Server, policy_repo: Path, scenario: str, rule: str, reason: str
) -> None:
    """Single-sample blips, a storm with no pool.yaml lever, an HPA below its bound, and a
    low hit rate on one instance with the full cache on another: nothing is proposed."""
    report = _cycle(scenario_prometheus, policy_repo, scenario)
    assert report.decision.proposal is None and report.decision.compaction is None, report.lines()
    assert _tuner_branches(policy_repo) == []
    noop = next(n for n in report.decision.noops if n.rule == rule)
    assert reason in noop.reason and noop.fail_closed is None, noop


@pytest.fixture
def compaction_sidecar() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP endpoint standing where the compaction worker listens; records requests."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(202)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/compaction", received
    server.shutdown()


def test_low_hit_rate_with_sparse_cache_requests_compaction(
    scenario_prometheus: Server,
    policy_repo: Path,
    compaction_sidecar: tuple[str, list[dict[str, Any]]],
) -> None:
    url, received = compaction_sidecar
    report = _cycle(scenario_prometheus, policy_repo, "kv_sparse", compaction_url=url)
    assert report.decision.proposal is None
    assert _tuner_branches(policy_repo) == []
    assert report.compaction_outcome == "delivered"
    assert len(received) == 1
    request = received[0]
    assert request["kind"] == "gpupool.compaction-request"
    assert request["workloads"] == ["llama-8b-flex"]
    assert request["namespace"] == "gpupool-flex"
    pod = scenarios.flex_pod(0)
    assert {e["series"] for e in request["evidence"]} == {
        f'gpupool:kv_cache_hit_rate:ratio{{namespace="gpupool-flex",workload="llama-8b-flex",pod="{pod}"}}',
        f'gpupool:kv_cache_usage:ratio{{namespace="gpupool-flex",workload="llama-8b-flex",pod="{pod}"}}',
    }  # the instance's own windows
    # within kv_cache.compaction_min_interval a second cycle does not ask again
    again = _cycle(scenario_prometheus, policy_repo, "kv_sparse", compaction_url=url)
    assert again.decision.compaction is None and len(received) == 1


@pytest.mark.parametrize(("scenario", "kind"), [("stale", "stale"), ("nan", "nan")])
def test_bad_data_fails_closed(
    scenario_prometheus: Server, policy_repo: Path, scenario: str, kind: str
) -> None:
    metrics = TunerMetrics.create()
    report = _cycle(scenario_prometheus, policy_repo, scenario, metrics)
    assert report.decision.proposal is None
    assert _tuner_branches(policy_repo) == []
    flex = next(n for n in report.decision.noops if n.rule == "idle-flex-demand")
    assert flex.fail_closed == kind and flex.reason.startswith("fail closed")
    value = metrics.registry.get_sample_value(
        "gpupool_tuner_fail_closed_skips_total", {"rule": "idle-flex-demand", "kind": kind}
    )
    assert value == 1


def test_prometheus_stopped_fails_closed(tmp_path: Path, policy_repo: Path) -> None:
    server = start_prometheus(scenarios.PROMETHEUS_CONFIG, tmp_path / "prom")
    server.stop()
    metrics = TunerMetrics.create()
    report = _cycle(server, policy_repo, "idle", metrics)
    assert report.decision.proposal is None and report.decision.compaction is None
    assert _tuner_branches(policy_repo) == []
    assert {n.fail_closed for n in report.decision.noops} == {"unreachable"}
    assert (
        metrics.registry.get_sample_value(
            "gpupool_tuner_fail_closed_skips_total",
            {"rule": "idle-flex-demand", "kind": "unreachable"},
        )
        == 1
    )


def test_rerun_on_unchanged_data_proposes_nothing_new(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    first = _cycle(scenario_prometheus, policy_repo, "idle")
    assert first.outcome == "created"
    head = git(policy_repo, "rev-parse", first.branch or "")
    # same data, same state: the cooldown holds the next proposal back
    second = _cycle(scenario_prometheus, policy_repo, "idle")
    assert second.decision.proposal is None
    assert any("cooldown" in n.reason for n in second.decision.noops)
    # same data with the state forgotten: the content-derived branch already exists
    state = git(policy_repo, "rev-parse", "--git-common-dir").strip()
    (policy_repo / state / "gpupool-tuner" / "state.json").unlink()
    third = _cycle(scenario_prometheus, policy_repo, "idle")
    assert third.outcome == "existing" and third.branch == first.branch
    assert _tuner_branches(policy_repo) == [first.branch]
    assert git(policy_repo, "rev-parse", first.branch or "") == head


def test_dry_run_writes_nothing(scenario_prometheus: Server, policy_repo: Path) -> None:
    report = _cycle(scenario_prometheus, policy_repo, "idle", dry_run=True)
    assert report.outcome == "dry_run" and report.body is not None
    assert _tuner_branches(policy_repo) == []
    state = git(policy_repo, "rev-parse", "--git-common-dir").strip()
    assert not (policy_repo / state / "gpupool-tuner").exists()


def test_cli_once_proposes_and_dry_run_prints_the_body(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    """``gpupool tune --once`` as a process, the way the Deployment and people run it."""
    at = str(scenarios.evaluation_time("storm"))
    base = [
        sys.executable,
        "-m",
        "runtime.cli.app",
        "tune",
        "--prometheus",
        scenario_prometheus.url,
        "--repo",
        str(policy_repo),
        "--once",
        "--at",
        at,
    ]
    dry = subprocess.run([*base, "--dry-run"], capture_output=True, text=True, cwd=REPO)
    assert dry.returncode == 0, dry.stderr
    assert "proposal eviction-storm (dry_run)" in dry.stdout
    assert "## Evidence" in dry.stdout and _tuner_branches(policy_repo) == []
    done = subprocess.run(base, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "proposal eviction-storm (created)" in done.stdout
    assert len(_tuner_branches(policy_repo)) == 1


def test_cli_reports_a_repository_without_the_policy(
    scenario_prometheus: Server, tmp_path: Path
) -> None:
    git(tmp_path, "init", "-q")
    git(
        tmp_path,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.invalid",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "empty",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime.cli.app",
            "tune",
            "--prometheus",
            scenario_prometheus.url,
            "--repo",
            str(tmp_path),
            "--once",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 1
    assert "policy/pool.yaml" in done.stderr and "Traceback" not in done.stderr


def test_uncommitted_work_is_left_alone_and_not_proposed(
    scenario_prometheus: Server, policy_repo: Path
) -> None:
    edited = SHIPPED.replace("name: demo-cluster", "name: my-local-edit")
    (policy_repo / "policy" / "pool.yaml").write_text(edited)
    (policy_repo / "notes.txt").write_text("untracked\n")
    report = _cycle(scenario_prometheus, policy_repo, "idle")
    assert report.outcome == "created" and report.branch is not None
    assert "my-local-edit" not in _proposed_text(policy_repo, report.branch)
    assert (policy_repo / "policy" / "pool.yaml").read_text() == edited
    assert git(policy_repo, "status", "--porcelain").splitlines() == [
        " M policy/pool.yaml",
        "?? notes.txt",
    ]


@pytest.fixture
def upstream_clone(policy_repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(reviewer, tuner): ``policy_repo`` pushes to a bare upstream, and the tuner's
    repository is a clone of it (``origin``), as the init container makes in the cluster."""
    upstream = tmp_path / "upstream.git"
    git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(upstream))
    git(policy_repo, "remote", "add", "origin", str(upstream))
    git(policy_repo, "push", "--quiet", "origin", "main")
    clone = tmp_path / "tuner"
    git(tmp_path, "clone", "--quiet", "--branch", "main", str(upstream), str(clone))
    return policy_repo, clone


def test_each_cycle_decides_against_the_policy_fetched_from_upstream(
    scenario_prometheus: Server, upstream_clone: tuple[Path, Path]
) -> None:
    reviewer, tuner = upstream_clone
    settings = TunerSettings(cooldown="5s")  # two proposals from the same storm data

    def cycle(later_s: float) -> CycleReport:
        return run_cycle(
            client=connect(scenario_prometheus.url),
            target=Target(repo=tuner, base="main"),
            settings=settings,
            metrics=TunerMetrics.create(),
            at=scenarios.evaluation_time("storm") + later_s,
        )

    first = cycle(0)
    assert first.outcome == "created" and first.body is not None
    assert "| `node_pools.0.reserve_ratio` | 0.2 | 0.25 |" in first.body
    local_main = git(tuner, "rev-parse", "main")

    # a reviewer changes the reserve upstream; the tuner's pod keeps running
    path = reviewer / "policy" / "pool.yaml"
    path.write_text(SHIPPED.replace(*edited(RESERVE, "0.20", "0.30")))
    git(reviewer, "-c", "user.name=r", "-c", "user.email=r@example.invalid", "commit", "-qam", "r")
    git(reviewer, "push", "--quiet", "origin", "main")
    merged = git(reviewer, "rev-parse", "HEAD").strip()

    second = cycle(10)
    assert second.outcome == "created" and second.body is not None and second.branch is not None
    assert "| `node_pools.0.reserve_ratio` | 0.3 | 0.35 |" in second.body
    assert git(tuner, "rev-parse", f"{second.branch}^").strip() == merged
    assert edited(RESERVE, "0.20", "0.35")[1] in _proposed_text(tuner, second.branch)
    # only the remote-tracking ref moved: local main, index and work tree are as cloned
    assert git(tuner, "rev-parse", "main") == local_main
    assert git(tuner, "status", "--porcelain") == ""
    assert (tuner / "policy" / "pool.yaml").read_text() == SHIPPED


def test_unreachable_remote_fails_closed_and_the_next_cycle_retries(
    scenario_prometheus: Server, upstream_clone: tuple[Path, Path], tmp_path: Path
) -> None:
    _, tuner = upstream_clone
    url = git(tuner, "remote", "get-url", "origin").strip()
    git(tuner, "remote", "set-url", "origin", str(tmp_path / "gone.git"))
    metrics = TunerMetrics.create()
    report = _cycle(scenario_prometheus, tuner, "storm", metrics)
    assert report.decision.proposal is None and report.decision.compaction is None
    [noop] = report.decision.noops
    assert (noop.rule, noop.fail_closed) == ("policy-fetch", "fetch")
    assert noop.reason.startswith("fail closed: git fetch") and "gone.git" in noop.reason
    assert _tuner_branches(tuner) == []
    sample = {"rule": "policy-fetch", "kind": "fetch"}
    assert metrics.registry.get_sample_value("gpupool_tuner_fail_closed_skips_total", sample) == 1
    assert metrics.registry.get_sample_value("gpupool_tuner_cycles_total", {"trigger": "timer"})

    # --no-fetch decides against the local branch as cloned, remote or not
    offline = run_cycle(
        client=connect(scenario_prometheus.url),
        target=Target(repo=tuner, fetch=False),
        settings=TunerSettings(),
        metrics=metrics,
        at=scenarios.evaluation_time("storm"),
        dry_run=True,
    )
    assert offline.outcome == "dry_run"

    git(tuner, "remote", "set-url", "origin", url)  # reachable again: the next cycle proposes
    assert _cycle(scenario_prometheus, tuner, "storm", metrics).outcome == "created"

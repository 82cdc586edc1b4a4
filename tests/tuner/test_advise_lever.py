"""The advise lever end to end: a real Prometheus with backfilled history (the tuner's
scenarios, ``scenarios.build_prometheus``), a real git repository with a bare upstream, and
the GitHub stand-in (``tests.harness.github``) receiving the pull request.

The ``quiet`` scenario holds production flat at 16 GPUs with a duty cycle of 0.8 for its
40 minutes; the lever reads them all (``window: 40m``, ``step: 30s``) and sweeps the
prod pool's reserve. With production flat no burst ever needs the reserve, so the smallest
reserve lends the most and harms nothing: the sweep's pick; a sweep of larger reserves
only picks the current policy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from policy import DEFAULT_POLICY
from runtime.sim.traces import load_production_trace
from runtime.tuner.cycle import CycleReport, run_cycle
from runtime.tuner.prometheus import connect
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.target import ForgeOptions, Target
from tests.harness.git import git
from tests.harness.github import ReplayGitHub
from tests.harness.servers import REPO, Server, start_prometheus
from tests.tuner import scenarios

pytestmark = pytest.mark.slow

REPOSITORY = "acme/gpupool-policy"
OFF = "  advise: {enabled: false, every: 1d, window: 1d, step: 1m, budget: 10m, jobs: 2, vary: []}"
RESERVE_LINE = (
    "    reserve_ratio: 0.20       # kept unallocated for production bursts: flex sheds to keep it"
)


SHIPPED = DEFAULT_POLICY.read_text()
"""The shipped policy: ``max_replicas: auto``, so flex grows into what the reserve frees."""


def lever_policy(vary: str) -> str:
    """The shipped policy with the lever on over the last 40 minutes, sweeping ``vary``."""
    assert OFF in SHIPPED, "the shipped policy restates tuner.advise on one line"
    on = (
        "  advise: {enabled: true, every: 1d, window: 40m, step: 30s, budget: 5m, jobs: 2, "
        f'vary: ["{vary}"]}}'
    )
    return SHIPPED.replace(OFF, on)


def _show(repo: Path, ref: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{ref}:{path}"], check=True, capture_output=True
    ).stdout


def _repo(tmp_path: Path, text: str) -> tuple[Path, Path]:
    """(tuner's clone, bare upstream) holding ``text`` as policy/pool.yaml and the models."""
    seed, upstream, clone = tmp_path / "seed", tmp_path / "upstream.git", tmp_path / "tuner"
    (seed / "policy").mkdir(parents=True)
    (seed / "policy" / "pool.yaml").write_text(text)
    shutil.copytree(REPO / "policy" / "models", seed / "policy" / "models")
    git(seed, "init", "--quiet", "--initial-branch=main")
    git(seed, "add", ".")
    git(seed, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "init")
    git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(upstream))
    git(seed, "push", "--quiet", str(upstream), "main")
    git(tmp_path, "clone", "--quiet", "--branch", "main", str(upstream), str(clone))
    return clone, upstream


def _cycle(server: Server, repo: Path, **kw: Any) -> CycleReport:
    return run_cycle(
        client=connect(server.url),
        target=Target(repo=repo),
        settings=TunerSettings(whatif_hours=0),
        metrics=kw.pop("metrics", None) or TunerMetrics.create(),
        at=scenarios.evaluation_time("quiet"),
        **kw,
    )


def _branches(repo: Path) -> list[str]:
    out = git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/gpupool-tuner/")
    return out.split()


def _table(body: str) -> dict[str, Mapping[str, str]]:
    """The sweep's table in the body: variant -> column -> cell."""
    lines = body.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| variant |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_the_lever_proposes_the_sweeps_pick_as_a_pull_request(
    scenario_prometheus: Server, tmp_path: Path, github: ReplayGitHub
) -> None:
    repo, upstream = _repo(tmp_path, lever_policy("gpu-prod.reserve_ratio=0.2,0.1,0.05"))
    github.load("create_pull.json")
    metrics = TunerMetrics.create()
    forge = ForgeOptions(repository=REPOSITORY, token="t0k", api_url=github.url)
    report = _cycle(scenario_prometheus, repo, forge_options=forge, metrics=metrics)

    assert report.decision.proposal is None  # no rule fired: the lever proposed
    assert report.advice == "Advise: gpu-prod.reserve_ratio=0.05", report.lines()
    assert report.outcome == "created" and report.branch is not None
    branch = report.branch
    assert _branches(repo) == [branch] and branch.startswith("gpupool-tuner/advise-")
    assert report.pr_url == "https://github.com/acme/gpupool-policy/pull/43"

    # the policy on the branch: only the reserve's value changed, its comment kept
    before = _show(repo, "main", "policy/pool.yaml").decode()
    after = _show(repo, branch, "policy/pool.yaml").decode()
    changed = [
        (a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b
    ]
    assert changed == [(RESERVE_LINE, RESERVE_LINE.replace("0.20      ", "0.05      "))]
    files = git(repo, "diff", "--name-only", "main", branch).split()
    assert files == ["policy/advise/pareto.png", "policy/advise/production.csv", "policy/pool.yaml"]

    # the trace beside it: production's demand as Prometheus recorded it, every 30 s
    (tmp_path / "trace.csv").write_bytes(_show(repo, branch, "policy/advise/production.csv"))
    trace = load_production_trace(tmp_path / "trace.csv")
    assert trace.step_s == 30 and len(trace.held) == 81  # 40 minutes, both ends
    assert set(trace.held.tolist()) == {16}
    assert trace.busy.tolist() == pytest.approx([16 * 0.8] * 81)
    assert _show(repo, branch, "policy/advise/pareto.png").startswith(b"\x89PNG\r\n\x1a\n")
    # the tuner's own copies of the body, the trace and the plot, beside each other
    assert report.body_path is not None
    assert report.body_path.read_text().startswith(f"# {report.advice}\n")
    assert report.body_path.with_suffix(".csv").read_bytes() == _show(
        repo, branch, "policy/advise/production.csv"
    )
    assert report.body_path.with_suffix(".png").read_bytes() == _show(
        repo, branch, "policy/advise/pareto.png"
    )

    # the body: the change, the table (the pick harvests most), the plot from the branch
    body = report.body or ""
    assert "| `node_pools.0.reserve_ratio` | `0.2` | `0.05` |" in body
    rows = _table(body)
    assert set(rows) == {"current", "gpu-prod.reserve_ratio=0.1", "gpu-prod.reserve_ratio=0.05"}
    pick = rows["gpu-prod.reserve_ratio=0.05"]
    assert "recommended" in pick[""]
    harvest = {name: float(row["harvested GPU-h"]) for name, row in rows.items()}
    assert harvest["gpu-prod.reserve_ratio=0.05"] > harvest["gpu-prod.reserve_ratio=0.1"]
    assert harvest["gpu-prod.reserve_ratio=0.1"] > harvest["current"]
    raw = f"{github.url}/{REPOSITORY}/raw/{branch}/policy/advise/pareto.png"
    assert f"![harvest against production harm]({raw})" in body
    assert "## Rendered manifest diff" in body and "reserve" in body

    # pushed, and the pull request asked for with exactly that body
    assert git(upstream, "rev-parse", branch) == git(repo, "rev-parse", branch)
    [call] = github.received
    assert (call.method, call.path) == ("POST", f"/repos/{REPOSITORY}/pulls")
    assert call.body == {
        "title": report.advice,
        "body": body,
        "head": branch,
        "base": "main",
        "draft": False,
    }
    sample = {"rule": "advise", "outcome": "created"}
    assert metrics.registry.get_sample_value("gpupool_tuner_proposals_total", sample) == 1

    # the next cycle does not sweep again (every: 1d, and the cooldown); with the state
    # lost it finds the proposal of this policy and opens no second one
    again = _cycle(scenario_prometheus, repo)
    [noop] = [n for n in again.decision.noops if n.rule == "advise"]
    assert "tuner.advise.every is 1d" in noop.reason and again.advice is None
    state = repo / git(repo, "rev-parse", "--git-common-dir").strip() / "gpupool-tuner"
    (state / "state.json").unlink()
    third = _cycle(scenario_prometheus, repo)
    [noop] = [n for n in third.decision.noops if n.rule == "advise"]
    assert f"already proposed on {branch}" in noop.reason
    assert _branches(repo) == [branch] and len(github.received) == 1


def test_the_current_policy_as_the_pick_proposes_nothing(
    scenario_prometheus: Server, tmp_path: Path
) -> None:
    repo, _ = _repo(tmp_path, lever_policy("gpu-prod.reserve_ratio=0.2,0.3,0.4"))
    report = _cycle(scenario_prometheus, repo)
    assert report.advice is None and report.outcome is None and _branches(repo) == []
    [noop] = [n for n in report.decision.noops if n.rule == "advise"]
    assert "the current policy is the sweep's pick" in noop.reason
    # the sweep ran: the next one waits for tuner.advise.every
    again = _cycle(scenario_prometheus, repo)
    [noop] = [n for n in again.decision.noops if n.rule == "advise"]
    assert "tuner.advise.every is 1d" in noop.reason


def test_unreachable_prometheus_fails_the_lever_closed(tmp_path: Path) -> None:
    server = start_prometheus(scenarios.PROMETHEUS_CONFIG, tmp_path / "prom")
    server.stop()
    repo, _ = _repo(tmp_path, lever_policy("gpu-prod.reserve_ratio=0.2,0.05"))
    metrics = TunerMetrics.create()
    report = _cycle(server, repo, metrics=metrics)
    [noop] = [n for n in report.decision.noops if n.rule == "advise"]
    assert noop.fail_closed == "trace" and noop.reason.startswith("fail closed: ")
    assert _branches(repo) == []
    sample = {"rule": "advise", "kind": "trace"}
    assert metrics.registry.get_sample_value("gpupool_tuner_fail_closed_skips_total", sample) == 1
    # no sweep ran, so the next cycle tries again rather than waiting a day
    again = _cycle(server, repo)
    [noop] = [n for n in again.decision.noops if n.rule == "advise"]
    assert noop.fail_closed == "trace"


def test_cli_dry_run_prints_the_proposal_and_writes_nothing(
    scenario_prometheus: Server, tmp_path: Path
) -> None:
    """``gpupool tune --once --dry-run`` as a process: the sweep runs, nothing is written."""
    repo, _ = _repo(tmp_path, lever_policy("gpu-prod.reserve_ratio=0.2,0.05"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime.cli.app",
            "tune",
            "--prometheus",
            scenario_prometheus.url,
            "--repo",
            str(repo),
            "--once",
            "--dry-run",
            "--at",
            str(scenarios.evaluation_time("quiet")),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "proposal advise (dry_run): Advise: gpu-prod.reserve_ratio=0.05" in done.stdout
    assert "\n# Advise: gpu-prod.reserve_ratio=0.05\n" in done.stdout
    assert "| `node_pools.0.reserve_ratio` | `0.2` | `0.05` |" in done.stdout
    assert _branches(repo) == []
    assert not (
        repo / git(repo, "rev-parse", "--git-common-dir").strip() / "gpupool-tuner"
    ).exists()

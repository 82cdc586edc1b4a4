"""The advise lever's part of a cycle: sweep production's recent demand and propose the
advisor's pick (``advice`` holds its pure decisions and text; this is its edge)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from prometheus_api_client import PrometheusConnect

from policy import PoolPolicy, parse_policy
from runtime.advise import front, levers
from runtime.advise import report as advise_report
from runtime.advise.sweep import (
    Sweep,
    SweepError,
    run_sweep,
    sweep_options,
    variant_document,
)
from runtime.atomic_file import write_files
from runtime.sim.traces import TraceError, demand_csv
from runtime.tuner import advice, forge, gitrepo
from runtime.tuner.manifests import PolicyChange, manifest_diff
from runtime.tuner.prometheus import TraceQueryError, production_samples
from runtime.tuner.proposals import NoOp, TunerState
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.target import ForgeOptions, Target, open_pull_request
from runtime.tuner.yamledit import edit_values


@dataclass(frozen=True)
class AdviseContext:
    """What the advise lever reads of its cycle."""

    client: PrometheusConnect
    target: Target
    policy: PoolPolicy
    base_commit: str
    base_text: str
    at: float
    dry_run: bool


@dataclass(frozen=True)
class Advice:
    """The advise lever's proposal: its title, branch and PR body, and what became of it."""

    title: str
    branch: str
    body: str
    outcome: str
    """``created`` or ``dry_run``."""
    commit: str | None = None
    body_path: Path | None = None
    pr_url: str | None = None


def advise(
    cx: AdviseContext,
    state: TunerState,
    *,
    settings: TunerSettings,
    forge_options: ForgeOptions | None,
    metrics: TunerMetrics,
) -> tuple[Advice | NoOp, TunerState]:
    """The advise lever, when due and no rule proposed: production's trace of the window,
    a sweep on it, and the pick proposed when it changes the policy; else why not."""
    branch = advice.branch_name(cx.base_text)
    blocked = _blocked(cx, state, branch, cooldown_s=settings.cooldown_s)
    if blocked is not None:
        return blocked, state
    swept = _sweep_production(cx)
    if isinstance(swept, NoOp):
        return swept, state
    sweep, trace, samples = swept
    state = replace(state, last_advise_at=cx.at)
    rated = front.rate(sweep.points, sweep.fixed)
    pick = advice.choose(front.recommend(rated))
    if isinstance(pick, NoOp):
        return pick, state
    new_text = _advised_text(cx, pick)
    title = advice.title(pick)
    body = _advice_body(
        cx,
        sweep,
        rated,
        pick,
        samples=samples,
        branch=branch,
        new_text=new_text,
        forge_options=forge_options,
    )
    if cx.dry_run:
        made = Advice(title, branch, body, "dry_run")
    else:
        plot = advise_report.plot(sweep, rated, pick)
        commit, body_path = _commit_advice(
            cx, branch=branch, title=title, body=body, new_text=new_text, trace=trace, plot=plot
        )
        state = replace(state, last_proposal_at=cx.at, last_proposal_branch=branch)
        pr_url = None
        if forge_options is not None:
            pr_url = open_pull_request(cx.target, forge_options, title, body, branch)
        made = Advice(title, branch, body, "created", commit, body_path, pr_url)
    metrics.proposals.labels(advice.RULE, made.outcome).inc()
    return made, state


def _blocked(
    cx: AdviseContext, state: TunerState, branch: str, *, cooldown_s: float
) -> NoOp | None:
    """Why the lever does not sweep this cycle (not due, this policy already advised on
    ``branch``), or None."""
    waiting = advice.due(cx.policy.tuner.advise, state, at=cx.at, cooldown_s=cooldown_s)
    if waiting is not None:
        return waiting
    if gitrepo.branch_exists(cx.target.repo, branch):
        reason = f"already proposed on {branch} for this policy; the next sweep waits for a change"
        return NoOp(advice.RULE, reason)
    return None


def _advice_body(
    cx: AdviseContext,
    sweep: Sweep,
    rated: Sequence[front.Rated],
    pick: front.Rated,
    *,
    samples: int,
    branch: str,
    new_text: str,
    forge_options: ForgeOptions | None,
) -> str:
    """The advice's PR body: the sweep, the pick, its plot's link and the manifest diff."""
    target, policy = cx.target, cx.policy
    return advice.pr_body(
        sweep,
        rated,
        pick,
        policy=policy,
        policy_path=target.policy_path,
        window=policy.tuner.advise.window,
        at=cx.at,
        samples=samples,
        plot_link=_plot_link(target, branch, forge_options),
        manifest_diff=manifest_diff(
            PolicyChange(
                target.repo, cx.base_commit, target.policy_path, policy, cx.base_text, new_text
            ),
            target=target.render_target,
        ),
        vary=policy.tuner.advise.vary,
    )


def _advised_text(cx: AdviseContext, pick: front.Rated) -> str:
    """The policy file with the pick's edits spliced in, checked to parse to the variant
    the sweep replayed."""
    target, edits = cx.target, pick.point.variant.edits
    source = f"{target.policy_path}@{cx.base_commit[:12]}"
    new_text, new_document = edit_values(cx.base_text, edits)
    after = parse_policy(new_document, f"{source} (advised)")
    if after != parse_policy(
        variant_document(cx.policy, edits), f"{source} ({pick.point.variant.name})"
    ):
        raise RuntimeError(
            f"{target.policy_path}: the edited file differs from the advised variant"
        )
    return new_text


def _plot_link(target: Target, branch: str, forge_options: ForgeOptions | None) -> str:
    """Where the body's plot points: its raw file on the forge's branch, else its path."""
    _, plot_path = advice.artifact_paths(target.policy_path)
    if forge_options is None:
        return plot_path
    return forge.raw_file_url(
        api_url=forge_options.api_url,
        repository=forge_options.repository,
        ref=branch,
        path=plot_path,
    )


def _commit_advice(
    cx: AdviseContext,
    *,
    branch: str,
    title: str,
    body: str,
    new_text: str,
    trace: str,
    plot: bytes,
) -> tuple[str, Path]:
    """The proposal's branch (policy, trace and plot) and the tuner's copies of its body,
    trace and plot: (the commit, the body's path)."""
    target = cx.target
    trace_path, plot_path = advice.artifact_paths(target.policy_path)
    files = {
        target.policy_path: new_text.encode("utf-8"),
        trace_path: trace.encode("utf-8"),
        plot_path: plot,
    }
    commit = gitrepo.commit_files_on_new_branch(
        target.repo,
        base=cx.base_commit,
        branch=branch,
        files=files,
        message=f"{title}\n\n{body}",
    )
    stem = target.tuner_dir / "proposals" / branch.replace("/", "_")
    write_files(
        {
            stem.with_suffix(".md"): f"# {title}\n\n{body}".encode(),
            stem.with_suffix(".csv"): trace.encode("utf-8"),
            stem.with_suffix(".png"): plot,
        }
    )
    return commit, stem.with_suffix(".md")


def _sweep_production(cx: AdviseContext) -> tuple[Sweep, str, int] | NoOp:
    """(the sweep, the trace's CSV, its samples) of the lever's variants on production's
    trace of the window, the policy's folder as committed at the base; or why not."""
    lever, target, policy = cx.policy.tuner.advise, cx.target, cx.policy
    try:
        variants = advice.variants(policy, lever)
        samples = production_samples(
            cx.client, policy, start=cx.at - lever.window_s, end=cx.at, step_s=lever.step_s
        )
        trace = demand_csv(samples, source=f"Prometheus ({lever.window} to {cx.at:.0f})")
    except levers.LeverError as exc:
        return NoOp(advice.RULE, f"{exc}; no sweep")
    except (TraceQueryError, TraceError) as exc:
        return NoOp(advice.RULE, f"fail closed: {exc}; no sweep", "trace")
    policy_dir = str(PurePosixPath(target.policy_path).parent)
    hours = (samples[-1][0] - samples[0][0] + lever.step_s) / 3600  # the whole window
    with tempfile.TemporaryDirectory(prefix="gpupool-advise-") as scratch:
        root = Path(scratch)
        gitrepo.export_folder(target.repo, cx.base_commit, policy_dir, root)
        (root / advice.TRACE).write_text(trace, encoding="utf-8")
        options = sweep_options(str(root / advice.TRACE), hours=hours, target=target.render_target)
        try:
            sweep = run_sweep(
                policy,
                root / policy_dir,
                variants,
                options,
                jobs=lever.jobs,
                budget_s=lever.budget_s,
            )
        except SweepError as exc:
            return NoOp(advice.RULE, f"{exc}; nothing proposed")
    return sweep, trace, len(samples)

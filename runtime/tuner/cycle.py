"""One tuning cycle: read Prometheus, decide, and turn the decision into a branch, a PR
text and maybe a compaction request. The only module that wires edges to the pure core."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from prometheus_api_client import PrometheusConnect
from ruamel.yaml import YAML

from infra.builders.nodepools import Target as NodePoolTarget
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
from runtime.atomic_file import write_atomic, write_files
from runtime.sim.traces import TraceError, demand_csv
from runtime.tuner import advice, compaction, forge, gitrepo, prtext, signals
from runtime.tuner.decisions import decide
from runtime.tuner.levers import apply_changes
from runtime.tuner.manifests import PolicyChange, manifest_diff, whatif_comparison
from runtime.tuner.prometheus import TraceQueryError, fetch_snapshot, production_samples
from runtime.tuner.proposals import CycleDecision, NoOp, TunerState
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.state import load_state, save_state
from runtime.tuner.yamledit import edit_scalars, edit_values
from runtime.vllm import ModelConfigError, ModelSpec
from runtime.vllm.model_spec import parse_model_config

log = logging.getLogger(__name__)

FETCH_RULE = "policy-fetch"
"""Rule name of the fail-closed no-op (and metric label) when the policy branch can't be
fetched."""


@dataclass(frozen=True)
class Target:
    """The repository the tuner proposes to, and where it keeps its own files."""

    repo: Path
    policy_path: str = "policy/pool.yaml"
    """Policy file, relative to the repository root."""
    base: str = "HEAD"
    """Ref the proposal branches from (and the PR's base)."""
    remote: str = "origin"
    """Remote the base branch is fetched from at the start of every cycle (when the
    repository has it and ``base`` names a local branch), and proposal branches are pushed to
    (``--open-pr``)."""
    fetch: bool = True
    """False: decide against the local ``base`` as it is, even when the remote exists."""
    render_target: NodePoolTarget = "labels"
    """Node-pool target the PR's manifest diff is rendered for (as ``gpupool diff -t``)."""

    @property
    def tuner_dir(self) -> Path:
        """``<git dir>/gpupool-tuner``: state and PR bodies, outside the work tree."""
        return gitrepo.common_dir(self.repo) / "gpupool-tuner"


@dataclass(frozen=True)
class ForgeOptions:
    """Where to open pull requests (``--open-pr``)."""

    repository: str
    token: str
    api_url: str = "https://api.github.com"


@dataclass(frozen=True)
class CycleReport:
    """What one cycle did, for the log, the CLI and tests."""

    decision: CycleDecision
    branch: str | None = None
    commit: str | None = None
    outcome: str | None = None
    """``created``, ``existing`` or ``dry_run`` when there was a proposal."""
    body: str | None = None
    body_path: Path | None = None
    pr_url: str | None = None
    compaction_outcome: str | None = None
    advice: str | None = None
    """Title of the advise lever's proposal (the other fields describe it), if it made one."""

    @property
    def proposed(self) -> tuple[str, str] | None:
        """(rule, title) of the cycle's proposal, a rule's or the advise lever's."""
        if self.advice is not None:
            return advice.RULE, self.advice
        p = self.decision.proposal
        return None if p is None else (p.rule, p.title)

    def lines(self) -> list[str]:
        out = [f"{n.rule}: {n.reason}" for n in self.decision.noops]
        if self.decision.compaction is not None:
            out.append(
                f"compaction request ({self.compaction_outcome}): {self.decision.compaction.reason}"
            )
        proposed = self.proposed
        if proposed is not None:
            out.append(f"proposal {proposed[0]} ({self.outcome}): {proposed[1]}")
            if self.branch:
                out.append(
                    f"  branch {self.branch}" + (f" commit {self.commit}" if self.commit else "")
                )
            if self.body_path:
                out.append(f"  PR body {self.body_path}")
            if self.pr_url:
                out.append(f"  pull request {self.pr_url}")
        return out


def run_cycle(
    *,
    client: PrometheusConnect,
    target: Target,
    settings: TunerSettings,
    metrics: TunerMetrics,
    at: float | None = None,
    trigger: str = "timer",
    dry_run: bool = False,
    compaction_url: str | None = None,
    compaction_services: Sequence[str] = (),
    compaction_token: str | None = None,
    forge_options: ForgeOptions | None = None,
) -> CycleReport:
    """Read, decide, propose. Dry runs write nothing (no branch, state or request).

    A compaction request goes to ``compaction_url`` and to every pod behind each of
    ``compaction_services``; its outcome is ``delivered`` when every target accepted,
    ``partial`` when some did, ``failed`` when none did, ``logged`` without targets."""
    at = time.time() if at is None else at
    metrics.cycles.labels(trigger).inc()
    state_path = target.tuner_dir / "state.json"
    state = load_state(state_path)
    try:
        base_commit = _base_commit(target, timeout_s=settings.fetch_timeout_s)
    except _FetchFailed as exc:
        reason = f"fail closed: {exc}; no proposal this cycle, the next one fetches again"
        decision = CycleDecision(None, None, (NoOp(FETCH_RULE, reason, "fetch"),))
        _record_noops(decision, metrics)
        metrics.last_cycle.set(time.time())
        return CycleReport(decision)
    base_text = gitrepo.read_at(target.repo, base_commit, target.policy_path)
    source = f"{target.policy_path}@{base_commit[:12]}"
    base_document = YAML(typ="rt").load(base_text)
    policy = parse_policy(base_document, source)
    snapshot = fetch_snapshot(
        client, signals=signals.SIGNALS, at=at, window=settings.window, metrics=metrics
    )
    decision = decide(
        policy=policy,
        snapshot=snapshot,
        state=state,
        settings=settings,
        models=committed_models(target, base_commit, policy),
    )
    _record_noops(decision, metrics)
    report = CycleReport(decision)

    if decision.compaction is not None:
        payload = compaction.compaction_payload(decision.compaction, policy=policy, at=at)
        outcome = "dry_run" if dry_run else "logged"
        if (compaction_url or compaction_services) and not dry_run:
            outcome = compaction.send(
                payload, compaction_url, compaction_services, compaction_token
            )
        log.info("compaction request %s %s: %s", payload["id"], outcome, payload["reason"])
        metrics.compaction_requests.labels(outcome).inc()
        report = replace(report, compaction_outcome=outcome)
        if outcome in ("delivered", "partial", "logged"):
            state = replace(state, last_compaction_at=at)

    proposal = decision.proposal
    if proposal is not None:
        new_text, new_document = edit_scalars(base_text, proposal.changes, document=base_document)
        after = parse_policy(new_document, f"{source} (proposed)")
        if after != apply_changes(policy, proposal.changes):
            raise RuntimeError(f"{target.policy_path}: the edited file differs from the decision")
        branch = prtext.branch_name(proposal, base_text=base_text, new_text=new_text)
        change = PolicyChange(
            target.repo, base_commit, target.policy_path, policy, base_text, new_text
        )
        body = prtext.pr_body(
            proposal,
            windows=snapshot.windows,
            at=at,
            window=settings.window,
            policy_path=target.policy_path,
            manifest_diff=manifest_diff(change, target=target.render_target),
            whatif=whatif_comparison(change, hours=settings.whatif_hours)
            if settings.whatif_hours > 0
            else None,
        )
        report = replace(report, branch=branch, body=body)
        if dry_run:
            report = replace(report, outcome="dry_run")
        elif gitrepo.branch_exists(target.repo, branch):
            log.info("%s: already proposed on %s; nothing new", proposal.rule, branch)
            report = replace(report, outcome="existing")
        else:
            commit = gitrepo.commit_on_new_branch(
                target.repo,
                base=base_commit,
                branch=branch,
                path=target.policy_path,
                text=new_text,
                message=f"{proposal.title}\n\n{body}",
            )
            body_path = target.tuner_dir / "proposals" / f"{branch.replace('/', '_')}.md"
            write_atomic(body_path, f"# {proposal.title}\n\n{body}")
            report = replace(report, outcome="created", commit=commit, body_path=body_path)
            state = replace(state, last_proposal_at=at, last_proposal_branch=branch)
            if forge_options is not None:
                report = replace(
                    report, pr_url=_open_pr(target, forge_options, proposal.title, body, branch)
                )
        metrics.proposals.labels(proposal.rule, report.outcome or "").inc()
    elif policy.tuner.advise.enabled:
        report, state = _advise(
            _AdviseContext(client, target, policy, base_commit, base_text, at, dry_run),
            report,
            state,
            settings=settings,
            forge_options=forge_options,
            metrics=metrics,
        )
    if not dry_run:
        save_state(state_path, state)
    metrics.last_cycle.set(time.time())
    return report


@dataclass(frozen=True)
class _AdviseContext:
    """What the advise lever reads of its cycle."""

    client: PrometheusConnect
    target: Target
    policy: PoolPolicy
    base_commit: str
    base_text: str
    at: float
    dry_run: bool


def _advise(
    cx: _AdviseContext,
    report: CycleReport,
    state: TunerState,
    *,
    settings: TunerSettings,
    forge_options: ForgeOptions | None,
    metrics: TunerMetrics,
) -> tuple[CycleReport, TunerState]:
    """The advise lever, when due and no rule proposed: production's trace of the window,
    a sweep on it, and the pick proposed when it changes the policy."""
    lever, target, policy = cx.policy.tuner.advise, cx.target, cx.policy

    def skip(noop: NoOp) -> CycleReport:
        log.info("%s: %s", noop.rule, noop.reason)
        if noop.fail_closed is not None:
            metrics.fail_closed.labels(noop.rule, noop.fail_closed).inc()
        decision = replace(report.decision, noops=(*report.decision.noops, noop))
        return replace(report, decision=decision)

    waiting = advice.due(lever, state, at=cx.at, cooldown_s=settings.cooldown_s)
    if waiting is not None:
        return skip(waiting), state
    branch = advice.branch_name(cx.base_text)
    if gitrepo.branch_exists(target.repo, branch):
        reason = f"already proposed on {branch} for this policy; the next sweep waits for a change"
        return skip(NoOp(advice.RULE, reason)), state
    swept = _sweep_production(cx)
    if isinstance(swept, NoOp):
        return skip(swept), state
    sweep, trace, samples = swept
    state = replace(state, last_advise_at=cx.at)
    rated = front.rate(sweep.points, sweep.fixed)
    pick = advice.choose(front.recommend(rated))
    if isinstance(pick, NoOp):
        return skip(pick), state
    new_text = _advised_text(cx, pick)
    title = advice.title(pick)
    body = advice.pr_body(
        sweep,
        rated,
        pick,
        policy=policy,
        policy_path=target.policy_path,
        window=lever.window,
        at=cx.at,
        samples=samples,
        plot_link=_plot_link(target, branch, forge_options),
        manifest_diff=manifest_diff(
            PolicyChange(
                target.repo, cx.base_commit, target.policy_path, policy, cx.base_text, new_text
            ),
            target=target.render_target,
        ),
        vary=lever.vary,
    )
    report = replace(report, advice=title, branch=branch, body=body)
    if cx.dry_run:
        report = replace(report, outcome="dry_run")
    else:
        plot = advise_report.plot(sweep, rated, pick)
        commit, body_path = _commit_advice(
            cx, branch=branch, title=title, body=body, new_text=new_text, trace=trace, plot=plot
        )
        report = replace(report, outcome="created", commit=commit, body_path=body_path)
        state = replace(state, last_proposal_at=cx.at, last_proposal_branch=branch)
        if forge_options is not None:
            report = replace(report, pr_url=_open_pr(target, forge_options, title, body, branch))
    metrics.proposals.labels(advice.RULE, report.outcome or "").inc()
    return report, state


def _advised_text(cx: _AdviseContext, pick: front.Rated) -> str:
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
    cx: _AdviseContext,
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


def _sweep_production(cx: _AdviseContext) -> tuple[Sweep, str, int] | NoOp:
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


def committed_models(target: Target, base_commit: str, policy: PoolPolicy) -> dict[str, ModelSpec]:
    """Each workload's model config as committed beside the policy at the base (the KV rule
    sizes ``--kv-cache-memory-bytes`` with it, as the render does); a config that cannot be
    read is left out and the KV rule says so."""
    folder = PurePosixPath(target.policy_path).parent
    models = {}
    for workload in policy.workloads:
        source = str(folder / workload.hf_config)
        try:
            document = json.loads(gitrepo.read_at(target.repo, base_commit, source))
            models[workload.name] = parse_model_config(document, source)
        except (gitrepo.GitError, json.JSONDecodeError, ModelConfigError) as exc:
            log.warning("%s: model config %s unreadable: %s", workload.name, source, exc)
    return models


class _FetchFailed(Exception):
    """The policy branch could not be fetched; the cycle fails closed."""


def _base_commit(target: Target, *, timeout_s: float) -> str:
    """The commit a cycle decides against: the remote's head of the base branch, fetched now,
    when the repository has ``target.remote``; otherwise the local ref, as committed."""
    if target.fetch and gitrepo.has_remote(target.repo, target.remote):
        branch = gitrepo.branch_of(target.repo, target.base)
        if branch is not None:
            try:
                return gitrepo.fetch_branch(target.repo, target.remote, branch, timeout_s=timeout_s)
            except gitrepo.GitError as exc:
                raise _FetchFailed(str(exc)) from None
    return gitrepo.resolve(target.repo, target.base)


def _record_noops(decision: CycleDecision, metrics: TunerMetrics) -> None:
    for noop in decision.noops:
        log.info("%s: %s", noop.rule, noop.reason)
        if noop.fail_closed is not None:
            metrics.fail_closed.labels(noop.rule, noop.fail_closed).inc()


def _open_pr(target: Target, options: ForgeOptions, title: str, body: str, branch: str) -> str:
    gitrepo.push(target.repo, target.remote, branch)
    base = gitrepo.git(target.repo, "rev-parse", "--abbrev-ref", target.base).strip()
    call = forge.build_pull_request(
        api_url=options.api_url,
        repository=options.repository,
        token=options.token,
        title=title,
        body=body,
        head=branch,
        base=base,
    )
    return forge.send(call)

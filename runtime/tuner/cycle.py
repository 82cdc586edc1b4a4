"""One tuning cycle: read Prometheus, decide, and turn the decision into a branch, a PR
text and maybe a compaction request. The only module that wires edges to the pure core."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from prometheus_api_client import PrometheusConnect
from ruamel.yaml import YAML

from policy import PoolPolicy, parse_policy
from runtime.atomic_file import write_atomic
from runtime.tuner import advice, compaction, gitrepo, prtext, signals
from runtime.tuner.advise_cycle import Advice, AdviseContext, advise
from runtime.tuner.decisions import decide
from runtime.tuner.levers import apply_changes
from runtime.tuner.manifests import PolicyChange, manifest_diff, whatif_comparison
from runtime.tuner.prometheus import fetch_snapshot
from runtime.tuner.proposals import CompactionRequest, CycleDecision, NoOp, Proposal, TunerState
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.snapshot import MetricsSnapshot
from runtime.tuner.state import load_state, save_state
from runtime.tuner.target import ForgeOptions, Target, open_pull_request
from runtime.tuner.yamledit import edit_scalars
from runtime.vllm import ModelConfigError, ModelSpec
from runtime.vllm.model_spec import parse_model_config

log = logging.getLogger(__name__)

FETCH_RULE = "policy-fetch"
"""Rule name of the fail-closed no-op (and metric label) when the policy branch can't be
fetched."""


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


@dataclass(frozen=True)
class _Cycle:
    """What every phase of one cycle reads: where it proposes, how, and when."""

    client: PrometheusConnect
    target: Target
    settings: TunerSettings
    metrics: TunerMetrics
    at: float
    dry_run: bool
    forge_options: ForgeOptions | None


@dataclass(frozen=True)
class _Base:
    """The policy as committed at the commit the cycle decides against."""

    commit: str
    text: str
    document: Any
    """``text`` as round-trip YAML, which the proposal's edit splices into."""
    policy: PoolPolicy
    source: str
    """``<policy path>@<commit>``, the policy's name in errors."""


CompactionTargets = tuple[str | None, Sequence[str], str | None]
"""Where compaction requests go: (URL, Services whose every pod gets one, bearer token)."""


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
    cy = _Cycle(client, target, settings, metrics, at, dry_run, forge_options)
    state_path = target.tuner_dir / "state.json"
    state = load_state(state_path)
    try:
        base_commit = _base_commit(target, timeout_s=settings.fetch_timeout_s)
    except _FetchFailed as exc:
        return _fetch_failed(exc, metrics)
    base = _read_base(target, base_commit)
    snapshot, decision = _decide(cy, base, state)
    report = CycleReport(decision)
    if decision.compaction is not None:
        targets = (compaction_url, compaction_services, compaction_token)
        outcome = _request_compaction(cy, decision.compaction, base.policy, targets)
        report = replace(report, compaction_outcome=outcome)
        if outcome in ("delivered", "partial", "logged"):
            state = replace(state, last_compaction_at=at)
    if decision.proposal is not None:
        written = _write_proposal(cy, decision.proposal, base, snapshot)
        report, state = _propose(cy, decision.proposal, written, report, state)
    elif base.policy.tuner.advise.enabled:
        cx = AdviseContext(client, target, base.policy, base.commit, base.text, at, dry_run)
        advised, state = advise(
            cx, state, settings=settings, forge_options=forge_options, metrics=metrics
        )
        report = _with_advice(report, advised, metrics)
    if not dry_run:
        save_state(state_path, state)
    metrics.last_cycle.set(time.time())
    return report


def _fetch_failed(exc: _FetchFailed, metrics: TunerMetrics) -> CycleReport:
    """The cycle's report when the base could not be fetched: one fail-closed no-op."""
    reason = f"fail closed: {exc}; no proposal this cycle, the next one fetches again"
    decision = CycleDecision(None, None, (NoOp(FETCH_RULE, reason, "fetch"),))
    _record_noops(decision, metrics)
    metrics.last_cycle.set(time.time())
    return CycleReport(decision)


def _read_base(target: Target, commit: str) -> _Base:
    """The policy file at ``commit``, as text, round-trip YAML and a parsed policy."""
    text = gitrepo.read_at(target.repo, commit, target.policy_path)
    source = f"{target.policy_path}@{commit[:12]}"
    document = YAML(typ="rt").load(text)
    return _Base(commit, text, document, parse_policy(document, source), source)


def _decide(cy: _Cycle, base: _Base, state: TunerState) -> tuple[MetricsSnapshot, CycleDecision]:
    """The window's series from Prometheus and the rules' decision on them (no-ops recorded)."""
    snapshot = fetch_snapshot(
        cy.client, signals=signals.SIGNALS, at=cy.at, window=cy.settings.window, metrics=cy.metrics
    )
    decision = decide(
        policy=base.policy,
        snapshot=snapshot,
        state=state,
        settings=cy.settings,
        models=committed_models(cy.target, base.commit, base.policy),
    )
    _record_noops(decision, cy.metrics)
    return snapshot, decision


def _request_compaction(
    cy: _Cycle, request: CompactionRequest, policy: PoolPolicy, targets: CompactionTargets
) -> str:
    """Send (or, without targets, log) the rule's compaction request; its outcome."""
    url, services, token = targets
    payload = compaction.compaction_payload(request, policy=policy, at=cy.at)
    outcome = "dry_run" if cy.dry_run else "logged"
    if (url or services) and not cy.dry_run:
        outcome = compaction.send(payload, url, services, token)
    log.info("compaction request %s %s: %s", payload["id"], outcome, payload["reason"])
    cy.metrics.compaction_requests.labels(outcome).inc()
    return outcome


@dataclass(frozen=True)
class _WrittenProposal:
    """A rule's proposal as written: the edited policy file, its branch and its PR body,
    and the commit they branch from."""

    base_commit: str
    new_text: str
    branch: str
    body: str


def _write_proposal(
    cy: _Cycle, proposal: Proposal, base: _Base, snapshot: MetricsSnapshot
) -> _WrittenProposal:
    """The policy file with the proposal's scalars spliced in (checked to parse to what the
    rule decided), its content-derived branch and the PR body with both policies' diff."""
    target, settings = cy.target, cy.settings
    new_text, new_document = edit_scalars(base.text, proposal.changes, document=base.document)
    after = parse_policy(new_document, f"{base.source} (proposed)")
    if after != apply_changes(base.policy, proposal.changes):
        raise RuntimeError(f"{target.policy_path}: the edited file differs from the decision")
    branch = prtext.branch_name(proposal, base_text=base.text, new_text=new_text)
    change = PolicyChange(
        target.repo, base.commit, target.policy_path, base.policy, base.text, new_text
    )
    body = prtext.pr_body(
        proposal,
        windows=snapshot.windows,
        at=cy.at,
        window=settings.window,
        policy_path=target.policy_path,
        manifest_diff=manifest_diff(change, target=target.render_target),
        whatif=whatif_comparison(change, hours=settings.whatif_hours)
        if settings.whatif_hours > 0
        else None,
    )
    return _WrittenProposal(base.commit, new_text, branch, body)


def _propose(
    cy: _Cycle,
    proposal: Proposal,
    written: _WrittenProposal,
    report: CycleReport,
    state: TunerState,
) -> tuple[CycleReport, TunerState]:
    """A rule's proposal committed on its own branch (and opened as a pull request), unless
    a dry run or already proposed; the report and state after it."""
    target, branch, body = cy.target, written.branch, written.body
    report = replace(report, branch=branch, body=body)
    if cy.dry_run:
        report = replace(report, outcome="dry_run")
    elif gitrepo.branch_exists(target.repo, branch):
        log.info("%s: already proposed on %s; nothing new", proposal.rule, branch)
        report = replace(report, outcome="existing")
    else:
        commit = gitrepo.commit_on_new_branch(
            target.repo,
            base=written.base_commit,
            branch=branch,
            path=target.policy_path,
            text=written.new_text,
            message=f"{proposal.title}\n\n{body}",
        )
        body_path = target.tuner_dir / "proposals" / f"{branch.replace('/', '_')}.md"
        write_atomic(body_path, f"# {proposal.title}\n\n{body}")
        report = replace(report, outcome="created", commit=commit, body_path=body_path)
        state = replace(state, last_proposal_at=cy.at, last_proposal_branch=branch)
        if cy.forge_options is not None:
            pr_url = open_pull_request(target, cy.forge_options, proposal.title, body, branch)
            report = replace(report, pr_url=pr_url)
    cy.metrics.proposals.labels(proposal.rule, report.outcome or "").inc()
    return report, state


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
    """Log the decision's no-ops and count those that failed closed."""
    for noop in decision.noops:
        _record_noop(noop, metrics)


def _record_noop(noop: NoOp, metrics: TunerMetrics) -> None:
    """Log a no-op and count it where it failed closed."""
    log.info("%s: %s", noop.rule, noop.reason)
    if noop.fail_closed is not None:
        metrics.fail_closed.labels(noop.rule, noop.fail_closed).inc()


def _with_advice(report: CycleReport, advised: Advice | NoOp, metrics: TunerMetrics) -> CycleReport:
    """``report`` with what the advise lever did: its proposal, or its no-op (recorded)."""
    if isinstance(advised, NoOp):
        _record_noop(advised, metrics)
        decision = replace(report.decision, noops=(*report.decision.noops, advised))
        return replace(report, decision=decision)
    return replace(
        report,
        advice=advised.title,
        branch=advised.branch,
        body=advised.body,
        outcome=advised.outcome,
        commit=advised.commit,
        body_path=advised.body_path,
        pr_url=advised.pr_url,
    )

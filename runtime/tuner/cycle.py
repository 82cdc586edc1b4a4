"""One tuning cycle: read Prometheus, decide, and turn the decision into a branch, a PR
text and maybe a compaction request. The only module that wires edges to the pure core."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from prometheus_api_client import PrometheusConnect
from ruamel.yaml import YAML

from infra.builders.nodepools import Target as NodePoolTarget
from policy import PoolPolicy, parse_policy
from runtime.atomic_file import write_atomic
from runtime.tuner import compaction, forge, gitrepo, prtext, signals
from runtime.tuner.decisions import CycleDecision, NoOp, apply_changes, decide
from runtime.tuner.manifests import PolicyChange, manifest_diff, whatif_comparison
from runtime.tuner.prometheus import fetch_snapshot
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.settings import TunerSettings
from runtime.tuner.state import load_state, save_state
from runtime.tuner.yamledit import edit_scalars
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

    def lines(self) -> list[str]:
        out = [f"{n.rule}: {n.reason}" for n in self.decision.noops]
        if self.decision.compaction is not None:
            out.append(
                f"compaction request ({self.compaction_outcome}): {self.decision.compaction.reason}"
            )
        p = self.decision.proposal
        if p is not None:
            out.append(f"proposal {p.rule} ({self.outcome}): {p.title}")
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
    if not dry_run:
        save_state(state_path, state)
    metrics.last_cycle.set(time.time())
    return report


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

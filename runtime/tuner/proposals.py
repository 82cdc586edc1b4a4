"""Pure: the values a tuning cycle produces (proposals, compaction requests, no-ops) and
the state it keeps. Their own module so the rules (``decisions``), their prose
(``rule_text``) and the PR text (``prtext``) all import them without a cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

PolicyPath = tuple[str | int, ...]
"""Path of a scalar in the policy document, e.g. ``("elastic", "shed_while_production_above")``."""


@dataclass(frozen=True)
class Change:
    """One scalar of the policy, before and after, and the lever that moved it."""

    path: PolicyPath
    before: float
    after: float
    lever: str = ""
    """``Lever.name`` of the step that made this change."""

    @property
    def dotted(self) -> str:
        return ".".join(str(p) for p in self.path)


@dataclass(frozen=True)
class Evidence:
    """A window that backed a decision and the condition it met."""

    series: str
    condition: str
    summary: str


@dataclass(frozen=True)
class Proposal:
    """A reviewed policy change the tuner wants; becomes a branch and a PR."""

    rule: str
    title: str
    changes: tuple[Change, ...]
    rationale: str
    expected_effect: str
    evidence: tuple[Evidence, ...]
    adds_flex_load: bool


@dataclass(frozen=True)
class CompactionRequest:
    """Ask the KV compaction worker to compact: the cache is sparse, not short."""

    reason: str
    evidence: tuple[Evidence, ...]


@dataclass(frozen=True)
class NoOp:
    """A rule that decided nothing, and why; ``fail_closed`` names the bad data's kind."""

    rule: str
    reason: str
    fail_closed: str | None = None


Outcome = Proposal | CompactionRequest | NoOp


@dataclass(frozen=True)
class TunerState:
    """What the tuner remembers between cycles (persisted by the state edge)."""

    last_proposal_at: float | None = None
    last_proposal_branch: str | None = None
    last_compaction_at: float | None = None
    last_advise_at: float | None = None
    """When the advise lever last finished a sweep (``tuner.advise.every`` counts from it)."""


@dataclass(frozen=True)
class CycleDecision:
    """The outcome of one cycle: at most one proposal, maybe a compaction request, and why."""

    proposal: Proposal | None
    compaction: CompactionRequest | None
    noops: tuple[NoOp, ...] = field(default_factory=tuple)

"""The one value every tuning rule reads, and the phases all rules share.

A rule takes one frozen ``RuleContext`` (the cycle's policy, windows, memory, settings and
model configs), which owns the window lookups, so no rule repeats their four arguments. A
window a rule cannot trust ends the rule with a reasoned no-op (``MissingWindow``,
``noop_for``); what held is evidence (``sustained``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import runtime.tuner.rule_text as rule_text
from policy import PoolPolicy
from policy.base import duration_seconds
from runtime.tuner.proposals import Evidence, NoOp, TunerState
from runtime.tuner.settings import TunerSettings
from runtime.tuner.signals import split
from runtime.tuner.snapshot import MetricsSnapshot, Unusable, Window, check, usable
from runtime.vllm import ModelSpec


@dataclass(frozen=True)
class RuleContext:
    """Everything a rule may read: one cycle's policy, windows, memory, settings and the
    committed model configs (each workload's, by name; the KV rule sizes its cache)."""

    policy: PoolPolicy
    snapshot: MetricsSnapshot
    settings: TunerSettings
    state: TunerState = field(default_factory=TunerState)
    models: Mapping[str, ModelSpec] = field(default_factory=dict)

    @property
    def persistence(self) -> float:
        """Share of a window's samples a condition must hold in."""
        return self.settings.persistence

    @property
    def eviction_limit(self) -> float:
        """The alert's flex eviction rate limit, per minute."""
        return self.policy.alerting.thresholds.flex_eviction_rate.per_minute_max

    def usable(self, name: str) -> Window | Unusable:
        """The combined window of ``name``, or why it cannot be trusted."""
        stale_after_s, min_observation_s = self._limits()
        return usable(
            self.snapshot, name, stale_after_s=stale_after_s, min_observation_s=min_observation_s
        )

    def windows(self, names: Sequence[str]) -> list[Window]:
        """The windows of ``names``; raises ``MissingWindow`` on the first that is unusable."""
        found = []
        for name in names:
            got = self.usable(name)
            if isinstance(got, Unusable):
                raise MissingWindow(got)
            found.append(got)
        return found

    def split(self, name: str, by: Sequence[str]) -> dict[tuple[str, ...], Window]:
        """The usable windows of ``name`` per value tuple of ``by``; unusable splits (an
        instance that started recently, a workload gone stale) are left out."""
        stale_after_s, min_observation_s = self._limits()
        out = {}
        for key, window in split(self.snapshot, name, by).items():
            got = check(
                window,
                window.name,
                at=self.snapshot.at,
                stale_after_s=stale_after_s,
                min_observation_s=min_observation_s,
            )
            if isinstance(got, Window):
                out[key] = got
        return out

    def _limits(self) -> tuple[float, float]:
        """(stale after, minimum observation), in seconds."""
        interval_s = duration_seconds(self.policy.metrics.evaluation_interval)
        return self.settings.stale_after_intervals * interval_s, self.settings.min_observation_s


class MissingWindow(Exception):
    """A window the rule needs is unusable: the rule ends in a no-op saying why."""

    def __init__(self, unusable: Unusable) -> None:
        self.unusable = unusable


def noop_for(rule: str, missing: MissingWindow, what: str) -> NoOp:
    """The rule's no-op on a window it cannot judge; "short" history is no failure."""
    u = missing.unusable
    return NoOp(rule, rule_text.unusable(u, what), None if u.kind == "short" else u.kind)


def sustained(window: Window, test: Callable[[float], bool], condition: str) -> Evidence:
    """An evidence row: the share of ``window``'s samples for which ``test`` held."""
    return Evidence(
        window.name, rule_text.sustained(window.share(test), condition), window.summary()
    )

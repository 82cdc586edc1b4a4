"""The catalogue as recording rules: alerts, the HPA and the dashboard read these series.

The flex budget's terms get a file of their own (``rules/budget.yaml``), each rule with its
meaning and the policy fields it is built from beside it, so a policy change's diff shows
the one term it changes under the words that say what that term is.
"""

from __future__ import annotations

import re

from alerts.rules import Group, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import TERMS, Catalogue

_RECORD = re.compile(r"^(?P<indent> *)- record: (?P<record>\S+)$", re.MULTILINE)


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    """Every query but the budget's terms, in one group."""
    rules = [q.recording_rule() for q in catalogue if q.record not in TERMS]
    return [group("gpupool.catalogue", policy, rules)]


def budget_groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    """The budget's terms in one group, each after the terms it reads: Prometheus evaluates
    a group's rules one after another at the same timestamp, a rule seeing the results of
    those before it, so the budget lags its exporter inputs by no extra evaluation."""
    rules = [q.recording_rule() for q in catalogue.budget]
    return [group("gpupool.budget", policy, rules)]


def with_help(text: str, catalogue: Catalogue) -> str:
    """Rule file ``text`` with a comment above each rule recording a catalogue query: what
    it records, and the policy fields (``knobs``) its expression is built from."""
    known = {q.record: q for q in catalogue}

    def comment(match: re.Match[str]) -> str:
        query, indent = known.get(match["record"]), match["indent"]
        if query is None:
            return match[0]
        lines = [f"{indent}# {query.help} ({query.unit})"]
        if query.knobs:
            lines.append(f"{indent}# knobs: {', '.join(query.knobs)}")
        return "\n".join([*lines, match[0]])

    return _RECORD.sub(comment, text)

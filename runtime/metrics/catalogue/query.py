"""The values the catalogue is made of: named queries and the exporters they read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Query:
    """One named query: the series it is recorded as, its PromQL, and what it means."""

    record: str
    expr: str
    """What the recording rule evaluates; a budget term reads the terms before it."""
    help: str
    unit: str
    knobs: tuple[str, ...] = ()
    """The policy fields ``expr`` is built from (shown beside each rule)."""
    standalone: str | None = None
    """``expr`` with the recorded series it reads replaced by their own PromQL; None where
    ``expr`` reads exporter series only."""

    def recording_rule(self) -> dict[str, Any]:
        """The query as a Prometheus recording rule."""
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Requirement:
    """A series the catalogue reads from a source that has a row whenever the source is up
    and set up as docs/alerts.md ("What gpupool needs from the cluster") says."""

    selector: str
    fix: str
    """What to change when the source is up but this series is missing."""


@dataclass(frozen=True)
class Source:
    """An exporter the catalogue depends on, and a series whose absence means it is gone."""

    name: str
    selector: str
    requires: tuple[Requirement, ...] = ()
    """Further series of this source the catalogue needs; GpupoolMetricMissing fires for
    each one missing while ``selector`` is present (the source runs without it)."""

"""The traffic-class figures as text: the table (console and markdown) and the report's section."""

from __future__ import annotations

from runtime.sim.report import ClassFigures, Summary

CLASS_COLUMNS = (
    "class",
    "replay",
    "arrived",
    "served",
    "queued",
    "shed",
    "shed in bursts",
    "shed at start",
    "lost (drained)",
    "dropped",
)
"""Columns of the traffic-class table (console and markdown); ``class_lines`` says what
each means."""


def _used(pooled: Summary, fixed: Summary) -> dict[str, tuple[ClassFigures, ClassFigures]]:
    """The classes some request of either replay arrived in, pooled and fixed figures."""
    p, f = pooled.traffic_classes or {}, fixed.traffic_classes or {}
    return {
        name: (c, f[name]) for name, c in p.items() if name in f and (c.arrived or f[name].arrived)
    }


def class_rows(pooled: Summary, fixed: Summary) -> list[tuple[str, ...]]:
    """Per traffic class that saw requests, and replay: its requests and their shares of the
    arrivals (no rows without traffic classes)."""
    return [
        (name, replay, *_class_cells(c))
        for name, both in _used(pooled, fixed).items()
        for replay, c in zip(("pooled", "fixed"), both, strict=True)
    ]


def _class_cells(c: ClassFigures) -> tuple[str, ...]:
    """The figures of one class and replay, counts with their share of the arrivals."""

    def part(n: int, share: float | None) -> str:
        return f"{n:,}" if share is None else f"{n:,} ({share:.1%})"

    return (
        f"{c.arrived:,}",
        part(c.served, c.served_share),
        part(c.queued, c.queued_share),
        part(c.shed, c.shed_share),
        f"{c.shed_during_bursts:,}",
        f"{c.shed_at_start:,}",
        f"{c.lost:,} ({c.drained:,})",
        f"{c.dropped:,}",
    )


def class_lines(pooled: Summary, fixed: Summary) -> list[str]:
    """The traffic-class section of a report (nothing without traffic classes)."""
    used = _used(pooled, fixed)
    if not used:
        return []
    first = next(iter(used.values()))[0]
    classes = "; ".join(
        f"{name}: priority {c.priority}, served by {c.served_by}"
        + (", sheddable" if c.sheddable else "")
        for name, (c, _) in used.items()
    )
    return [
        f"Traffic classes ({classes}). The endpoint picker sheds (429/503) a sheddable request "
        "that arrives while its pool is saturated or has no ready instance, and queues every "
        "other; queued: admitted and unfinished at the end; shed in bursts: in the "
        f"{first.burst_minutes:,.1f} min production's pods held more GPUs than their median "
        "over the replay; shed at start: before the pooled replay's first flex replica was "
        f"ready ({first.start_minutes:,.1f} min: it starts flex cold, the fixed topology "
        "warm); lost: in flight on a pod that exited and not finished within its drain "
        "window (drained: finished, counted as served); dropped: over max_model_len. "
        "arrived = served + queued + shed + dropped + lost.",
        "",
        "| " + " | ".join(CLASS_COLUMNS) + " |",
        "|---|---|" + "---:|" * (len(CLASS_COLUMNS) - 2),
        *("| " + " | ".join(row) + " |" for row in class_rows(pooled, fixed)),
    ]

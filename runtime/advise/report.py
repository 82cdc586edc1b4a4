"""What a sweep tells the owner: the table, the JSON, the Pareto plot (pure but the PNG).

Every figure is the pooled replay's, in the report's units (GPU-hours; harm also in
pod-minutes), beside the fixed topology's on the same hardware.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from runtime.advise.front import Rated, dominates
from runtime.advise.sweep import Sweep
from runtime.sim.markdown import value_delta
from runtime.sim.report import Summary
from runtime.tuner.yamledit import render

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT = "pareto.png"


def table_rows(rated: Sequence[Rated], pick: Rated | None) -> list[tuple[str, ...]]:
    """One row per replayed variant, most harvest first."""
    rows: list[tuple[str, ...]] = []
    for r in sorted(rated, key=lambda r: -r.summary.harvested_gpu_h):
        s = r.summary
        marks = [
            m
            for m, on in (
                ("recommended", r is pick),
                ("current", not r.point.variant.edits),
                ("front", r.on_front),
            )
            if on
        ] + ([] if r.refused is None else [r.refused])
        rows.append(
            (
                r.point.variant.name,
                f"{s.harvested_gpu_h:,.1f}",
                "n/a" if s.harvest_efficiency is None else f"{s.harvest_efficiency:.2f}",
                f"{s.useful_gpu_h:,.1f}",
                f"{s.prod_short_gpu_h:,.2f}",
                f"{s.prod_unmet_pod_minutes:,.1f}",
                f"{s.evictions_per_minute_max:.2f}",
                _monthly(s),
                ", ".join(marks),
            )
        )
    return rows


CONSOLE_COLUMNS = ("variant", "harvested GPU-h", "short GPU-h / pending pod-min", "evict/min", "")
"""The console's columns: the table's that fit 80 columns (``console_rows``)."""


def console_rows(rows: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """``table_rows`` cut to ``CONSOLE_COLUMNS``."""
    return [(r[0], r[1], f"{r[4]} / {r[5]}", r[6], r[8]) for r in rows]


COLUMNS = (
    "variant",
    "harvested GPU-h",
    "harvest efficiency",
    "useful GPU-h",
    "production short GPU-h",
    "production pod-min pending",
    "evictions/min max",
    "harvest worth a month",
    "",
)


def markdown(
    sweep: Sweep, rated: Sequence[Rated], pick: Rated | None, *, plot_link: str = PLOT
) -> str:
    """The sweep as a markdown page: the pick first, the plot (``plot_link``: beside the
    page, or a URL), the table, what was not replayed."""
    f = sweep.fixed
    lines = [
        "## gpupool advise",
        "",
        recommendation_line(sweep, pick),
        "",
        front_line(rated),
        "",
        f"![harvest against production harm]({plot_link})",
        "",
        f"Fixed topology on the current hardware: harvested {f.harvested_gpu_h:,.1f} GPU-h, "
        f"useful {f.useful_gpu_h:,.1f} GPU-h, production short {f.prod_short_gpu_h:,.2f} "
        f"GPU-h, {f.prod_unmet_pod_minutes:,.1f} pod-min pending.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 2) + "---|",
        *("| " + " | ".join(row) + " |" for row in table_rows(rated, pick)),
        "",
        *_skipped(sweep),
        f"{len(sweep.points)} variants, {sum(1 for p in sweep.points if p.summary)} replayed in "
        f"{sweep.seconds:,.0f} s, {sweep.jobs} at a time ({sweep.backend}).",
        "",
    ]
    return "\n".join(lines)


FRONT = "Front: "
"""Start of the line that says whether the current policy is on the front (the
pull-request check quotes it)."""


def front_line(rated: Sequence[Rated]) -> str:
    """Whether the current policy lies on the Pareto front of its own sweep, and if not, the
    variant that beats it by the most harvest."""
    current = next((r for r in rated if not r.point.variant.edits), None)
    if current is None:
        return f"{FRONT}the current policy was not replayed."
    if current.on_front:
        return (
            f"{FRONT}the current policy is on the Pareto front of its sweep: no variant "
            "harvests more with no more production harm."
        )
    better = [r for r in rated if dominates(r.summary, current.summary)]
    best = max(better, key=lambda r: r.summary.harvested_gpu_h)
    gain = best.summary.harvested_gpu_h - current.summary.harvested_gpu_h
    return (
        f"{FRONT}the current policy is NOT on the Pareto front of its sweep: "
        f"{best.point.variant.name} harvests {gain:+,.1f} GPU-h with no more production harm "
        f"({len(better)} variants beat it)."
    )


def _monthly(summary: Summary) -> str:
    value = summary.harvest_value
    return "n/a" if value is None else f"{value.currency} {value.per_month:,.0f}"


def recommendation_line(sweep: Sweep, pick: Rated | None) -> str:
    """One line: the recommended variant and its gain over the current policy, or why none."""
    current = sweep.current.summary
    if pick is None or current is None:
        return (
            "No variant is recommended: every replayed variant left production short "
            "beyond the goals' allowance or evicted flex more than 5 times a minute."
        )
    s = pick.summary
    gain = s.harvested_gpu_h - current.harvested_gpu_h
    if not pick.point.variant.edits:
        return (
            f"The current policy is the recommendation: no variant harvests more with "
            f"production unharmed ({s.harvested_gpu_h:,.1f} GPU-h harvested)."
        )
    return (
        f"Recommended: {pick.point.variant.name}: harvested {s.harvested_gpu_h:,.1f} "
        f"GPU-h vs {current.harvested_gpu_h:,.1f} now ({gain:+,.1f}); "
        f"useful {s.useful_gpu_h:,.1f} vs {current.useful_gpu_h:,.1f} GPU-h; production short "
        f"{s.prod_short_gpu_h:,.2f} GPU-h, {s.prod_unmet_pod_minutes:,.1f} pod-min pending; "
        f"evictions max {s.evictions_per_minute_max:.2f}/min"
        + ("" if (worth := value_delta(current, s)) is None else f"; {worth}")
    )


def _skipped(sweep: Sweep) -> list[str]:
    skipped = [p for p in sweep.points if p.summary is None]
    if not skipped:
        return []
    return [
        "Not replayed:",
        *(f"- {p.variant.name}: {p.problem}" for p in skipped),
        "",
    ]


def as_json(sweep: Sweep, rated: Sequence[Rated], pick: Rated | None) -> dict[str, Any]:
    """The sweep as JSON: every variant's edits and summary (or problem), the fixed
    topology, the front and the recommendation."""
    by_variant = {id(r.point): r for r in rated}
    variants = []
    for point in sweep.points:
        r = by_variant.get(id(point))
        variants.append(
            {
                "name": point.variant.name,
                "edits": [
                    {"path": list(e.path), "value": e.value, "yaml": render(e.value)}
                    for e in point.variant.edits
                ],
                "problem": point.problem,
                "summary": None if point.summary is None else asdict(point.summary),
                "harm": None if r is None else r.harm,
                "on_front": None if r is None else r.on_front,
                "refused": None if r is None else r.refused,
            }
        )
    return {
        "recommended": None if pick is None else pick.point.variant.name,
        "fixed": asdict(sweep.fixed),
        "variants": variants,
        "seconds": sweep.seconds,
        "jobs": sweep.jobs,
        "backend": sweep.backend,
    }


def plot(sweep: Sweep, rated: Sequence[Rated], pick: Rated | None) -> bytes:
    """PNG: harvested GPU-hours against harm, evictions per minute as colour, the front as
    a line, the current policy ringed, the pick starred, the fixed topology as a cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        _variants(fig, ax, rated)
        _marks(ax, rated, pick, sweep.fixed)
        ax.set(
            xlabel="harvested GPU-hours (flex replicas running)",
            ylabel="production harm: busy GPU-h short + pod-min pending",
            title="Policy variants: harvest against production harm",
        )
        ax.legend(loc="upper left", fontsize=8)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        return buffer.getvalue()
    finally:
        plt.close(fig)


def _variants(fig: Figure, ax: Any, rated: Sequence[Rated]) -> None:
    """Every replayed variant as a dot coloured by its evictions, and the front as a line."""
    x = [r.summary.harvested_gpu_h for r in rated]
    y = [r.harm for r in rated]
    c = [r.summary.evictions_per_minute_max for r in rated]
    dots = ax.scatter(x, y, c=c, cmap="viridis", s=36, zorder=3)
    fig.colorbar(dots, ax=ax, label="flex evictions per minute (max)")
    front = sorted((r for r in rated if r.on_front), key=lambda r: r.summary.harvested_gpu_h)
    ax.plot(
        [r.summary.harvested_gpu_h for r in front],
        [r.harm for r in front],
        color="#d62728",
        lw=1,
        label="Pareto front",
        zorder=2,
    )


def _marks(ax: Any, rated: Sequence[Rated], pick: Rated | None, fixed: Summary) -> None:
    """The current policy ringed, the pick starred and the fixed topology as a cross."""
    for r in rated:
        if not r.point.variant.edits:
            ax.scatter(
                [r.summary.harvested_gpu_h],
                [r.harm],
                s=160,
                facecolors="none",
                edgecolors="black",
                label="current policy",
                zorder=4,
            )
    if pick is not None:
        ax.scatter(
            [pick.summary.harvested_gpu_h],
            [pick.harm],
            marker="*",
            s=260,
            color="#ff7f0e",
            edgecolors="black",
            label="recommended",
            zorder=5,
        )
    ax.scatter(
        [fixed.harvested_gpu_h],
        [fixed.prod_short_gpu_h + fixed.prod_unmet_pod_minutes],
        marker="x",
        s=80,
        color="black",
        label="fixed topology",
        zorder=4,
    )

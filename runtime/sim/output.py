"""A what-if result as files: JSON and PNG plots (bytes; ``runtime.atomic_file`` writes them
with the markdown report as one set)."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from runtime.sim.replay_model import Replay
from runtime.sim.report import Summary
from runtime.sim.whatif import Result

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOTS = ("gpus_held.png", "duty_cycle.png", "gpus.png", "utilization.png", "evictions.png")
"""File names of ``write_plots`` (after its prefix), in the order a report shows them."""


def as_json(result: Result) -> dict[str, object]:
    """The result as JSON: ``useful_gpu_h_ratio`` and ``fixed_duty_cycle`` at the top, the
    goals, each replay's summary (``report.Summary``'s fields) and its series."""
    pooled, fixed = result.replays
    tuner = {} if result.tuner is None else {"tuner": asdict(result.tuner)}
    return {
        **tuner,
        "useful_gpu_h_ratio": result.useful_gpu_h_ratio,
        "fixed_duty_cycle": result.fixed_duty_cycle,
        "production_to_flex": result.production_to_flex,
        "reserve_gpus": result.reserve_gpus,
        "goals": [asdict(g) for g in result.goals],
        "pooled": _summary(result.pooled),
        "fixed": _summary(result.fixed),
        "layout": asdict(result.layout),
        "assumptions": list(result.assumptions),
        "series": {"step_s": pooled.step_s, "pooled": _series(pooled), "fixed": _series(fixed)},
    }


def _summary(summary: Summary) -> dict[str, object]:
    """A summary as JSON; ``traffic_classes`` only where the replay had them, so a policy
    without a ``serving`` section writes what it wrote before."""
    out = asdict(summary)
    if out["traffic_classes"] is None:
        del out["traffic_classes"]
    return out


def _series(replay: Replay) -> dict[str, list[float]]:
    s = replay.series
    names = (
        "t",
        "prod_need",
        "prod_gpus",
        "prod_pending",
        "flex_gpus",
        "flex_running_gpus",
        "free_gpus",
        "evictions",
    )
    out = {name: [float(v) for v in getattr(s, name)] for name in names}
    out["useful_gpus"] = [float(v) for v in useful_gpus(replay)]
    return out


def useful_gpus(replay: Replay) -> NDArray[np.float64]:
    """Per step: production's served busy GPU-equivalents plus flex's busy ones."""
    s = replay.series
    return s.array("prod_busy_served") + s.array("flex_duty") * s.array("flex_running_gpus")


def cluster_duty(replay: Replay) -> NDArray[np.float64]:
    """Per step: useful GPUs over the cluster's GPUs (0 with none)."""
    total = replay.series.array("total_gpus")
    return np.divide(useful_gpus(replay), total, out=np.zeros_like(total), where=total > 0)


def relative(paths: Sequence[Path], report: Path) -> list[str]:
    """``paths`` as links from the folder of ``report`` (a markdown file)."""
    folder = report.resolve().parent
    return [Path(os.path.relpath(p.resolve(), folder)).as_posix() for p in paths]


def json_bytes(result: Result) -> bytes:
    return (json.dumps(as_json(result), indent=1, sort_keys=True) + "\n").encode("utf-8")


def plots(result: Result, *, prefix: str = "") -> dict[str, bytes]:
    """``PLOTS`` as PNG images (``prefix`` + name -> bytes): GPUs held over time (production,
    flex per pool, reserve, idle) and the cluster duty cycle pooled vs fixed first, then GPUs
    held with production's need, utilization per pool and evictions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = (_held_plot, _duty_plot, _gpus_plot, _utilization_plot, _evictions_plot)
    images: dict[str, bytes] = {}
    for name, draw in zip(PLOTS, figures, strict=True):
        fig = draw(result)
        buffer = io.BytesIO()
        try:
            fig.savefig(buffer, format="png", dpi=110)
        finally:
            plt.close(fig)
        images[f"{prefix}{name}"] = buffer.getvalue()
    return images


def _hours(replay: Replay) -> NDArray[np.float64]:
    return np.asarray(replay.series.t) / 3600


def _subplots(height: float) -> tuple[Figure, Any]:
    """A 9-inch-wide figure and its axes (``plots`` has chosen the Agg backend)."""
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(9, height))


def _held_plot(result: Result) -> Figure:
    """GPUs held over time in the pooled replay, stacked (``_held_bands``)."""
    s = result.replays[0].series
    hours = _hours(result.replays[0])
    fig, ax = _subplots(4)
    bands, labels, colors = _held_bands(result)
    ax.stackplot(hours, *bands, labels=labels, colors=colors)
    ax.plot(hours, s.array("prod_busy"), color="black", lw=0.8, label="production busy (wanted)")
    ax.set(xlabel="hours", ylabel="GPUs", title="GPUs held over time (pooled)")
    ax.legend(loc="upper right", fontsize=7)
    return fig


def _duty_plot(result: Result) -> Figure:
    """The cluster duty cycle per step, pooled against fixed."""
    pooled, fixed = result.replays
    fig, ax = _subplots(4)
    for replay, color in ((pooled, "#2ca02c"), (fixed, "#1f77b4")):
        duty = cluster_duty(replay)
        summary = result.pooled if replay is pooled else result.fixed
        ax.plot(
            _hours(replay),
            duty,
            lw=1,
            color=color,
            label=f"{replay.name} (mean {summary.cluster_duty_cycle:.1%})",
        )
    ax.set(
        xlabel="hours",
        ylabel="useful GPUs / all GPUs",
        ylim=(0, 1.05),
        title=f"Cluster duty cycle, pooled vs fixed ({result.useful_gpu_h_ratio:.2f}x useful "
        "GPU-hours)",
    )
    ax.legend(loc="upper right", fontsize=8)
    return fig


def _gpus_plot(result: Result) -> Figure:
    """GPUs held in the pooled replay with production's need and the fixed topology's flex."""
    pooled, fixed = result.replays
    s = pooled.series
    hours = _hours(pooled)
    fig, ax = _subplots(4)
    ax.stackplot(
        hours,
        s.array("prod_gpus"),
        s.array("flex_gpus"),
        s.array("free_gpus"),
        labels=("production", "flex", "unallocated"),
        colors=("#d62728", "#2ca02c", "#cccccc"),
    )
    ax.plot(hours, s.array("prod_need"), color="black", lw=0.8, label="production need")
    ax.plot(
        hours,
        fixed.series.array("flex_gpus"),
        "--",
        color="#1f77b4",
        lw=1,
        label="flex, fixed topology",
    )
    ax.set(xlabel="hours", ylabel="GPUs", title="GPUs held (pooled)")
    ax.legend(loc="upper right", fontsize=8)
    return fig


def _utilization_plot(result: Result) -> Figure:
    """Each pool's GPU duty cycle in the pooled replay."""
    s = result.replays[0].series
    hours = _hours(result.replays[0])
    fig, ax = _subplots(4)
    for pool, values in s.util_by_pool.items():
        ax.plot(hours, values, lw=1, label=f"{pool} duty cycle")
    ax.set(xlabel="hours", ylabel="utilization", ylim=(0, 1.05), title="GPU utilization per pool")
    if s.util_by_pool:
        ax.legend(loc="upper right", fontsize=8)
    return fig


def _evictions_plot(result: Result) -> Figure:
    """Flex evictions per step in the pooled replay."""
    pooled = result.replays[0]
    fig, ax = _subplots(3)
    evictions = pooled.series.array("evictions")
    ax.bar(_hours(pooled), evictions, width=pooled.step_s / 3600, color="#9467bd")
    p = result.pooled
    ax.set(
        xlabel="hours",
        ylabel=f"flex pods evicted per {pooled.step_s:g} s",
        title=f"Flex evictions (pooled): {p.evictions_total:,} pods, "
        f"{p.kv_tier.evicted_replicas:,} of them running; max {p.evictions_per_minute_max:.2f}/min",
    )
    return fig


def _held_bands(
    result: Result,
) -> tuple[list[NDArray[np.float64]], list[str], list[str]]:
    """The pooled replay's GPUs per step, stacked to the cluster's: production's, running
    flex per pool, flex starting or stopping, unallocated GPUs up to the pools' reserves
    (``Result.reserve_gpus``, the reserve with every node schedulable) and the rest idle."""
    s = result.replays[0].series
    running = s.array("flex_running_gpus")
    free = s.array("free_gpus")
    reserve = np.minimum(free, float(result.reserve_gpus))
    bands = [s.array("prod_gpus")]
    labels = ["production"]
    pools = {p: np.asarray(v, dtype=np.float64) for p, v in s.flex_by_pool.items() if any(v)}
    if not pools:
        pools = {"all pools": running}
    greens = ("#2ca02c", "#98df8a", "#17becf", "#9edae5", "#bcbd22")
    for pool, held in pools.items():
        bands.append(held)
        labels.append(f"flex on {pool}")
    colors = ["#d62728", *(greens[i % len(greens)] for i in range(len(pools)))]
    bands += [s.array("flex_gpus") - running, reserve, free - reserve]
    labels += ["flex starting or stopping", "reserve (kept free)", "idle"]
    colors += ["#ffbb78", "#aec7e8", "#cccccc"]
    return bands, labels, colors

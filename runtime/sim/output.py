"""Edge: a what-if result on disk: JSON, markdown and PNG plots, each written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from runtime.atomic_file import write_atomic
from runtime.sim.engine import Replay
from runtime.sim.report import Summary
from runtime.sim.whatif import Result

PLOTS = ("gpus.png", "utilization.png", "evictions.png")


def as_json(result: Result) -> dict[str, object]:
    pooled, fixed = result.replays
    tuner = {} if result.tuner is None else {"tuner": asdict(result.tuner)}
    return {
        **tuner,
        "throughput_ratio": result.throughput_ratio,
        "production_to_flex": result.production_to_flex,
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
    names = ("t", "prod_need", "prod_gpus", "prod_pending", "flex_gpus", "free_gpus", "evictions")
    return {name: [float(v) for v in getattr(s, name)] for name in names}


def write_json(path: Path, result: Result) -> None:
    write_atomic(path, json.dumps(as_json(result), indent=1, sort_keys=True) + "\n")


def write_plots(folder: Path, result: Result, *, prefix: str = "") -> list[Path]:
    """GPUs held by production / flex / free, utilization per pool, evictions; PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pooled, fixed = result.replays
    s = pooled.series
    hours = np.asarray(s.t) / 3600
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: object, name: str) -> None:
        path = folder / f"{prefix}{name}"
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".png")
        os.close(fd)
        try:
            fig.savefig(tmp, dpi=110)  # type: ignore[attr-defined]
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
            plt.close(fig)  # type: ignore[arg-type]
        written.append(path)

    fig, ax = plt.subplots(figsize=(9, 4))
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
    save(fig, PLOTS[0])

    fig, ax = plt.subplots(figsize=(9, 4))
    for pool, values in s.util_by_pool.items():
        ax.plot(hours, values, lw=1, label=f"{pool} duty cycle")
    ax.set(xlabel="hours", ylabel="utilization", ylim=(0, 1.05), title="GPU utilization per pool")
    ax.legend(loc="upper right", fontsize=8)
    save(fig, PLOTS[1])

    fig, ax = plt.subplots(figsize=(9, 3))
    ax.bar(hours, s.array("evictions"), width=pooled.step_s / 3600, color="#9467bd")
    ax.set(xlabel="hours", ylabel="flex evictions per step", title="Flex evictions")
    save(fig, PLOTS[2])
    return written

"""The tuner's own knobs: observation windows, hysteresis, cooldown and step sizes.

They tune the tuner, not the cluster, so they live beside it (``gpupool tune --settings
FILE`` reads a YAML mapping of these fields; every field has a default). Thresholds the
decisions compare against (eviction limit, hit-rate floor, elastic band) come from the
policy itself.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pydantic import Field, ValidationError, model_validator

from policy import PolicyError
from policy.base import Duration, Fraction, Invariants, StrictModel, duration_seconds
from policy.loader import Problem, _problems, read_yaml

RETIRED_SETTINGS: dict[str, str] = {
    "shed_above_step": (
        "renamed shed_threshold_step: a preemption storm now LOWERS "
        "elastic.shed_while_production_above (docs/tuner.md, Settings)"
    ),
    "shed_above_max": (
        "replaced by shed_threshold_min: the shed threshold is only ever lowered, so its "
        "bound is a floor (docs/tuner.md, Settings)"
    ),
    "scale_down_stabilization_step_s": (
        "removed: a longer scale-down window delays shedding, so the tuner no longer moves "
        "autoscaling.scale_down_stabilization_s; delete the line"
    ),
    "scale_down_stabilization_max_s": (
        "removed: a longer scale-down window delays shedding, so the tuner no longer moves "
        "autoscaling.scale_down_stabilization_s; delete the line"
    ),
}
"""Settings of older tuners and what became of them; ``load_settings`` reports these instead
of "unknown field"."""


class TunerSettings(StrictModel):
    """Windows, hysteresis, cooldown and bounded steps of every tuning decision."""

    window: Duration = "30m"
    """How far back each cycle reads the recorded series (a range selector ``name[window]``)."""
    min_observation: Duration = "20m"
    """A decision needs samples spanning at least this long; shorter history is a no-op."""
    persistence: Fraction = Field(0.9, gt=0)
    """Share of a window's samples that must meet a condition for it to count as sustained;
    every condition that leads to a proposal must be sustained (single samples only veto)."""
    ratio_margin: Fraction = 0.02
    """Hysteresis on ratio thresholds: "below 0.35" means below 0.35 - margin, "above" above
    + margin, so a metric hovering at a threshold does not trigger proposals."""
    stale_after_intervals: int = Field(3, ge=1)
    """A series whose newest sample is older than this many recording-rule evaluation
    intervals (``policy.metrics.evaluation_interval``, 30 s: 90 s) is stale; decisions
    that need it fail closed."""
    cooldown: Duration = "1h"
    """Least time between two policy proposals, so the cluster can show the last one's effect."""
    interval: Duration = "5m"
    """Time between two cycles of ``gpupool tune`` without ``--once`` (alerts trigger more)."""
    fetch_timeout: Duration = "60s"
    """Longest a cycle waits for ``git fetch`` of the policy branch; past it the cycle fails
    closed (no proposal) and the next one tries again."""
    whatif_hours: float = Field(6.0, ge=0, le=24)
    """Hours of the bundled traces the PR body's what-if replays, before and after the change
    (about 5 s per replayed policy on 2 cores); 0 leaves the section out."""
    reserve_ratio_step: Fraction = Field(0.05, gt=0)
    """Step by which a preemption storm raises the production pool's ``reserve_ratio``."""
    reserve_ratio_max: Fraction = 0.50
    """The production pool's ``reserve_ratio`` is never proposed above this (the policy's own
    invariants, e.g. the production floor fitting outside the prod pool's reserve, may bound
    it lower; the tuner treats either as the reserve's bound)."""
    shed_threshold_step: Fraction = Field(0.05, gt=0)
    """Step by which a preemption storm with the reserve at its bound LOWERS
    ``elastic.shed_while_production_above`` (flex sheds earlier)."""
    shed_threshold_min: Fraction = 0.50
    """``elastic.shed_while_production_above`` is never proposed below this, nor below
    ``elastic.grow_while_production_below + ratio_margin``, whichever is higher."""
    flex_replicas_step: int = Field(2, ge=1)
    """Replicas idle production with queued flex demand adds to the max_replicas of each
    workload whose HPA runs at that bound."""
    kv_share_step: Fraction = Field(0.05, gt=0)
    """Step by which low hit rate under high KV usage raises ``kv_cache.max_gpu_memory_share``."""
    kv_share_max: Fraction = 0.90
    """``kv_cache.max_gpu_memory_share`` is never proposed above this (the policy's own
    invariant with ``activation_reserve_share`` still applies)."""

    @model_validator(mode="after")
    def _windows(self) -> TunerSettings:
        found = Invariants()
        found.require(
            duration_seconds(self.min_observation) <= duration_seconds(self.window),
            "min_observation",
            f"min_observation ({self.min_observation}) must not exceed window ({self.window}): "
            "no window could ever be long enough",
        )
        found.raise_if_any()
        return self

    @property
    def window_s(self) -> float:
        return duration_seconds(self.window)

    @property
    def min_observation_s(self) -> float:
        return duration_seconds(self.min_observation)

    @property
    def cooldown_s(self) -> float:
        return duration_seconds(self.cooldown)

    @property
    def interval_s(self) -> float:
        return duration_seconds(self.interval)

    @property
    def fetch_timeout_s(self) -> float:
        return duration_seconds(self.fetch_timeout)


def load_settings(path: Path | None) -> TunerSettings:
    """The defaults, or the fields of a YAML file; errors name the file, line and field."""
    if path is None:
        return TunerSettings()
    document = read_yaml(path)
    if document is None:
        return TunerSettings()
    if not isinstance(document, dict):
        found = type(document).__name__
        raise PolicyError([Problem(str(path), 1, "", f"expected a mapping, found {found}")])
    try:
        return TunerSettings.model_validate(document)
    except ValidationError as exc:
        problems = [
            replace(p, message=RETIRED_SETTINGS[p.path]) if p.path in RETIRED_SETTINGS else p
            for p in _problems(exc, document, str(path))
        ]
        raise PolicyError(problems) from None

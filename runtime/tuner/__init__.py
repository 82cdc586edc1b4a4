"""The metrics-driven tuner: Prometheus windows -> pure decisions -> a policy branch with
evidence (docs/tuner.md). ``decisions`` is the pure core; the other modules are its edges."""

from runtime.tuner.decisions import decide
from runtime.tuner.proposals import (
    CompactionRequest,
    CycleDecision,
    NoOp,
    Proposal,
    TunerState,
)
from runtime.tuner.settings import TunerSettings

__all__ = [
    "CompactionRequest",
    "CycleDecision",
    "NoOp",
    "Proposal",
    "TunerSettings",
    "TunerState",
    "decide",
]

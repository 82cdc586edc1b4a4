"""What a sweep says of a variant that failed or was not reached (the worker's outcome types
are what crosses the process boundary)."""

from __future__ import annotations

import pickle

from runtime.advise.levers import Variant
from runtime.advise.sweep import Failed, _point


def test_a_failed_replay_names_the_exception_and_a_missing_one_the_budget() -> None:
    variant = Variant((), name="flex.max_replicas=4")
    assert _point(variant, Failed("ValueError: boom"), 7).problem == (
        "replay failed: ValueError: boom"
    )
    assert _point(variant, None, 7).problem == "not reached in the 7 s budget"
    assert pickle.loads(pickle.dumps(Failed("x"))) == Failed("x")

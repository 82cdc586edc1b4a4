"""A fleet keeps per-request state only for the requests it has not completed: the window's
values are exactly the whole-stream ones, and its memory follows the queue, not the replay."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.sim.request_stream import Admission, Requests
from runtime.sim.serving import Fleet
from runtime.sim.stream_window import MIN_CAPACITY, StreamWindow


class Latencies:
    def prefill_s(self, tokens: object) -> np.ndarray:
        return np.asarray(tokens, dtype=np.float64) * 2e-5 + 0.005

    def decode_step_s(self, batch: object, context: object) -> np.ndarray:
        b = np.asarray(batch, dtype=np.float64)
        return np.asarray(0.01 + 0.0005 * b, dtype=np.float64)


def _stream(n: int, spacing_s: float, classes: int | None = None) -> Requests:
    rng = np.random.default_rng(11)
    return Requests(
        np.arange(n) * spacing_s,
        rng.integers(100, 3000, n).astype(np.int64),
        rng.integers(10, 400, n).astype(np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, np.nan),
        np.zeros(n, dtype=bool),
        traffic_class=None if classes is None else rng.integers(0, classes, n).astype(np.int64),
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3 * MIN_CAPACITY), st.floats(0, 1)), min_size=1, max_size=12)
)
def test_running_totals_are_the_whole_stream_cumsum(steps: list[tuple[int, float]]) -> None:
    """Appended in any chunks, with the head dropped anywhere, every total held equals the
    whole stream's ``cumsum`` bit for bit and every value is the one appended."""
    rng = np.random.default_rng(len(steps))
    values = rng.random(sum(k for k, _ in steps)) * 10.0 ** rng.integers(-3, 6)
    whole = np.concatenate([[0.0], np.cumsum(values)])
    window = StreamWindow({"v": np.float64}, {"s": np.float64})
    for count, drop in steps:
        start = window.hi
        chunk = values[start : start + count]
        window.extend(
            {"v": chunk}, {"s": np.cumsum(np.concatenate(([window.total("s", start)], chunk)))[1:]}
        )
        window.drop_before(window.lo + int(drop * window.size))
        held = np.arange(window.lo, window.hi)
        np.testing.assert_array_equal(window.take("v", held), values[held])
        assert [window.total("s", i) for i in range(window.lo, window.hi + 1)] == list(
            whole[window.lo : window.hi + 1]
        )


def test_reading_outside_the_window_is_an_error() -> None:
    window = StreamWindow({"v": np.float64}, {})
    window.extend({"v": np.arange(10.0)}, {})
    window.drop_before(4)
    with pytest.raises(IndexError, match=r"requests \[3, 4\) outside the window \[4, 10\)"):
        window.take("v", np.array([3]))
    with pytest.raises(IndexError, match="outside"):
        window.drop_before(11)


def _traced_peak_mib(fleet_of: object, requests: Requests, steps: int, dt: float) -> float:
    """Peak traced allocation while a fleet is built over ``requests`` and serves them."""
    tracemalloc.start()
    try:
        fleet = fleet_of(requests)  # type: ignore[operator]
        for step in range(steps):
            fleet.serve(step * dt, dt, 16.0)
        assert fleet.done > 0.9 * len(requests), "the fleet must keep up for this test"
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("screened", [False, True], ids=["no picker", "behind a picker"])
def test_a_fleet_that_keeps_up_holds_state_for_its_queue_only(screened: bool) -> None:
    """400,000 requests (the old whole-stream columns took about 110 bytes each, 42 MiB)
    served by a fleet that keeps up: what the fleet allocates stays a few MiB."""
    admission = Admission(np.array([True, False]), 30.0) if screened else None

    def fleet_of(requests: Requests) -> Fleet:
        return Fleet.admit(
            requests,
            max_model_len=8192,
            latencies=Latencies(),
            kv_tokens=10**6,
            max_num_seqs=256,
            preservation=False,
            admission=admission,
        )

    n, spacing = 400_000, 0.05
    requests = _stream(n, spacing, classes=2 if screened else None)
    steps = int(n * spacing / 15) + 2
    peak = _traced_peak_mib(fleet_of, requests, steps, 15.0)
    assert peak < 6, f"{peak:.1f} MiB traced for {n:,} requests"

"""The replay's request stream is not copied where nothing changes: a stream already in
order, a fleet whose requests all fit, a trace replayed once (its memory is per request)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.sim.request_stream import Requests
from runtime.sim.trace_model import FlexTrace


def _trace(arrival: list[float]) -> FlexTrace:
    n = len(arrival)
    return FlexTrace(
        source="t",
        arrival_s=np.array(arrival),
        input_tokens=np.arange(1, n + 1, dtype=np.int64),
        output_tokens=np.full(n, 7, dtype=np.int64),
        prefix_blocks=np.zeros(n, dtype=np.int64),
        prefix_last_seen=np.full(n, np.nan),
        block_tokens=0,
    )


def _requests(arrival: list[float]) -> Requests:
    n = len(arrival)
    ints = np.arange(n, dtype=np.int64)
    return Requests(np.array(arrival), ints, ints, ints, np.zeros(n), np.zeros(n, dtype=bool))


def test_one_stream_in_order_is_merged_as_itself() -> None:
    stream = _requests([0.0, 1.0, 1.0, 2.0])
    assert Requests.merge([stream]) is stream


def test_one_stream_out_of_order_is_still_sorted() -> None:
    merged = Requests.merge([_requests([2.0, 0.0, 1.0])])
    assert merged.arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert merged.input_tokens.tolist() == [1, 2, 0]


def test_selecting_every_request_keeps_the_stream() -> None:
    stream = _requests([0.0, 1.0, 2.0])
    assert stream.select(np.ones(3, dtype=bool)) is stream
    assert len(stream.select(np.array([True, False, True]))) == 2


def test_a_trace_replayed_once_is_a_view_with_the_same_values() -> None:
    trace = _trace([0.0, 0.5, 3.0, 9.0])
    once = trace.tiled(5.0)
    assert once.arrival_s.tolist() == [0.0, 0.5, 3.0]
    assert np.shares_memory(once.input_tokens, trace.input_tokens)
    assert np.shares_memory(once.arrival_s, trace.arrival_s)
    faster = trace.tiled(5.0, rate_scale=2.0)
    assert faster.arrival_s.tolist() == [0.0, 0.25, 1.5, 4.5]
    twice = trace.tiled(15.0)
    assert twice.arrival_s.tolist() == [0.0, 0.5, 3.0, 9.0, 10.0, 10.5, 13.0]
    assert not np.shares_memory(twice.input_tokens, trace.input_tokens)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(0, 50, allow_nan=False), min_size=1, max_size=40),
    st.floats(0.5, 400),
    st.sampled_from([1.0, 0.3, 1.7, 3.0]),
)
def test_a_trace_tiled_at_its_kept_length_is_whole_copies_cut_at_the_horizon(
    arrival: list[float], horizon_s: float, rate: float
) -> None:
    """Built at the kept length, the tiled arrays are exactly the whole copies laid end to end
    and cut before the horizon (the values an unbounded tiling would give)."""
    trace = _trace(sorted(arrival))
    tiled = trace.tiled(horizon_s, rate_scale=rate)
    one = trace.arrival_s / rate
    period = np.floor(one[-1]) + 1.0
    copies = max(1, int(np.ceil(horizon_s / period)))
    whole = np.tile(one, copies) + np.repeat(np.arange(copies, dtype=np.float64) * period, one.size)
    keep = int(np.searchsorted(whole, horizon_s, side="left"))
    np.testing.assert_array_equal(tiled.arrival_s, whole[:keep])
    np.testing.assert_array_equal(tiled.input_tokens, np.tile(trace.input_tokens, copies)[:keep])
    if copies > 1:  # one copy is a view of the trace; more are built at the kept length
        assert tiled.arrival_s.base is None or tiled.arrival_s.base.size == keep

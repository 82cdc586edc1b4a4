"""The replay's request stream is not copied where nothing changes: a stream already in
order, a fleet whose requests all fit, a trace replayed once (its memory is per request)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.sim.request_stream import Accepted, Requests
from runtime.sim.serving import Fleet
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


def test_a_stream_split_once_serves_as_the_stream_split_by_the_fleet() -> None:
    """The what-if splits a stream by ``max_model_len`` where it builds it (so the whole
    stream need not outlive the split); the fleet serves the split as it serves the stream,
    and refuses one split at another length."""

    class Latencies:
        def prefill_s(self, tokens: object) -> np.ndarray:
            return np.asarray(tokens, dtype=np.float64) * 1e-4

        def decode_step_s(self, batch: object, context: object) -> np.ndarray:
            return np.asarray(0.01 + 0.0 * np.asarray(batch, dtype=np.float64))

    n = 2_000
    stream = Requests(
        np.arange(n) * 0.1,
        np.arange(n, dtype=np.int64) % 300 + 1,
        np.full(n, 20, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, np.nan),
        np.zeros(n, dtype=bool),
    )
    knobs = {
        "max_model_len": 250,
        "latencies": Latencies(),
        "kv_tokens": 10**5,
        "max_num_seqs": 16,
        "preservation": False,
    }
    split = Accepted.split(stream, 250)
    assert len(split.requests) + split.rejected_s.size == n and split.rejected_s.size > 0
    fleets = [Fleet.admit(stream, **knobs), Fleet.admit(split, **knobs)]  # type: ignore[arg-type]
    for step in range(25):
        a, b = (f.serve(step * 10.0, 10.0, 1.0) for f in fleets)
        assert (a.completed, a.output_tokens, a.busy) == (b.completed, b.output_tokens, b.busy)
    assert fleets[0].rejected(250.0) == fleets[1].rejected(250.0) > 0
    with pytest.raises(ValueError, match="split at max_model_len 250, not 300"):
        Fleet.admit(split, **{**knobs, "max_model_len": 300})  # type: ignore[arg-type]

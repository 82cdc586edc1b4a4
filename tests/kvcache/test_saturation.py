"""The deferral rule (``in_vllm.saturation``) as a table: a compaction waits only for requests
short of KV blocks or usage at the saturation threshold, never for requests that wait only
for a sequence slot or the token budget; a shrink also waits while the queue would not fit in
the shrunk pool."""

from __future__ import annotations

import pytest

from runtime.kvcache.in_vllm.saturation import deferral_reason, shrink_deferral_reason


@pytest.mark.parametrize(
    ("num_waiting", "blocks_short", "usage", "reason"),
    [
        (0, 0, 0.10, None),  # idle
        (40, 0, 0.10, None),  # waiting for sequence slots or the token budget, blocks free
        (1, 0, 0.79, None),  # just below the threshold
        (3, 2, 0.10, "the next of 3 waiting requests lacks 2 KV blocks"),
        (0, 0, 0.80, "KV usage 0.80 >= 0.80"),  # at the threshold, nothing waiting
        (5, 0, 0.95, "KV usage 0.95 >= 0.80"),
        (5, 4, 0.95, "lacks 4 KV blocks"),  # short of blocks is named first
    ],
)
def test_compaction_waits_only_for_requests_short_of_blocks_or_saturated_usage(
    num_waiting: int, blocks_short: int, usage: float, reason: str | None
) -> None:
    got = deferral_reason(
        num_waiting=num_waiting, blocks_short=blocks_short, usage=usage, saturation_usage=0.8
    )
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got and got.startswith("saturated: ")


@pytest.mark.parametrize(
    ("num_waiting", "blocks_short", "short_after", "usage", "reason"),
    [
        (0, 0, 0, 0.10, None),
        (8, 0, 0, 0.10, None),  # the queue fits in the shrunk pool
        (8, 0, 112, 0.10, "8 waiting requests would lack 112 KV blocks in a pool of 200"),
        (8, 3, 112, 0.10, "lacks 3 KV blocks"),  # short now: the compaction rule's reason
        (0, 0, 0, 0.85, "KV usage 0.85 >= 0.80"),
    ],
)
def test_shrink_also_waits_while_the_queue_would_not_fit_the_shrunk_pool(
    num_waiting: int, blocks_short: int, short_after: int, usage: float, reason: str | None
) -> None:
    got = shrink_deferral_reason(
        num_waiting=num_waiting,
        blocks_short=blocks_short,
        blocks_short_after=short_after,
        num_blocks=200,
        usage=usage,
        saturation_usage=0.8,
    )
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got

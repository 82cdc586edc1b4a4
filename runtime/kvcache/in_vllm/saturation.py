"""When a compaction must wait: the engine is short of KV blocks, or moves would not fit one pause.

Rule: a compaction is DEFERRED while the next waiting request lacks KV blocks to be admitted
(``scheduler_side.blocks_short`` > 0) or KV block usage is at or above
``page_table_max_usage`` (policy): moving blocks then only adds latency to a queue that is
waiting for memory. A request that waits only for a sequence slot (``max_num_seqs``) or the
step's token budget does not defer it: vLLM 0.32's scheduler stops admitting at
``max_num_active_reqs`` or an exhausted token budget before it tries to allocate, so under
steady load requests wait at every step boundary although blocks are free, and counting them
would defer every compaction for as long as the load lasts. A shrink is deferred by the same
rule and also while the waiting requests together would lack blocks in the shrunk pool
(``scheduler_side.queue_blocks_short``): it must not leave a queue short of blocks that a
grow would then have to give back. (The shrink floor, checked before, only guarantees room
for one more ``max_model_len`` sequence.) Every pass is BOUNDED to ``compaction_max_moves``
block moves, highest blocks first, so one pause never grows with the pool. A deferred
request changes nothing; the sidecar retries at its next poll.

vLLM does not record why a request waits; ``blocks_short`` rebuilds the one answer that
matters here from the scheduler's waiting queue and the block pool (see its docstring).
"""

from __future__ import annotations


def deferral_reason(
    *, num_waiting: int, blocks_short: int, usage: float, saturation_usage: float
) -> str | None:
    """Why a compaction must wait now, or None when it may run.

    ``num_waiting``: requests waiting for admission (for the message only); ``blocks_short``:
    blocks the next of them lacks to be admitted now (0 when nothing waits or it fits)."""
    if blocks_short > 0:
        return (
            f"saturated: the next of {num_waiting} waiting requests lacks {blocks_short} KV blocks"
        )
    if usage >= saturation_usage:
        return f"saturated: KV usage {usage:.2f} >= {saturation_usage:.2f}"
    return None


def shrink_deferral_reason(
    *,
    num_waiting: int,
    blocks_short: int,
    blocks_short_after: int,
    num_blocks: int,
    usage: float,
    saturation_usage: float,
) -> str | None:
    """Why a shrink to ``num_blocks`` must wait now, or None when it may run: the compaction
    rule, and ``blocks_short_after``: blocks the waiting requests together would lack in a
    pool of ``num_blocks`` (what requests hold now staying held)."""
    reason = deferral_reason(
        num_waiting=num_waiting,
        blocks_short=blocks_short,
        usage=usage,
        saturation_usage=saturation_usage,
    )
    if reason is not None:
        return reason
    if blocks_short_after > 0:
        return (
            f"saturated: {num_waiting} waiting requests would lack {blocks_short_after} "
            f"KV blocks in a pool of {num_blocks}"
        )
    return None

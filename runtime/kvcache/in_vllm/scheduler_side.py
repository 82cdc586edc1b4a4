"""Scheduler-side half of a relocation or resize: vLLM's ``BlockPool`` and its id-keyed maps.

Runs in the EngineCore process, between two ``EngineCore.step`` calls. A move swaps the
``block_id`` of the moved block object and of the free, unhashed destination object (and
their places in ``BlockPool.blocks``). Everything that holds block OBJECTS (requests'
``req_to_blocks``, the free queue's linked list, the prefix-cache map values) stays valid;
what is keyed by the integer id (``cached_block_hashes_by_block``, the dict form of the
prefix-cache map, reuse watchers, block metrics) is re-keyed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm.utils.math_utils import cdiv
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import KVCacheBlock

from runtime.kvcache.planner import NULL_BLOCK, Move


class PoolStateError(RuntimeError):
    """The pool is in a state a relocation or resize must not touch."""


@dataclass(frozen=True)
class Occupancy:
    """Which block ids hold data the engine may still read, and which are empty."""

    occupied: list[int]
    """Held by a request or kept for prefix caching (hashed), block 0 excluded."""
    free: list[int]
    """Reference count 0 and no hash: nothing reads them."""
    num_blocks: int
    """Usable pool size (ids ``0 .. num_blocks - 1``)."""
    held: int
    """How many occupied blocks requests hold (the rest are only prefix-cached)."""


def _is_occupied(pool: BlockPool, block: KVCacheBlock) -> bool:
    return (
        block.ref_cnt > 0
        or block.block_hash is not None
        or block.block_id in pool.cached_block_hashes_by_block
    )


def occupancy(pool: BlockPool) -> Occupancy:
    """Occupied and free ids of ``pool`` (refuses while a connector still reads freed blocks)."""
    if pool._reuse_watchers:
        raise PoolStateError(
            f"{len(pool._reuse_watchers)} released blocks are still read by a KV connector"
        )
    occupied: list[int] = []
    free: list[int] = []
    for block in pool.blocks[1:]:
        (occupied if _is_occupied(pool, block) else free).append(block.block_id)
    held = sum(1 for block in pool.blocks[1:] if block.ref_cnt > 0)
    return Occupancy(occupied, free, pool.num_gpu_blocks, held)


def _blocks_needed(scheduler: Any, request: Any) -> int:
    """Blocks ``request`` needs for its whole sequence (up to ``max_model_len``)."""
    tokens = min(request.num_tokens, scheduler.max_model_len)
    return int(cdiv(tokens, scheduler.block_size))


def blocks_short(scheduler: Any) -> int:
    """Blocks the next waiting request (in the scheduler's order; a preempted one is put back
    first) lacks to be admitted with its whole sequence now; 0 when nothing waits or it fits,
    e.g. when it only waits for a sequence slot or the step's token budget. The free count
    includes prefix-cached free blocks (the scheduler evicts them on demand) less the
    admission watermark; a cached prefix the request would reuse counts on both sides, so
    the figure is an upper bound only where another request holds that prefix.

    vLLM 0.32's scheduler does not record why a request waits. Its admission loop
    (``Scheduler.schedule``) stops at ``max_num_active_reqs`` (``max_num_seqs``) or an
    exhausted token budget before it asks ``KVCacheManager.allocate_slots`` for blocks, and
    stops at the first request that call cannot serve (free blocks less the watermark below
    what the request needs: its full sequence with ``scheduler_reserve_full_isl``, the
    default); this replays that check for the request the next step tries first. Requests
    that already hold blocks (``kv_holding_waiting``: async KV loads, which the plugin
    refuses, and streaming sessions) are tried before it and are not counted."""
    if not scheduler.waiting:
        return 0
    manager = scheduler.kv_cache_manager
    needed = _blocks_needed(scheduler, scheduler.waiting.peek_request())
    available: int = manager.block_pool.get_num_free_blocks() - manager.watermark_blocks
    return max(0, needed - available)


def queue_blocks_short(scheduler: Any, num_blocks: int, held: int) -> int:
    """Blocks the waiting requests together would lack, each with its whole sequence, in a
    pool of ``num_blocks`` where the ``held`` blocks requests hold now (``Occupancy.held``)
    stay held (every other block free, less the admission watermark that pool would have);
    0 when they would all fit. Requests sharing a prefix count it each, so this errs towards
    lacking."""
    needed = sum(_blocks_needed(scheduler, request) for request in scheduler.waiting)
    if not needed:
        return 0
    watermark = int(scheduler.scheduler_config.watermark * num_blocks)
    return max(0, needed - (num_blocks - 1 - held - watermark))


def evict_cached(pool: BlockPool, max_occupied: int) -> int:
    """Evict prefix-cached free blocks, least recently used first, until at most
    ``max_occupied`` blocks are occupied; returns how many were evicted.

    Blocks held by requests are never evicted; this is what lets a shrink keep the most
    useful part of the prefix cache instead of refusing or dropping all of it.
    """
    excess = len(occupancy(pool).occupied) - max_occupied
    queue, evicted = pool.free_block_queue, 0
    node = queue.fake_free_list_head.next_free_block
    while excess > evicted and node is not None and node is not queue.fake_free_list_tail:
        if _is_occupied(pool, node):
            pool._maybe_evict_cached_block(node)
            evicted += 1
        node = node.next_free_block
    return evicted


def _rekey(mapping: dict[int, Any], a: int, b: int) -> None:
    """Swap the entries of keys ``a`` and ``b`` (either may be absent)."""
    va, vb = mapping.pop(a, None), mapping.pop(b, None)
    if va is not None:
        mapping[b] = va
    if vb is not None:
        mapping[a] = vb


def _block_keys(pool: BlockPool, block: KVCacheBlock) -> list[Any]:
    keys = [block.block_hash] if block.block_hash is not None else []
    keys.extend(pool.cached_block_hashes_by_block.get(block.block_id, ()))
    return keys


def check_moves(pool: BlockPool, moves: Sequence[Move]) -> None:
    """Refuse a plan the pool cannot take, before anything is copied or renamed: every move
    inside the pool and off the null block, sources occupied, destinations free, no id used
    twice (so sources and destinations are disjoint and the copy order does not matter)."""
    ids = [i for m in moves for i in (m.src, m.dst)]
    if len(set(ids)) != len(ids):
        raise PoolStateError("a block id appears twice in the plan")
    for move in moves:
        if not all(0 <= i < pool.num_gpu_blocks for i in move):
            raise PoolStateError(f"move {move} is outside the pool of {pool.num_gpu_blocks}")
        src, dst = pool.blocks[move.src], pool.blocks[move.dst]
        if NULL_BLOCK in move or src.is_null or dst.is_null:
            raise PoolStateError(f"move {move} touches the null block")
        if _is_occupied(pool, dst) or not _is_occupied(pool, src):
            raise PoolStateError(f"move {move}: source must be occupied, destination free")


def relocate(manager: KVCacheManager, moves: Sequence[Move]) -> None:
    """Give each moved block the id of its destination; the data must already be copied."""
    pool = manager.block_pool
    check_moves(pool, moves)
    for move in moves:
        src, dst = pool.blocks[move.src], pool.blocks[move.dst]
        cache = pool.cached_block_hash_to_block._cache
        for key in _block_keys(pool, src):
            entry = cache.get(key)
            if isinstance(entry, dict) and move.src in entry:
                entry[move.dst] = entry.pop(move.src)
        _rekey(pool.cached_block_hashes_by_block, move.src, move.dst)
        if pool.metrics_collector is not None:
            _rekey(pool.metrics_collector.block_metrics, move.src, move.dst)
        src.block_id, dst.block_id = move.dst, move.src
        pool.blocks[move.dst], pool.blocks[move.src] = src, dst
    mapping = {m.src: m.dst for m in moves}
    for single in manager.coordinator.single_type_managers:
        single.new_block_ids = [mapping.get(b, b) for b in single.new_block_ids]


def _configs(manager: KVCacheManager, scheduler: Any) -> list[Any]:
    found: dict[int, Any] = {}
    for owner in (scheduler, manager, manager.coordinator):
        config = getattr(owner, "kv_cache_config", None)
        if config is not None:
            found[id(config)] = config
    return list(found.values())


def _set_size(manager: KVCacheManager, scheduler: Any, num_blocks: int) -> None:
    manager.watermark_blocks = int(scheduler.scheduler_config.watermark * num_blocks)
    manager.block_pool.num_gpu_blocks = num_blocks
    for config in _configs(manager, scheduler):
        config.num_blocks = num_blocks
    scheduler.cache_config.num_gpu_blocks = num_blocks


def shrink(manager: KVCacheManager, scheduler: Any, num_blocks: int) -> None:
    """Drop blocks ``>= num_blocks`` from the pool; they must all be free and unhashed."""
    pool = manager.block_pool
    tail = pool.blocks[num_blocks:]
    busy = [b.block_id for b in tail if _is_occupied(pool, b)]
    if busy:
        raise PoolStateError(f"blocks {busy[:8]} at or above {num_blocks} are still occupied")
    for block in tail:
        pool.free_block_queue.remove(block)
    del pool.blocks[num_blocks:]
    _set_size(manager, scheduler, num_blocks)


def grow(manager: KVCacheManager, scheduler: Any, num_blocks: int) -> None:
    """Add blocks ``len(blocks) .. num_blocks - 1`` as free blocks at the back of the queue."""
    pool = manager.block_pool
    added = [KVCacheBlock(i, pool=pool) for i in range(len(pool.blocks), num_blocks)]
    pool.blocks.extend(added)
    pool.free_block_queue.append_n(added)
    _set_size(manager, scheduler, num_blocks)

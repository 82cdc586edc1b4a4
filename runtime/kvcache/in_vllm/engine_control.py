"""Compaction, shrink and grow of one engine, run in the EngineCore process between steps.

The controller plans on the scheduler's ``BlockPool``, has every worker copy the blocks and
rename ids in its block tables (``collective_rpc`` by method name), then renames the ids on
the scheduler side. A shrink packs everything below the new size first and refuses if that
did not succeed. Shrink and grow resize every worker before the scheduler's pool changes (a
shrink's workers still hold every occupied block, a grow's ids exist before they are used).
A pass is transactional: the plan is checked first, and a worker that fails a relocation or
resize has every rank put back while the scheduler stays as it was (status ``failed``).
A shrink below the floor (``limits.shrink_floor``: the blocks requests hold, one
``max_model_len`` sequence and the null block) is refused whoever asked for it.
Callers run it between steps on the engine's thread (``plugin.on_engine_thread``).
An engine the plugin cannot handle safely (``support``: a KV connector, several KV cache
groups, shared KV) has every compact, shrink and grow refused with the reason.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from runtime.kvcache.control import Op, Outcome, Status
from runtime.kvcache.in_vllm import scheduler_side
from runtime.kvcache.in_vllm.metrics import CompactionMetrics
from runtime.kvcache.in_vllm.saturation import deferral_reason, shrink_deferral_reason
from runtime.kvcache.in_vllm.support import engine_refusal
from runtime.kvcache.limits import CompactionLimits, Strategy, sequence_blocks, shrink_floor
from runtime.kvcache.planner import (
    Move,
    PlanError,
    fragmentation,
    packed_watermark,
    plan_moves,
)

RELOCATE_RPC = "gpupool_kv_relocate"
"""Worker method (added by the plugin) that copies blocks and renames block-table ids."""
RESIZE_RPC = "gpupool_kv_resize"
"""Worker method (added by the plugin) that re-binds the KV views to a resized buffer."""
ROLLBACK_RPC = "gpupool_kv_rollback"
"""Worker method (added by the plugin) that undoes a rank's renames of a failed pass."""
SUPPORT_RPC = "gpupool_kv_support"
"""Worker method (added by the plugin): why this worker's KV cannot be relocated, or None."""


def refusal(core: Any, kv_cache_config: Any) -> str | None:
    """Why the plugin must leave this engine's KV cache alone (``support``), asking every
    worker too; None when it may compact, shrink and grow it."""
    reason = engine_refusal(core.vllm_config.kv_transfer_config, kv_cache_config)
    if reason is not None:
        return reason
    ranks = core.model_executor.collective_rpc(SUPPORT_RPC)
    return next((r for r in ranks if r is not None), None)


class PassFailed(RuntimeError):
    """A worker failed a relocation; every rank was rolled back, the scheduler untouched."""


class WorkersInconsistent(RuntimeError):
    """A rollback failed too: the workers' block tables no longer match the scheduler's.
    The engine must not serve on; the pod restarts."""


class EngineController:
    """Owns the plugin's metrics and runs requests against one ``EngineCore``."""

    def __init__(self, core: Any, registry: CollectorRegistry | None = None) -> None:
        self.core = core
        self.metrics = CompactionMetrics(registry or CollectorRegistry())
        self.original_blocks = self._manager().block_pool.num_gpu_blocks
        self.original_bytes: int | None = None
        self.refusal = refusal(core, core.scheduler.kv_cache_config)
        """Set once: why every compact, shrink and grow of this engine is refused."""
        self._refresh_gauges()

    def _manager(self) -> Any:
        return self.core.scheduler.kv_cache_manager

    def status(self) -> dict[str, Any]:
        """Pool size, occupancy and load as the scheduler sees it now, and the sizes the
        sidecar's shrink floor needs (``max_model_len``, ``block_size``)."""
        scheduler = self.core.scheduler
        pool = self._manager().block_pool
        occ = scheduler_side.occupancy(pool)
        return {
            "usable_blocks": occ.num_blocks,
            "original_blocks": self.original_blocks,
            "occupied_blocks": len(occ.occupied),
            "held_blocks": occ.held,
            "free_blocks": len(occ.free),
            "highest_occupied": max(occ.occupied, default=0),
            "usage": pool.get_usage(),
            "fragmentation": fragmentation(occ.occupied),
            "num_waiting": scheduler.get_num_unfinished_requests() - len(scheduler.running),
            "num_running": len(scheduler.running),
            "blocks_short": scheduler_side.blocks_short(scheduler),
            "max_model_len": scheduler.max_model_len,
            "block_size": scheduler.block_size,
            "refusal": self.refusal,
        }

    def metrics_text(self) -> str:
        """The plugin's metrics in the Prometheus text format."""
        return generate_latest(self.metrics.registry).decode()

    def _in_flight(self) -> str | None:
        """Why nothing may touch the pool now: batches still run on the old ids and buffer.
        The control socket holds new batches back until the queue drains (``plugin.admit``),
        so this stops only a direct call of the ``gpupool_kv`` utility, which answers at once
        instead of draining. Nothing in gpupool makes one: the sidecar and the CLI use the
        socket; only the tests and ``bench/resize.py`` call the utility, on an in-process
        engine between its steps."""
        in_flight = len(getattr(self.core, "batch_queue", None) or ())
        if in_flight:
            return (
                f"{in_flight} batches in flight (async scheduling or pipeline parallelism); "
                "retry through the control socket, which drains them first"
            )
        return None

    def _deferral(
        self, limits: CompactionLimits, state: dict[str, Any], shrink_to: int | None = None
    ) -> str | None:
        """Why a compaction (or, with ``shrink_to``, a shrink to that size) must wait now:
        batches in flight, or saturation (``saturation``) as ``state`` (``status``) shows."""
        in_flight = self._in_flight()
        if in_flight is not None:
            return in_flight
        if shrink_to is None:
            return deferral_reason(
                num_waiting=state["num_waiting"],
                blocks_short=state["blocks_short"],
                usage=state["usage"],
                saturation_usage=limits.saturation_usage,
            )
        return shrink_deferral_reason(
            num_waiting=state["num_waiting"],
            blocks_short=state["blocks_short"],
            blocks_short_after=scheduler_side.queue_blocks_short(
                self.core.scheduler, shrink_to, state["held_blocks"]
            ),
            num_blocks=shrink_to,
            usage=state["usage"],
            saturation_usage=limits.saturation_usage,
        )

    def _below_floor(self, num_blocks: int, held: int) -> str | None:
        """Why a shrink to ``num_blocks`` is refused: it is below the shrink floor while
        requests hold ``held`` blocks."""
        scheduler = self.core.scheduler
        floor = shrink_floor(
            held_blocks=held,
            max_model_len=scheduler.max_model_len,
            block_size=scheduler.block_size,
        )
        if num_blocks >= floor:
            return None
        sequence = sequence_blocks(scheduler.max_model_len, scheduler.block_size)
        return (
            f"shrink target {num_blocks} is below the floor of {floor} blocks: requests hold "
            f"{held}, one max_model_len sequence ({scheduler.max_model_len} tokens) needs "
            f"{sequence}, and the null block 1; nothing changed"
        )

    def deferred(self, reason: str) -> Outcome:
        """Answer a request the engine cannot take now; it changes nothing and the sidecar
        retries at its next poll."""
        self.metrics.compactions.labels(Status.DEFERRED).inc()
        return self._outcome(Status.DEFERRED, reason)

    def _relocate(self, moves: list[Move], strategy: Strategy) -> int:
        """One transactional pass: the plan is checked against the scheduler's pool, every
        rank copies and renames, and only then the scheduler renames; a rank that fails has
        every rank roll back and leaves the scheduler as it was."""
        scheduler_side.check_moves(self._manager().block_pool, moves)
        pairs = [(m.src, m.dst) for m in moves]
        executor = self.core.model_executor
        try:
            copied = executor.collective_rpc(RELOCATE_RPC, args=(pairs, strategy))
        except Exception as failure:
            try:
                executor.collective_rpc(ROLLBACK_RPC, args=(pairs,))
            except Exception as exc:
                raise WorkersInconsistent(
                    f"a worker failed a relocation ({failure}) and the rollback failed ({exc})"
                ) from exc
            raise PassFailed(
                f"a worker failed the relocation ({failure}); every rank rolled back"
            ) from failure
        scheduler_side.relocate(self._manager(), moves)
        return int(copied[0])

    def compact(self, limits: CompactionLimits) -> Outcome:
        """Pack occupied blocks as low as they fit, unless the engine is saturated."""
        started = time.perf_counter()
        reason = self._deferral(limits, self.status())
        if reason is not None:
            return self.deferred(reason)
        return self._pack(limits, None, started)

    def _pack(self, limits: CompactionLimits, watermark: int | None, started: float) -> Outcome:
        """Move occupied blocks below ``watermark`` (None: as low as they fit), at most
        ``limits.max_moves`` of them; the caller has checked that the engine may pause."""
        occ = scheduler_side.occupancy(self._manager().block_pool)
        target = packed_watermark(len(occ.occupied)) if watermark is None else watermark
        try:
            moves = plan_moves(occ.occupied, occ.free, target, max_moves=limits.max_moves)
        except PlanError as exc:
            self.metrics.compactions.labels(Status.REFUSED).inc()
            return self._outcome(Status.REFUSED, str(exc))
        if not moves:
            self.metrics.compactions.labels(Status.NOOP).inc()
            return self._outcome(Status.NOOP, "already packed below the watermark")
        try:
            copied = self._relocate(moves, limits.strategy)
        except (scheduler_side.PoolStateError, PassFailed) as exc:
            self.metrics.compactions.labels(Status.FAILED).inc()
            return self._outcome(Status.FAILED, str(exc))
        pause = time.perf_counter() - started
        self.metrics.compactions.labels(Status.DONE).inc()
        self.metrics.blocks_moved.inc(len(moves))
        self.metrics.bytes_moved.inc(copied)
        if watermark is None:  # a shrink observes its whole pause, compaction included
            self.metrics.pause_seconds.observe(pause)
        return self._outcome(Status.DONE, "", len(moves), copied, pause)

    def shrink(self, num_blocks: int, limits: CompactionLimits) -> Outcome:
        """Pack below ``num_blocks``, then cut the pool and its memory to ``num_blocks``.

        Prefix-cached blocks that no longer fit are evicted, least recently used first. A
        target below the shrink floor (the blocks requests hold, one ``max_model_len``
        sequence, the null block) is refused, not raised to the floor: whoever asked gets
        what they asked for or the reason why not, with the floor in it.
        """
        started = time.perf_counter()
        current = self._manager().block_pool.num_gpu_blocks
        if not 2 <= num_blocks <= current:
            self.metrics.compactions.labels(Status.REFUSED).inc()
            out_of_range = f"shrink target {num_blocks} not in [2, {current}]"
            return self._outcome(Status.REFUSED, out_of_range)
        state = self.status()
        reason = self._below_floor(num_blocks, state["held_blocks"])
        if reason is not None:
            self.metrics.compactions.labels(Status.REFUSED).inc()
            return self._outcome(Status.REFUSED, reason)
        reason = self._deferral(limits, state, shrink_to=num_blocks)
        if reason is not None:
            return self.deferred(reason)
        scheduler_side.evict_cached(self._manager().block_pool, num_blocks - 1)
        packed = self._pack(limits, num_blocks, started)
        if packed.status in (Status.REFUSED, Status.FAILED):
            return packed
        occ = scheduler_side.occupancy(self._manager().block_pool)
        left = [b for b in occ.occupied if b >= num_blocks]
        if left:
            reason = f"{len(left)} occupied blocks still at or above {num_blocks}; shrink later"
            return self._outcome(Status.REFUSED, reason, packed.blocks_moved, packed.bytes_moved)
        try:
            resized = self._resize_workers(num_blocks, current)
        except PassFailed as exc:
            self.metrics.compactions.labels(Status.FAILED).inc()
            return self._outcome(Status.FAILED, str(exc), packed.blocks_moved, packed.bytes_moved)
        scheduler_side.shrink(self._manager(), self.core.scheduler, num_blocks)
        self.metrics.resizes.labels("shrink").inc()
        return self._resized(resized, started, packed)

    def _resize_workers(self, num_blocks: int, current: int) -> list[dict[str, Any]]:
        """Every rank re-binds to ``num_blocks`` before the scheduler's pool changes (their
        ``ResizeResult``s, rank order); if one fails, every rank goes back to ``current``
        (the blocks beyond the smaller size are free, so nothing is lost) and the
        scheduler's pool stays as it was."""
        executor = self.core.model_executor
        try:
            return [dict(rank) for rank in executor.collective_rpc(RESIZE_RPC, args=(num_blocks,))]
        except Exception as failure:
            try:
                executor.collective_rpc(RESIZE_RPC, args=(current,))
            except Exception as exc:
                raise WorkersInconsistent(
                    f"a worker failed a resize to {num_blocks} ({failure}) and the resize "
                    f"back to {current} failed ({exc})"
                ) from exc
            raise PassFailed(
                f"a worker failed the resize to {num_blocks} ({failure}); every rank is back "
                f"at {current}"
            ) from failure

    def grow(self, num_blocks: int | None = None) -> Outcome:
        """Widen the pool back towards the size the engine started with."""
        started = time.perf_counter()
        target = self.original_blocks if num_blocks is None else num_blocks
        current = self._manager().block_pool.num_gpu_blocks
        if not current <= target <= self.original_blocks:
            self.metrics.compactions.labels(Status.REFUSED).inc()
            return self._outcome(
                Status.REFUSED, f"grow target {target} not in [{current}, {self.original_blocks}]"
            )
        if target == current:
            return self._outcome(Status.NOOP, "pool already at the requested size")
        reason = self._in_flight()
        if reason is not None:
            return self.deferred(reason)
        try:
            resized = self._resize_workers(target, current)
        except PassFailed as exc:
            self.metrics.compactions.labels(Status.FAILED).inc()
            return self._outcome(Status.FAILED, str(exc))
        scheduler_side.grow(self._manager(), self.core.scheduler, target)
        self.metrics.resizes.labels("grow").inc()
        return self._resized(resized, started, Outcome(Status.DONE))

    def _resized(self, ranks: list[dict[str, Any]], started: float, packed: Outcome) -> Outcome:
        """The outcome of a resize every rank did: allocation sizes and the measured release
        as rank 0 reports them (every rank holds its own equal share), the peak extra
        memory as the largest any rank reports (what the tightest device needed)."""
        resized = ranks[0]
        if self.original_bytes is None:
            self.original_bytes = resized["old_bytes"]
        pause = time.perf_counter() - started
        peaks = [int(r["peak_extra_bytes"]) for r in ranks if r["peak_extra_bytes"] is not None]
        peak = max(peaks) if peaks else None
        self.metrics.pause_seconds.observe(pause)
        self.metrics.released_bytes.set(self.original_bytes - resized["new_bytes"])
        self.metrics.released_measured_bytes.set(resized["released_bytes"])
        if peak is not None:
            self.metrics.resize_peak_extra_bytes.set(peak)
        outcome = self._outcome(
            Status.DONE,
            "",
            packed.blocks_moved,
            packed.bytes_moved,
            pause,
            self.original_bytes - resized["new_bytes"],
            resized["released_bytes"],
        )
        return replace(outcome, peak_extra_bytes=peak)

    def _refresh_gauges(self) -> tuple[float, int]:
        state = self.status()
        self.metrics.fragmentation.set(state["fragmentation"])
        self.metrics.usable_blocks.set(state["usable_blocks"])
        return state["fragmentation"], state["usable_blocks"]

    def _outcome(
        self,
        status: Status,
        reason: str,
        moved: int = 0,
        copied: int = 0,
        pause: float = 0.0,
        released: int = 0,
        measured: int = 0,
    ) -> Outcome:
        frag, usable = self._refresh_gauges()
        return Outcome(status, reason, moved, copied, pause, frag, usable, released, measured)

    def handle(self, op: Op, args: dict[str, Any]) -> dict[str, Any]:
        """One control request, answered as its reply."""
        if op is Op.STATUS:
            return self.status()
        if op is Op.METRICS:
            return {"text": self.metrics_text()}
        if self.refusal is not None:
            self.metrics.compactions.labels(Status.REFUSED).inc()
            return self._outcome(Status.REFUSED, self.refusal).to_reply()
        if op is Op.GROW:
            return self.grow(args.get("num_blocks")).to_reply()
        limits = CompactionLimits(**args["limits"])
        if op is Op.COMPACT:
            return self.compact(limits).to_reply()
        return self.shrink(int(args["num_blocks"]), limits).to_reply()

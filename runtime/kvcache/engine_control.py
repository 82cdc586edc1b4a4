"""Compaction, shrink and grow of one engine, run in the EngineCore process between steps.

The controller plans on the scheduler's ``BlockPool``, has every worker copy the blocks and
rename ids in its block tables (``collective_rpc`` by method name), then renames the ids on
the scheduler side. A shrink packs everything below the new size first and refuses if that
did not succeed; a grow widens the worker buffers before the scheduler may hand out the new
ids. Callers must hold the engine between steps (the plugin's step lock or a utility call).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from runtime.kvcache import scheduler_side
from runtime.kvcache.limits import CompactionLimits, Strategy
from runtime.kvcache.metrics import CompactionMetrics
from runtime.kvcache.planner import (
    Move,
    PlanError,
    fragmentation,
    packed_watermark,
    plan_moves,
)
from runtime.kvcache.saturation import deferral_reason

RELOCATE_RPC = "gpupool_kv_relocate"
"""Worker method (added by the plugin) that copies blocks and renames block-table ids."""
RESIZE_RPC = "gpupool_kv_resize"
"""Worker method (added by the plugin) that re-binds the KV views to a resized buffer."""


@dataclass(frozen=True)
class Outcome:
    """What one request did; ``status`` is done, deferred, refused or noop."""

    status: str
    reason: str = ""
    blocks_moved: int = 0
    bytes_moved: int = 0
    pause_s: float = 0.0
    fragmentation: float = 0.0
    usable_blocks: int = 0
    released_bytes: int = 0
    released_measured_bytes: int = 0


class EngineController:
    """Owns the plugin's metrics and runs requests against one ``EngineCore``."""

    def __init__(self, core: Any, registry: CollectorRegistry | None = None) -> None:
        self.core = core
        self.metrics = CompactionMetrics(registry or CollectorRegistry())
        self.original_blocks = self._manager().block_pool.num_gpu_blocks
        self.original_bytes: int | None = None
        self._refresh_gauges()

    def _manager(self) -> Any:
        return self.core.scheduler.kv_cache_manager

    def status(self) -> dict[str, Any]:
        """Pool size, occupancy and load as the scheduler sees it now."""
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
            "num_waiting": self.core.scheduler.get_num_unfinished_requests()
            - len(self.core.scheduler.running),
            "num_running": len(self.core.scheduler.running),
        }

    def metrics_text(self) -> str:
        """The plugin's metrics in the Prometheus text format."""
        return generate_latest(self.metrics.registry).decode()

    def _deferral(self, limits: CompactionLimits) -> str | None:
        if getattr(self.core, "batch_queue", None):
            return "a batch is in flight (async scheduling); retry after it drains"
        state = self.status()
        return deferral_reason(
            num_waiting=state["num_waiting"],
            usage=state["usage"],
            saturation_usage=limits.saturation_usage,
        )

    def _relocate(self, moves: list[Move], strategy: Strategy) -> int:
        pairs = [(m.src, m.dst) for m in moves]
        copied = self.core.model_executor.collective_rpc(RELOCATE_RPC, args=(pairs, strategy))
        scheduler_side.relocate(self._manager(), moves)
        return int(copied[0])

    def compact(self, limits: CompactionLimits, watermark: int | None = None) -> Outcome:
        """Pack occupied blocks below ``watermark`` (default: as low as they fit)."""
        started = time.perf_counter()
        reason = self._deferral(limits)
        if reason is not None:
            self.metrics.compactions.labels("deferred").inc()
            return self._outcome("deferred", reason)
        occ = scheduler_side.occupancy(self._manager().block_pool)
        target = packed_watermark(len(occ.occupied)) if watermark is None else watermark
        try:
            moves = plan_moves(occ.occupied, occ.free, target, max_moves=limits.max_moves)
        except PlanError as exc:
            self.metrics.compactions.labels("refused").inc()
            return self._outcome("refused", str(exc))
        if not moves:
            self.metrics.compactions.labels("noop").inc()
            return self._outcome("noop", "already packed below the watermark")
        copied = self._relocate(moves, limits.strategy)
        pause = time.perf_counter() - started
        self.metrics.compactions.labels("done").inc()
        self.metrics.blocks_moved.inc(len(moves))
        self.metrics.bytes_moved.inc(copied)
        if watermark is None:  # a shrink observes its whole pause, compaction included
            self.metrics.pause_seconds.observe(pause)
        return self._outcome("done", "", len(moves), copied, pause)

    def shrink(self, num_blocks: int, limits: CompactionLimits) -> Outcome:
        """Pack below ``num_blocks``, then cut the pool and its memory to ``num_blocks``.

        Prefix-cached blocks that no longer fit are evicted, least recently used first;
        blocks held by requests must fit, or the shrink is refused.
        """
        started = time.perf_counter()
        current = self._manager().block_pool.num_gpu_blocks
        if not 2 <= num_blocks <= current:
            self.metrics.compactions.labels("refused").inc()
            return self._outcome("refused", f"shrink target {num_blocks} not in [2, {current}]")
        reason = self._deferral(limits)
        if reason is not None:
            self.metrics.compactions.labels("deferred").inc()
            return self._outcome("deferred", reason)
        held = scheduler_side.occupancy(self._manager().block_pool).held
        if held >= num_blocks:
            self.metrics.compactions.labels("refused").inc()
            reason = f"requests hold {held} blocks; a pool of {num_blocks} cannot take them"
            return self._outcome("refused", reason)
        scheduler_side.evict_cached(self._manager().block_pool, num_blocks - 1)
        packed = self.compact(limits, watermark=num_blocks)
        if packed.status in ("deferred", "refused"):
            return packed
        occ = scheduler_side.occupancy(self._manager().block_pool)
        left = [b for b in occ.occupied if b >= num_blocks]
        if left:
            reason = f"{len(left)} occupied blocks still at or above {num_blocks}; shrink later"
            return self._outcome("refused", reason, packed.blocks_moved, packed.bytes_moved)
        scheduler_side.shrink(self._manager(), self.core.scheduler, num_blocks)
        resized = self.core.model_executor.collective_rpc(RESIZE_RPC, args=(num_blocks,))[0]
        self.metrics.resizes.labels("shrink").inc()
        return self._resized(resized, started, packed)

    def grow(self, num_blocks: int | None = None) -> Outcome:
        """Widen the pool back towards the size the engine started with."""
        started = time.perf_counter()
        target = self.original_blocks if num_blocks is None else num_blocks
        current = self._manager().block_pool.num_gpu_blocks
        if not current <= target <= self.original_blocks:
            self.metrics.compactions.labels("refused").inc()
            return self._outcome(
                "refused", f"grow target {target} not in [{current}, {self.original_blocks}]"
            )
        if target == current:
            return self._outcome("noop", "pool already at the requested size")
        resized = self.core.model_executor.collective_rpc(RESIZE_RPC, args=(target,))[0]
        scheduler_side.grow(self._manager(), self.core.scheduler, target)
        self.metrics.resizes.labels("grow").inc()
        return self._resized(resized, started, Outcome("done"))

    def _resized(self, resized: dict[str, int], started: float, packed: Outcome) -> Outcome:
        if self.original_bytes is None:
            self.original_bytes = resized["old_bytes"]
        pause = time.perf_counter() - started
        self.metrics.pause_seconds.observe(pause)
        self.metrics.released_bytes.set(self.original_bytes - resized["new_bytes"])
        self.metrics.released_measured_bytes.set(resized["released_bytes"])
        return self._outcome(
            "done",
            "",
            packed.blocks_moved,
            packed.bytes_moved,
            pause,
            self.original_bytes - resized["new_bytes"],
            resized["released_bytes"],
        )

    def _refresh_gauges(self) -> tuple[float, int]:
        state = self.status()
        self.metrics.fragmentation.set(state["fragmentation"])
        self.metrics.usable_blocks.set(state["usable_blocks"])
        return state["fragmentation"], state["usable_blocks"]

    def _outcome(
        self,
        status: str,
        reason: str,
        moved: int = 0,
        copied: int = 0,
        pause: float = 0.0,
        released: int = 0,
        measured: int = 0,
    ) -> Outcome:
        frag, usable = self._refresh_gauges()
        return Outcome(status, reason, moved, copied, pause, frag, usable, released, measured)

    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """One control request (``status``, ``metrics``, ``compact``, ``shrink``, ``grow``)."""
        if op == "status":
            return self.status()
        if op == "metrics":
            return {"text": self.metrics_text()}
        if op == "grow":
            return asdict(self.grow(args.get("num_blocks")))
        if op not in ("compact", "shrink"):
            raise ValueError(
                f"unknown op {op!r}; expected status, metrics, compact, shrink or grow"
            )
        limits = CompactionLimits(**args["limits"])
        if op == "compact":
            return asdict(self.compact(limits))
        return asdict(self.shrink(int(args["num_blocks"]), limits))

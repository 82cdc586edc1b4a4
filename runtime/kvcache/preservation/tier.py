"""gpupool's snapshot tier inside vLLM: vLLM's filesystem tier, keyed, touched, flushed on stop.

vLLM builds it from the ``secondary_tiers`` entry gpupool emits (``type: SnapshotTier`` with
this module as ``module_path``: vLLM's out-of-tree tier hook, tiering/factory.py). The file
layout, the atomic writes, the thread pool and O_DIRECT stay vLLM's own
(``FileSystemTierManager``). What a shared, bounded volume needs on top:

- a root named by everything that makes the bytes incompatible (what the engine knows,
  ``runtime_identity``, and what the policy says, ``identity``), so another model,
  revision, layout, vLLM version or hash seed never reads this tree;
- an identity file whose mtime is a heartbeat, so the snapshot GC knows the tree is in use;
- the mtime of every block it finds, set on the hit, so the GC's least-recently-used order
  does not depend on atime (off or coarse on most volumes);
- a bounded flush at shutdown: vLLM's pool drops queued writes at once; this waits up to
  ``flush_budget_s`` (the policy's ``disruption.snapshot_s``) and logs what was written and
  what was dropped;
- a status record (``status.TierStatus``) with restore hits, which the GC sidecar exports.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import vllm
from vllm.v1.core.kv_cache_utils import get_none_hash_seed
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from runtime.atomic_file import write_atomic
from runtime.kvcache.preservation.identity import IDENTITY_FILE, tier_dir_name
from runtime.kvcache.preservation.status import (
    FIRST_MINUTE_S,
    POD_ENV,
    Flush,
    TierStatus,
    status_path,
    write_status,
)

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

_log = logging.getLogger("vllm.gpupool.snapshot_tier")
"""Under ``vllm.`` so vLLM's logging configuration (handler, level) applies to it."""


def runtime_identity(spec: OffloadingSpec) -> dict[str, object]:
    """The compatibility fields only the running engine knows."""
    config = spec.config
    parallel = config.parallel
    return {
        "vllm": vllm.__version__,
        "model": config.model.name,
        "kv_dtype": config.model.dtype,
        "groups": [[g.tokens_per_block, list(g.layer_names)] for g in config.groups],
        "tokens_per_hash": config.cache.tokens_per_hash,
        "blocks_per_chunk": config.cache.blocks_per_chunk,
        "block_bytes": config.worker_kv_bytes_per_block,
        "parallel": [parallel.tp_size, parallel.pp_size, parallel.pcp_size, parallel.dcp_size],
        "kv_cache_layout": config.kv_cache_layout,
        "canonical_layout": config.canonical_layout,
        # Digested: the seed of every block hash (a random one never matches another process).
        "hash_seed": hashlib.sha256(get_none_hash_seed().encode()).hexdigest()[:16],
    }


class SnapshotTier(FileSystemTierManager):
    """vLLM's filesystem tier under an identity-keyed root, with GC and restore bookkeeping."""

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        root_dir: str,
        identity: Mapping[str, object] | None = None,
        flush_budget_s: float = 10.0,
        heartbeat_s: float = 10.0,
        **fs_options: Any,
    ) -> None:
        fields = {"engine": runtime_identity(offloading_spec), "policy": dict(identity or {})}
        self.volume_root = root_dir
        self.tier_root = os.path.join(root_dir, tier_dir_name(fields))
        os.makedirs(self.tier_root, exist_ok=True)
        _write_identity(Path(self.tier_root) / IDENTITY_FILE, fields)
        super().__init__(
            offloading_spec, primary_kv_view, tier_type, root_dir=self.tier_root, **fs_options
        )
        self._flush_budget_s = flush_budget_s
        self._heartbeat_s = heartbeat_s
        self._started = time.monotonic()
        pod = os.environ.get(POD_ENV) or socket.gethostname()
        self._status = TierStatus(
            pod=pod, tier=os.path.basename(self.tier_root), started_at=time.time()
        )
        self._status_file = status_path(root_dir, self._status)
        self._lock = threading.Condition()
        self._own: set[OffloadKey] = set()
        self._touched: set[str] = set()
        self._answered: dict[str, set[OffloadKey]] = {}
        """Per request: the blocks whose lookup has been counted."""
        self._pending_stores: dict[int, list[int]] = {}
        """Store job id -> [blocks, tasks not yet finished]."""
        self._load_sizes: dict[int, int] = {}
        self._pool.enqueue_store = self._counted(self._pool.enqueue_store)  # type: ignore[method-assign]
        self._stopping = threading.Event()
        self._beat()
        self._keeper = threading.Thread(
            target=self._keep, name="gpupool_snapshot_tier", daemon=True
        )
        self._keeper.start()
        _log.info("gpupool snapshot tier at %s (identity %s)", self.tier_root, fields)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """vLLM's lookup, counted once per request and block (the scheduler asks again every
        step until it schedules the load)."""
        result = super().lookup(key, req_context)
        if result is not LookupResult.RETRY:
            with self._lock:
                answered = self._answered.setdefault(req_context.req_id, set())
                if key not in answered:
                    answered.add(key)
                    self._status.lookups += 1
                    if result is LookupResult.HIT:
                        self._count_hit(key)
        return result

    def on_request_finished(self, req_context: ReqContext) -> None:
        with self._lock:
            self._answered.pop(req_context.req_id, None)
        super().on_request_finished(req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        paths = [self.file_mapper.get_file_name(k) for k in keys]
        with self._lock:
            self._touched.update(paths)

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        with self._lock:
            self._own.update(keys)
            self._pending_stores[int(job_metadata.job_id)] = [len(keys), 1]
        super().submit_store(job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        with self._lock:
            self._load_sizes[int(job_metadata.job_id)] = len(job_metadata.keys)
        super().submit_load(job_metadata)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = list(super().get_finished_jobs())
        with self._lock:
            for result in results:
                size = self._load_sizes.pop(int(result.job_id), None)
                if size is not None and not result.success:
                    self._status.load_failures += size - len(result.successful_keys or ())
        return results

    def shutdown(self) -> None:
        """Let queued writes finish for up to ``flush_budget_s``, then stop as vLLM does."""
        start = time.monotonic()
        with self._lock:
            in_flight = self._pending_blocks()
            written, failed = self._status.stored_blocks, self._status.store_failures
            self._lock.wait_for(lambda: not self._pending_stores, timeout=self._flush_budget_s)
        super().shutdown()  # drops what is still queued, waits for what is running
        with self._lock:
            flush = Flush(
                in_flight_blocks=in_flight,
                written_blocks=self._status.stored_blocks - written,
                failed_blocks=self._status.store_failures - failed,
                dropped_blocks=self._pending_blocks(),
                seconds=round(time.monotonic() - start, 3),
                budget_s=self._flush_budget_s,
            )
            self._status.flush = flush
            self._pending_stores.clear()
        self._stopping.set()
        self._keeper.join(timeout=self._heartbeat_s)
        self._beat()
        _log.info(
            "gpupool snapshot tier stopped: %d blocks in flight, %d written, %d failed, "
            "%d dropped, in %.2f s of a %.1f s budget",
            flush.in_flight_blocks,
            flush.written_blocks,
            flush.failed_blocks,
            flush.dropped_blocks,
            flush.seconds,
            flush.budget_s,
        )

    def _count_hit(self, key: OffloadKey) -> None:
        """Under the lock: a lookup found ``key``'s file."""
        status = self._status
        since = time.monotonic() - self._started
        status.hits += 1
        if status.first_hit_s is None:
            status.first_hit_s = round(since, 3)
        if key not in self._own:
            status.restored_hits += 1
            if since <= FIRST_MINUTE_S:
                status.restored_hits_first_minute += 1
        self._touched.add(self.file_mapper.get_file_name(key))

    def _pending_blocks(self) -> int:
        return sum(blocks for blocks, _ in self._pending_stores.values())

    def _counted(self, enqueue: Callable[..., None]) -> Callable[..., None]:
        """``enqueue_store`` whose tasks report their end here (written or failed)."""

        def enqueue_store(job_id: int, n_tasks: int, tasks: Iterable[Callable[[], None]]) -> None:
            with self._lock:
                entry = self._pending_stores.setdefault(int(job_id), [0, 0])
                entry[1] = n_tasks
            enqueue(job_id, n_tasks, [self._tracked(int(job_id), task) for task in tasks])

        return enqueue_store

    def _tracked(self, job_id: int, task: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            ok = False
            try:
                task()
                ok = True
            finally:
                self._store_done(job_id, ok)

        return run

    def _store_done(self, job_id: int, ok: bool) -> None:
        with self._lock:
            entry = self._pending_stores.get(job_id)
            if entry is None:  # shutdown already counted it as dropped
                return
            entry[1] -= 1
            if entry[1] <= 0 or not ok:
                del self._pending_stores[job_id]
                if ok:
                    self._status.stored_blocks += entry[0]
                else:
                    self._status.store_failures += entry[0]
                self._lock.notify_all()

    def _keep(self) -> None:
        while not self._stopping.wait(self._heartbeat_s):
            self._beat()

    def _beat(self) -> None:
        """Heartbeat, touch the blocks found since the last beat, publish the status."""
        with self._lock:
            touched, self._touched = self._touched, set()
            status = self._status.model_copy(deep=True)
        for path in (os.path.join(self.tier_root, IDENTITY_FILE), *touched):
            try:
                os.utime(path)
            except FileNotFoundError:
                pass  # deleted by the GC since: the next lookup misses
            except OSError as exc:
                _log.warning("gpupool snapshot tier: cannot touch %s: %s", path, exc)
        try:
            write_status(self._status_file, status)
        except OSError as exc:
            _log.warning("gpupool snapshot tier: cannot write %s: %s", self._status_file, exc)


def _write_identity(path: Path, fields: Mapping[str, object]) -> None:
    """Replace the identity file (every replica of one identity writes the same bytes)."""
    write_atomic(path, json.dumps(fields, sort_keys=True, indent=2, default=str))

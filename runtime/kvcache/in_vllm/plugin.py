"""vLLM general plugin (entry point ``vllm.general_plugins: gpupool_kvcache``).

vLLM loads general plugins in every one of its processes; this one does nothing unless
``GPUPOOL_KV_COMPACTION=1``. When active it adds, by name, without editing vLLM:

Scheduler side (EngineCore process):
  * ``EngineCore.gpupool_kv(op, args)``: a utility method (front ends reach it with
    ``engine_core.call_utility("gpupool_kv", op, args)``; utilities run between steps). It
    does not drain: a compact, shrink or grow while batches are in flight is deferred with
    the reason. Nothing in gpupool calls it (the sidecar and the CLI use the socket below);
    the tests and ``bench/resize.py`` do, on an in-process engine;
  * after ``EngineCore._initialize_kv_caches``: when ``GPUPOOL_KV_SOCKET`` is set (read per
    engine), the control socket (``control.ControlServer``), token from
    ``GPUPOOL_KV_TOKEN_FILE``. Its requests never run on the socket's thread: in a
    ``EngineCoreProc`` (every deployment) they go through the engine's own input queue
    (``_handle_client_request`` knows one more request type), so the engine's main thread
    runs them between steps, in order with adds, aborts and utility calls; an in-process
    engine (tests, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) has no such loop, so its ``step``,
    ``add_request`` and ``abort_requests`` run under a per-engine lock the requests take;
  * a quiesce point in ``EngineCore.step_with_batch_queue`` (async scheduling, pipeline
    parallelism: batches stay in flight between steps): while a compact, shrink or grow
    from the socket waits (``admit``), steps schedule no new batch and each retires one
    in-flight batch; the request runs once the queue is empty, or is deferred after
    ``batch_queue_size`` steps or ``QUIESCE_MAX_S``; scheduling then resumes.
Worker side (worker process, called through ``collective_rpc`` by method name):
  * ``gpupool_kv_relocate(pairs, strategy)``: copy blocks, rename block-table ids;
  * ``gpupool_kv_resize(num_blocks)``: re-bind every layer to a resized KV buffer;
  * ``gpupool_kv_rollback(pairs)``: undo this rank's renames of a pass that failed;
  * ``gpupool_kv_support()``: why this worker's KV cannot be relocated, or None.
  * the KV cache is allocated one layer per allocation (``worker_side.allocate_per_layer``),
    so a resize needs one layer's memory beyond the pool, not a second pool.
Order of one compaction: plan and check (scheduler) -> relocate (every worker) -> rename
(scheduler); a worker that fails has every rank rolled back and the scheduler untouched.
An engine the plugin cannot handle safely (``support``: a KV connector, several KV cache
groups, shared KV) is logged at start and every compaction request is refused with the
reason; the engine itself serves as usual.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from runtime.kvcache.control import ControlServer, Op, read_token
from runtime.kvcache.limits import Strategy
from runtime.kvcache.planner import Move

if TYPE_CHECKING:
    from runtime.kvcache.in_vllm.engine_control import EngineController

ENABLE_ENV = "GPUPOOL_KV_COMPACTION"
SOCKET_ENV = "GPUPOOL_KV_SOCKET"
TOKEN_FILE_ENV = "GPUPOOL_KV_TOKEN_FILE"
_installed = False
_log = logging.getLogger(__name__)

ENGINE_THREAD_TIMEOUT_S = 30.0
"""How long a control request waits for the engine to reach a step boundary."""
JOB_REQUEST = "gpupool_kv_job"
"""Request type of a control request on the engine's input queue (vLLM's are bytes)."""
QUIESCE_MAX_S = 2.0
"""Longest a compact, shrink or grow holds new batches back while the engine's batch queue
drains (async scheduling, pipeline parallelism) before it is deferred; the other bound is the
queue's size in steps (each held-back step retires one in-flight batch)."""
_STATE = "_gpupool"
"""The one attribute the plugin adds to an ``EngineCore`` (``EngineState``)."""


@dataclass(frozen=True)
class PluginSettings:
    """Activation and control-socket settings, as the environment gives them now."""

    enabled: bool
    socket: Path | None
    token_file: Path | None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> PluginSettings:
        env = dict(os.environ) if env is None else env
        socket = env.get(SOCKET_ENV)
        token_file = env.get(TOKEN_FILE_ENV)
        return cls(
            enabled=env.get(ENABLE_ENV, "") == "1",
            socket=Path(socket) if socket else None,
            token_file=Path(token_file) if token_file else None,
        )


def register() -> None:
    """Entry point vLLM calls in each process; installs the hooks once, only when enabled."""
    global _installed
    settings = PluginSettings.from_env()
    if _installed or not settings.enabled:
        return
    if settings.socket is not None and settings.token_file is None:
        raise RuntimeError(
            f"{SOCKET_ENV} is set but {TOKEN_FILE_ENV} is not: the socket needs a token"
        )
    _install_worker_methods()
    _install_engine_hooks()
    _installed = True


def _install_worker_methods() -> None:
    from vllm.v1.worker.worker_base import WorkerBase

    from runtime.kvcache.in_vllm import worker_side
    from runtime.kvcache.in_vllm.support import worker_refusal

    def gpupool_kv_relocate(self: Any, pairs: list[tuple[int, int]], strategy: Strategy) -> int:
        moves = [Move(int(s), int(d)) for s, d in pairs]
        return worker_side.relocate(self.model_runner, moves, strategy)

    def gpupool_kv_resize(self: Any, num_blocks: int) -> dict[str, int]:
        result = worker_side.resize(self.model_runner, int(num_blocks))
        worker_side.rename(self.model_runner, [])  # stale ids beyond a shrunk pool -> null
        return asdict(result)

    def gpupool_kv_rollback(self: Any, pairs: list[tuple[int, int]]) -> None:
        worker_side.rollback(self.model_runner, [Move(int(s), int(d)) for s, d in pairs])

    def gpupool_kv_support(self: Any) -> str | None:
        return worker_refusal(self.model_runner)

    WorkerBase.gpupool_kv_relocate = gpupool_kv_relocate  # type: ignore[attr-defined]
    WorkerBase.gpupool_kv_resize = gpupool_kv_resize  # type: ignore[attr-defined]
    WorkerBase.gpupool_kv_rollback = gpupool_kv_rollback  # type: ignore[attr-defined]
    WorkerBase.gpupool_kv_support = gpupool_kv_support  # type: ignore[attr-defined]
    worker_side.install_per_layer_allocation()  # a resize frees one layer at a time


@dataclass
class EngineJob:
    """One control request waiting on the engine's input queue for its main thread."""

    run: Callable[[], dict[str, Any]]
    quiesce: bool = False
    """It changes the pool: it runs only with no batch in flight (``admit``)."""
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    error: BaseException | None = None
    state: str = "queued"
    """queued -> running -> done, or queued -> cancelled (the caller stopped waiting)."""
    guard: threading.Lock = field(default_factory=threading.Lock)

    def execute(self, run: Callable[[], dict[str, Any]] | None = None) -> None:
        """On the engine's main thread: run (``run`` instead of the job's own, e.g. to answer
        that it is deferred) unless the caller gave up first."""
        with self.guard:
            if self.state == "cancelled":
                return
            self.state = "running"
        try:
            self.result = (run or self.run)()
        except Exception as exc:  # returned to the caller, never raised in the engine loop
            self.error = exc
        finally:
            self.state = "done"
            self.done.set()

    def wait(self, timeout_s: float) -> dict[str, Any]:
        """The result; TimeoutError (and the job cancelled) if it did not start in time."""
        if not self.done.wait(timeout_s):
            with self.guard:
                if self.state == "queued":
                    self.state = "cancelled"
                    raise TimeoutError(
                        f"the engine did not reach a step boundary within {timeout_s:g} s"
                    )
            self.done.wait()  # started: it finishes between these two steps
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def control_job(core: Any, op: Op, args: dict[str, Any]) -> EngineJob:
    """The job that answers one control request with ``core``'s controller."""
    return EngineJob(lambda: controller(core).handle(op, args), quiesce=op.changes_the_pool)


def on_engine_thread(core: Any, op: Op, args: dict[str, Any]) -> dict[str, Any]:
    """Serve one control request between two steps of ``core``, on its main thread when it
    has one (``EngineCoreProc``), else under its lock (in-process engine); either way
    ``admit`` runs it, or holds new batches back until the batch queue is empty."""
    job = control_job(core, op, args)
    inputs = getattr(core, "input_queue", None)
    if inputs is None:
        with state(core).lock:
            admit(core, job)
    else:
        inputs.put_nowait((JOB_REQUEST, job))
    return job.wait(ENGINE_THREAD_TIMEOUT_S)


@dataclass
class Drain:
    """Jobs waiting, with new batches held back, for the engine's batch queue to empty."""

    jobs: list[EngineJob]
    started_s: float
    """Monotonic time the first job arrived."""
    steps: int = 0
    """Steps run since then without scheduling a new batch."""


def drain_verdict(
    *, in_flight: int, steps: int, elapsed_s: float, max_steps: int, max_s: float
) -> Literal["run", "drain", "give up"]:
    """What jobs waiting for an empty batch queue do at a step boundary: run once no batch is
    in flight, give up when either bound is reached, else hold new batches back one more
    step."""
    if in_flight == 0:
        return "run"
    if steps >= max_steps or elapsed_s >= max_s:
        return "give up"
    return "drain"


def admit(core: Any, job: EngineJob) -> None:
    """Between two steps: run ``job`` now, or, when it changes the pool while batches are in
    flight, park it; ``step_with_batch_queue`` then schedules nothing new, so each step
    retires one in-flight batch, and the parked jobs run once the queue is empty (or are
    deferred at the bound). An engine the plugin refuses answers at once."""
    if job.quiesce and core.batch_queue and controller(core).refusal is None:
        kept = state(core)
        if kept.drain is None:
            kept.drain = Drain([], time.monotonic())
        kept.drain.jobs.append(job)
        _settle(core, kept.drain)
    else:
        job.execute()


def _settle(core: Any, drain: Drain) -> None:
    elapsed = time.monotonic() - drain.started_s
    in_flight = len(core.batch_queue)
    verdict = drain_verdict(
        in_flight=in_flight,
        steps=drain.steps,
        elapsed_s=elapsed,
        max_steps=core.batch_queue_size,
        max_s=QUIESCE_MAX_S,
    )
    if verdict == "drain":
        return
    state(core).drain = None
    reason = (
        f"{in_flight} batches still in flight after holding new batches back for "
        f"{drain.steps} steps ({elapsed:.2f} s; bound {core.batch_queue_size} steps or "
        f"{QUIESCE_MAX_S:g} s); retry at the next poll"
    )
    deferred = controller(core).deferred
    for job in drain.jobs:
        job.execute(None if verdict == "run" else lambda: deferred(reason).to_reply())


@contextmanager
def _no_new_batches(scheduler: Any) -> Iterator[None]:
    """``EngineCore.step_with_batch_queue`` schedules a new batch only when
    ``scheduler.has_requests()``; answering False for one call makes that step retire the
    oldest in-flight batch instead (and process its output) without queueing another. An
    instance attribute shadows the method for the call only; vLLM's pause states would
    still queue an empty batch while finished requests are pending, log every change, and
    overwrite an operator's pause."""
    scheduler.has_requests = lambda: False
    try:
        yield
    finally:
        del scheduler.has_requests


@dataclass
class EngineState:
    """What the plugin keeps on one ``EngineCore``, under one attribute (``_STATE``)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    """Held by every step, request change and control job: one at a time."""
    controller: EngineController | None = None
    """Created on first use, once the scheduler exists."""
    drain: Drain | None = None
    """Jobs waiting for the batch queue to empty, while there are any."""
    control: ControlServer | None = None
    """The control socket's server, where the environment configures one."""


def state(core: Any) -> EngineState:
    """``core``'s plugin state (created on first use; ``setdefault`` keeps it one)."""
    found: EngineState | None = core.__dict__.get(_STATE)
    if found is None:
        found = core.__dict__.setdefault(_STATE, EngineState())
    return found


def controller(core: Any) -> EngineController:
    """The engine's ``EngineController`` (created on first use, after the scheduler exists)."""
    from runtime.kvcache.in_vllm.engine_control import EngineController

    kept = state(core)
    with kept.lock:
        if kept.controller is None:
            kept.controller = EngineController(core)
        return kept.controller


def _install_engine_hooks() -> None:
    from vllm.v1.engine.core import EngineCore, EngineCoreProc

    from runtime.kvcache.in_vllm.engine_control import refusal

    def locked(method: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *a: Any, **kw: Any) -> Any:
            with state(self).lock:
                return method(self, *a, **kw)

        run.__name__ = method.__name__
        return run

    init_kv = EngineCore._initialize_kv_caches
    dispatch = EngineCoreProc._handle_client_request
    step_batches = EngineCore.step_with_batch_queue

    def step_with_batch_queue(self: Any) -> Any:
        with state(self).lock:
            drain = state(self).drain
            if drain is None:
                return step_batches(self)
            with _no_new_batches(self.scheduler):
                result = step_batches(self)
            drain.steps += 1
            _settle(self, drain)
            return result

    def gpupool_kv(self: Any, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        with state(self).lock:
            return controller(self).handle(Op.parse(op), args or {})

    def handle_client_request(self: Any, request_type: Any, request: Any) -> None:
        if request_type == JOB_REQUEST:
            admit(self, request)
            return
        dispatch(self, request_type, request)

    def initialize_kv_caches(self: Any, *a: Any, **kw: Any) -> Any:
        config = init_kv(self, *a, **kw)
        reason = refusal(self, config)
        if reason is not None:
            _log.warning("gpupool KV compaction refused for this engine: %s", reason)
        current = PluginSettings.from_env()  # per engine: a process may host several
        if current.enabled and current.socket is not None and current.token_file is not None:
            state(self).control = ControlServer(
                current.socket,
                read_token(current.token_file),
                lambda op, args: on_engine_thread(self, op, args),
            )
        return config

    for name in ("step", "add_request", "abort_requests"):
        setattr(EngineCore, name, locked(getattr(EngineCore, name)))
    EngineCore.step_with_batch_queue = step_with_batch_queue  # type: ignore[method-assign]
    EngineCore.gpupool_kv = gpupool_kv  # type: ignore[attr-defined]
    EngineCore._initialize_kv_caches = initialize_kv_caches  # type: ignore[method-assign]
    EngineCoreProc._handle_client_request = handle_client_request

"""vLLM general plugin (entry point ``vllm.general_plugins: gpupool_kvcache``).

vLLM loads general plugins in every one of its processes; this one does nothing unless
``GPUPOOL_KV_COMPACTION=1``. When active it adds, by name, without editing vLLM:

Scheduler side (EngineCore process):
  * ``EngineCore.gpupool_kv(op, args)``: a utility method (front ends reach it with
    ``engine_core.call_utility("gpupool_kv", op, args)``; utilities run between steps);
  * after ``EngineCore._initialize_kv_caches``: when ``GPUPOOL_KV_SOCKET`` is set (read per
    engine), the control socket (``control.ControlServer``), token from
    ``GPUPOOL_KV_TOKEN_FILE``. Its requests never run on the socket's thread: in a
    ``EngineCoreProc`` (every deployment) they go through the engine's own input queue
    (``_handle_client_request`` knows one more request type), so the engine's main thread
    runs them between steps, in order with adds, aborts and utility calls; an in-process
    engine (tests, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) has no such loop, so its ``step``,
    ``add_request`` and ``abort_requests`` run under a per-engine lock the requests take.
Worker side (worker process, called through ``collective_rpc`` by method name):
  * ``gpupool_kv_relocate(pairs, strategy)``: copy blocks, rename block-table ids;
  * ``gpupool_kv_resize(num_blocks)``: re-bind every layer to a resized KV buffer;
  * ``gpupool_kv_rollback(pairs)``: undo this rank's renames of a pass that failed;
  * ``gpupool_kv_support()``: why this worker's KV cannot be relocated, or None.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runtime.kvcache.limits import Strategy
from runtime.kvcache.planner import Move

ENABLE_ENV = "GPUPOOL_KV_COMPACTION"
SOCKET_ENV = "GPUPOOL_KV_SOCKET"
TOKEN_FILE_ENV = "GPUPOOL_KV_TOKEN_FILE"
_installed = False
_log = logging.getLogger(__name__)

ENGINE_THREAD_TIMEOUT_S = 30.0
"""How long a control request waits for the engine to reach a step boundary."""
JOB_REQUEST = "gpupool_kv_job"
"""Request type of a control request on the engine's input queue (vLLM's are bytes)."""


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
        return asdict(worker_side.resize(self.model_runner, int(num_blocks)))

    def gpupool_kv_rollback(self: Any, pairs: list[tuple[int, int]]) -> None:
        worker_side.rollback(self.model_runner, [Move(int(s), int(d)) for s, d in pairs])

    def gpupool_kv_support(self: Any) -> str | None:
        return worker_refusal(self.model_runner)

    WorkerBase.gpupool_kv_relocate = gpupool_kv_relocate  # type: ignore[attr-defined]
    WorkerBase.gpupool_kv_resize = gpupool_kv_resize  # type: ignore[attr-defined]
    WorkerBase.gpupool_kv_rollback = gpupool_kv_rollback  # type: ignore[attr-defined]
    WorkerBase.gpupool_kv_support = gpupool_kv_support  # type: ignore[attr-defined]


@dataclass
class EngineJob:
    """One control request waiting on the engine's input queue for its main thread."""

    run: Callable[[], dict[str, Any]]
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    error: BaseException | None = None
    state: str = "queued"
    """queued -> running -> done, or queued -> cancelled (the caller stopped waiting)."""
    guard: threading.Lock = field(default_factory=threading.Lock)

    def execute(self) -> None:
        """On the engine's main thread: run unless the caller gave up first."""
        with self.guard:
            if self.state == "cancelled":
                return
            self.state = "running"
        try:
            self.result = self.run()
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


def on_engine_thread(core: Any, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """Serve one control request between two steps of ``core``, on its main thread when it
    has one (``EngineCoreProc``), else under its lock (in-process engine)."""
    inputs = getattr(core, "input_queue", None)
    if inputs is None:
        with _lock(core):
            result: dict[str, Any] = controller(core).handle(op, args)
            return result
    job = EngineJob(lambda: controller(core).handle(op, args))
    inputs.put_nowait((JOB_REQUEST, job))
    return job.wait(ENGINE_THREAD_TIMEOUT_S)


def _lock(core: Any) -> threading.RLock:
    lock: threading.RLock | None = core.__dict__.get("_gpupool_step_lock")
    if lock is None:
        lock = core.__dict__.setdefault("_gpupool_step_lock", threading.RLock())
    return lock


def controller(core: Any) -> Any:
    """The engine's ``EngineController`` (created on first use, after the scheduler exists)."""
    from runtime.kvcache.in_vllm.engine_control import EngineController

    found = core.__dict__.get("_gpupool_controller")
    if found is None:
        found = core.__dict__.setdefault("_gpupool_controller", EngineController(core))
    return found


def _install_engine_hooks() -> None:
    from vllm.v1.engine.core import EngineCore, EngineCoreProc

    from runtime.kvcache.control import ControlServer, read_token
    from runtime.kvcache.in_vllm.engine_control import refusal

    def locked(method: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *a: Any, **kw: Any) -> Any:
            with _lock(self):
                return method(self, *a, **kw)

        run.__name__ = method.__name__
        return run

    init_kv = EngineCore._initialize_kv_caches
    dispatch = EngineCoreProc._handle_client_request

    def gpupool_kv(self: Any, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        with _lock(self):
            result: dict[str, Any] = controller(self).handle(op, args or {})
            return result

    def handle_client_request(self: Any, request_type: Any, request: Any) -> None:
        if request_type == JOB_REQUEST:
            request.execute()
            return
        dispatch(self, request_type, request)

    def initialize_kv_caches(self: Any, *a: Any, **kw: Any) -> Any:
        config = init_kv(self, *a, **kw)
        reason = refusal(self, config)
        if reason is not None:
            _log.warning("gpupool KV compaction refused for this engine: %s", reason)
        current = PluginSettings.from_env()  # per engine: a process may host several
        if current.enabled and current.socket is not None and current.token_file is not None:
            self._gpupool_control = ControlServer(
                current.socket,
                read_token(current.token_file),
                lambda op, args: on_engine_thread(self, op, args),
            )
        return config

    for name in ("step", "step_with_batch_queue", "add_request", "abort_requests"):
        setattr(EngineCore, name, locked(getattr(EngineCore, name)))
    EngineCore.gpupool_kv = gpupool_kv  # type: ignore[attr-defined]
    EngineCore._initialize_kv_caches = initialize_kv_caches  # type: ignore[method-assign]
    EngineCoreProc._handle_client_request = handle_client_request

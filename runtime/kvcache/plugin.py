"""vLLM general plugin (entry point ``vllm.general_plugins: gpupool_kvcache``).

vLLM loads general plugins in every one of its processes; this one does nothing unless
``GPUPOOL_KV_COMPACTION=1``. When active it adds, by name, without editing vLLM:

Scheduler side (EngineCore process):
  * ``EngineCore.step`` / ``step_with_batch_queue`` run under a per-engine lock, so any
    request served under the same lock runs between two steps;
  * ``EngineCore.gpupool_kv(op, args)``: a utility method (front ends reach it with
    ``engine_core.call_utility("gpupool_kv", op, args)``; utilities run between steps);
  * after ``EngineCore._initialize_kv_caches``: when ``GPUPOOL_KV_SOCKET`` is set (read per
    engine), the control socket (``control.ControlServer``), token from
    ``GPUPOOL_KV_TOKEN_FILE``.
Worker side (worker process, called through ``collective_rpc`` by method name):
  * ``gpupool_kv_relocate(pairs, strategy)``: copy blocks, rename block-table ids;
  * ``gpupool_kv_resize(num_blocks)``: re-bind every layer to a resized KV buffer.
Order of one compaction: plan (scheduler) -> relocate (workers) -> rename (scheduler).
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runtime.kvcache.limits import Strategy
from runtime.kvcache.planner import Move

ENABLE_ENV = "GPUPOOL_KV_COMPACTION"
SOCKET_ENV = "GPUPOOL_KV_SOCKET"
TOKEN_FILE_ENV = "GPUPOOL_KV_TOKEN_FILE"
_installed = False


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

    from runtime.kvcache import worker_side

    def gpupool_kv_relocate(self: Any, pairs: list[tuple[int, int]], strategy: Strategy) -> int:
        moves = [Move(int(s), int(d)) for s, d in pairs]
        return worker_side.relocate(self.model_runner, moves, strategy)

    def gpupool_kv_resize(self: Any, num_blocks: int) -> dict[str, int]:
        return asdict(worker_side.resize(self.model_runner, int(num_blocks)))

    WorkerBase.gpupool_kv_relocate = gpupool_kv_relocate  # type: ignore[attr-defined]
    WorkerBase.gpupool_kv_resize = gpupool_kv_resize  # type: ignore[attr-defined]


def _lock(core: Any) -> threading.RLock:
    lock: threading.RLock | None = core.__dict__.get("_gpupool_step_lock")
    if lock is None:
        lock = core.__dict__.setdefault("_gpupool_step_lock", threading.RLock())
    return lock


def controller(core: Any) -> Any:
    """The engine's ``EngineController`` (created on first use, after the scheduler exists)."""
    from runtime.kvcache.engine_control import EngineController

    found = core.__dict__.get("_gpupool_controller")
    if found is None:
        found = core.__dict__.setdefault("_gpupool_controller", EngineController(core))
    return found


def _install_engine_hooks() -> None:
    from vllm.v1.engine.core import EngineCore

    from runtime.kvcache.control import ControlServer, read_token

    step, step_batched = EngineCore.step, EngineCore.step_with_batch_queue
    init_kv = EngineCore._initialize_kv_caches

    def locked_step(self: Any) -> Any:
        with _lock(self):
            return step(self)

    def locked_step_batched(self: Any) -> Any:
        with _lock(self):
            return step_batched(self)

    def gpupool_kv(self: Any, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        with _lock(self):
            result: dict[str, Any] = controller(self).handle(op, args or {})
            return result

    def initialize_kv_caches(self: Any, *a: Any, **kw: Any) -> Any:
        config = init_kv(self, *a, **kw)
        current = PluginSettings.from_env()  # per engine: a process may host several
        if current.enabled and current.socket is not None and current.token_file is not None:
            self._gpupool_control = ControlServer(
                current.socket,
                read_token(current.token_file),
                lambda op, args: gpupool_kv(self, op, args),
            )
        return config

    EngineCore.step = locked_step  # type: ignore[method-assign]
    EngineCore.step_with_batch_queue = locked_step_batched  # type: ignore[method-assign]
    EngineCore.gpupool_kv = gpupool_kv  # type: ignore[attr-defined]
    EngineCore._initialize_kv_caches = initialize_kv_caches  # type: ignore[method-assign]

"""The local control channel between the sidecar and the plugin: a token-checked unix socket.

One JSON request per line, one JSON reply per line. The socket file is created mode 0600 in
a directory shared only by the containers of the pod (an ``emptyDir``), so nothing off the
node can reach it; every request must also carry the token read from a file (a Kubernetes
Secret), compared in constant time.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any


class ControlError(RuntimeError):
    """The plugin refused or failed a request; the message says why."""


class Op(StrEnum):
    """What a control request asks the plugin for."""

    STATUS = "status"
    METRICS = "metrics"
    COMPACT = "compact"
    SHRINK = "shrink"
    GROW = "grow"

    @classmethod
    def parse(cls, value: object) -> Op:
        """The op a request names; ``ValueError`` naming the ops otherwise."""
        try:
            return cls(str(value))
        except ValueError:
            expected = ", ".join(op.value for op in cls)
            raise ValueError(f"unknown op {value!r}; expected one of {expected}") from None

    @property
    def changes_the_pool(self) -> bool:
        """Changes block ids or the KV buffer: no batch may be in flight while it runs."""
        return self in (Op.COMPACT, Op.SHRINK, Op.GROW)


class Status(StrEnum):
    """How a compact, shrink or grow ended (the plugin's ``compactions`` metric label)."""

    DONE = "done"
    DEFERRED = "deferred"
    """Not now (the engine is saturated, batches in flight): the next poll may retry."""
    REFUSED = "refused"
    """Never as asked (a target out of range, below the floor, an engine the plugin refuses)."""
    FAILED = "failed"
    """Tried and rolled back; the pool is as it was."""
    NOOP = "noop"
    """Nothing to do: already packed, already the requested size."""


@dataclass(frozen=True)
class Outcome:
    """The reply to a compact, shrink or grow."""

    status: Status
    reason: str = ""
    blocks_moved: int = 0
    bytes_moved: int = 0
    pause_s: float = 0.0
    fragmentation: float = 0.0
    usable_blocks: int = 0
    released_bytes: int = 0
    released_measured_bytes: int = 0
    peak_extra_bytes: int | None = None
    """A resize's: the most any rank held beyond the larger of its old and new pool
    (``worker_side.ResizeResult``); None without a resize or where no rank can measure it."""

    def to_reply(self) -> dict[str, Any]:
        return asdict(self)


Handler = Callable[[Op, dict[str, Any]], dict[str, Any]]


def read_token(path: Path) -> str:
    """The shared secret in ``path`` (surrounding whitespace stripped; must not be empty)."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ControlError(f"cannot read control token file {path}: {exc.strerror}") from None
    if not token:
        raise ControlError(f"control token file {path} is empty")
    return token


class ControlServer:
    """Serves ``handler`` on a unix socket from a daemon thread until ``close``."""

    def __init__(self, path: Path, token: str, handler: Handler) -> None:
        self.path, self._token, self._handler = path, token, handler
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self._sock.bind(str(path))
        finally:
            os.umask(old_umask)
        self._sock.listen(4)
        self._thread = threading.Thread(target=self._serve, name="gpupool-kv-control", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb") as stream:
                line = stream.readline()
                stream.write(json.dumps(self._answer(line)).encode() + b"\n")
                stream.flush()

    def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("request must be a JSON object")
            token = str(request.get("token", ""))
            if not hmac.compare_digest(token.encode(), self._token.encode()):
                return {"ok": False, "error": "unauthorized: bad or missing token"}
            result = self._handler(Op.parse(request.get("op")), dict(request.get("args") or {}))
            return {"ok": True, "result": result}
        except Exception as exc:  # the engine must survive any bad request
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class ControlClient:
    """Sends one request per call to the plugin's socket."""

    def __init__(self, path: Path, token: str, timeout_s: float = 120.0) -> None:
        self.path, self._token, self.timeout_s = path, token, timeout_s

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        """The plugin's result for ``op``; raises ``ControlError`` with its reason otherwise."""
        request = {"token": self._token, "op": op, "args": args}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout_s)
                sock.connect(str(self.path))
                with sock.makefile("rwb") as stream:
                    stream.write(json.dumps(request).encode() + b"\n")
                    stream.flush()
                    reply = json.loads(stream.readline() or b"{}")
        except OSError as exc:
            raise ControlError(f"control socket {self.path}: {exc}") from None
        if not reply.get("ok"):
            raise ControlError(str(reply.get("error", "no reply from the plugin")))
        result: dict[str, Any] = reply["result"]
        return result

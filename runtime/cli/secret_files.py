"""Tokens the CLI reads from a mounted Secret's file, or from the environment without one."""

from __future__ import annotations

import os
from pathlib import Path

from runtime.cli.errors import UsageProblem


def read_secret(option: str, path: Path | None, env: str) -> str:
    """A token from ``path`` (a mounted Secret's file, what the Deployment passes) or, without
    one, from ``$env``; "" when neither holds one."""
    if path is None:
        return os.environ.get(env, "").strip()
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageProblem(f"{option} {path}: {exc}") from None


def optional_secret(option: str, path: Path | None, env: str) -> str | None:
    """Like ``read_secret`` for a Secret that may not exist yet: a missing file is no token
    (the kubelet fills an optional Secret's volume once it is created); read at every use."""
    if path is not None and not path.exists():
        return None
    return read_secret(option, path, env) or None

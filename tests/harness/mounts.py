"""Real mounts for tests: a small tmpfs (a filesystem that fills up, a mount point inside an
output folder, a read-only folder that even root cannot write).

Mounting needs CAP_SYS_ADMIN; without it the tests that need a mount skip and say so. Each
mount is lazily unmounted when its test ends, so a failing test leaves no mount behind.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, *, size_kib: int = 1024, read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size_kib`` at ``path`` (created) for the body; skip without rights."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size_kib}k" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "gpupool-test", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def remount(path: Path, options: str) -> None:
    """Change the tmpfs at ``path``: ``ro`` (after filling it), ``size=NNNk`` (to fill it)."""
    command = ["mount", "-o", f"remount,{options}", str(path)]
    subprocess.run(command, capture_output=True, check=True)


def used_kib(path: Path) -> int:
    """KiB the filesystem at ``path`` holds."""
    found = os.statvfs(path)
    return (found.f_blocks - found.f_bfree) * found.f_frsize // 1024

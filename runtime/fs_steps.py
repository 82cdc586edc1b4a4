"""The filesystem steps a write is made of, each within one filesystem: a folder exchange
(``renameat2(RENAME_EXCHANGE)``, two renames where it is missing), removing a tree without
leaving its device, fsync of a folder, the staging folder's lock, SIGINT held past the
commit point (``runtime.atomic_file`` composes them)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

AT_FDCWD = -100
RENAME_EXCHANGE = 2  # linux/fs.h
UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    False where the C library or the filesystem does not offer it (the caller falls back).
    """
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(b))


def replace_by_renames(new: Path, out: Path) -> Path:
    """The fallback swap: ``out`` aside, ``new`` in (``out`` briefly absent, never mixed).

    Returns the path holding the old tree; puts it back if the second rename fails.
    """
    aside = new.with_name(new.name + ".old")
    os.rename(out, aside)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(aside, out)
        raise
    return aside


def remove_tree(root: Path, stop: Callable[[], bool] = lambda: False) -> None:
    """Remove ``root`` without leaving its filesystem: a folder on another device (a mount
    point) and what it holds stay. ``stop``: give up early (the next run finishes)."""
    try:
        device = os.lstat(root).st_dev
    except FileNotFoundError:
        return
    folders: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if same_device(Path(folder) / d, device)]
        folders.append(folder)
        for name in files + [d for d in dirs if os.path.islink(Path(folder) / d)]:
            if stop():
                return
            with suppress(FileNotFoundError):
                os.unlink(Path(folder) / name)
    for folder in reversed(folders):
        with suppress(OSError):
            os.rmdir(folder)


def same_device(path: Path, device: int) -> bool:
    try:
        return os.lstat(path).st_dev == device and not os.path.ismount(path)
    except OSError:
        return False


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock(folder: Path) -> int:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@contextmanager
def locked(folder: Path) -> Iterator[bool]:
    """Hold ``folder``'s lock; False where a live writer holds it."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


@contextmanager
def held_interrupts() -> Iterator[Callable[[], bool]]:
    """Hold SIGINT while the body runs (it is past the commit point): the signal is noted,
    not raised, so the command finishes and exits 0. Yields "was one noted?"."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    noted: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        noted.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield lambda: bool(noted)
    finally:
        signal.signal(signal.SIGINT, previous)

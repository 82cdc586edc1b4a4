"""Edge: one scan of the snapshot volume, and carrying out a ``retention.Plan`` on it.

Every top-level directory except gpupool's state directory is a tier: gpupool's own
(``gpupool-kv-<digest>``, with an identity file whose mtime is the writers' heartbeat), or
one left by an older layout (vLLM's tree directly under the root), whose heartbeat is its
newest file. Files vanish under the scan while vLLM renames and other replicas' GCs delete:
a file gone by the time it is looked at was simply not there.

The volume is shared and anything may be put on it, so the walk is a loop (a tree thousands
of folders deep is no RecursionError), looks at each entry with lstat and never follows a
symlink (nothing outside the tree is read or deleted), passes over FIFOs, devices and
sockets (opening one could block), reads no file (records: ``read_record``, bounded), and
stops at its ``Budget``'s deadline. What it passes over is noted, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from runtime.kvcache.preservation.identity import IDENTITY_FILE, STATE_DIR
from runtime.kvcache.preservation.retention import FileKind, Plan, Reason, TierFile

NOT_TIERS = frozenset({STATE_DIR, "lost+found"})
"""Top-level names that are never a tier (``lost+found``: ext4's, on a fresh volume)."""
_PARTIAL = re.compile(r"\.bin_\d+\.tmp$")
"""vLLM's in-progress block write: ``<file>.bin`` + a per-thread ``_<random>.tmp`` suffix
(vllm/v1/kv_offload/tiering/fs/io.py ``_get_tmp_suffix``), renamed to ``<file>.bin``."""
PASS_BUDGET_S = 60.0
"""Longest a walk of the volume may take (a GC pass, ``show``); the rest waits for the next."""
NAMED_SKIPS = 5
"""Entries passed over that a report names (all are counted)."""
MAX_RECORD_BYTES = 64 * 1024
"""Largest replica record read (one is about 500 bytes); a larger file is passed over."""


@dataclass
class Budget:
    """A walk's deadline, and what it passed over."""

    seconds: float = PASS_BUDGET_S
    deadline: float = field(init=False)
    expired: bool = False
    """The deadline passed before the walk ended: what it found is a part of the volume."""
    skipped: int = 0
    named: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.seconds

    def over(self) -> bool:
        if not self.expired and time.monotonic() > self.deadline:
            self.expired = True
        return self.expired

    def skip(self, path: str, why: str) -> None:
        self.skipped += 1
        if len(self.named) < NAMED_SKIPS:
            self.named.append(f"{path}: {why}")

    def report(self) -> str | None:
        """One line on what the walk left out, or None when it saw everything."""
        parts = []
        if self.expired:
            parts.append(f"stopped at its {self.seconds:g} s budget")
        if self.skipped:
            more = self.skipped - len(self.named)
            shown = "; ".join(self.named) + (f"; and {more} more" if more else "")
            parts.append(f"passed over {self.skipped} entries ({shown})")
        return "walk " + ", ".join(parts) if parts else None


def kind_of(name: str) -> FileKind:
    if name.endswith(".bin"):
        return "block"
    return "partial" if _PARTIAL.search(name) else "other"


@dataclass(frozen=True)
class Scan:
    files: tuple[TierFile, ...]
    heartbeats: dict[str, float]
    complete: bool
    """Every entry was looked at (False: the budget ran out; heartbeats are not known)."""


def scan(root: Path, budget: Budget | None = None) -> Scan:
    """Every regular file of every tier under ``root``, and each tier's heartbeat."""
    budget = budget or Budget()
    files: list[TierFile] = []
    heartbeats: dict[str, float] = {}
    for top in _entries(root, budget):
        if budget.over():
            break
        if top.name in NOT_TIERS or not top.is_dir(follow_symlinks=False):
            continue
        found = list(_files(top.path, top.name, budget))
        files += found
        identity = os.path.join(top.path, IDENTITY_FILE)
        beat = next((f.mtime for f in found if f.path == identity), None)
        if beat is None:
            beat = max((f.mtime for f in found), default=mtime(top.path))
        heartbeats[top.name] = beat
    return Scan(tuple(files), heartbeats, complete=not budget.expired)


@dataclass
class Applied:
    """What a plan did: deletions done per reason, and those that failed."""

    deleted_files: dict[Reason, int] = field(default_factory=dict)
    deleted_bytes: dict[Reason, int] = field(default_factory=dict)
    capacity_ages_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def apply(root: Path, plan: Plan, budget: Budget) -> Applied:
    """Delete the plan's files (one already gone is not counted: another replica's GC took
    it), then the emptied directories of reclaimed tiers, never a directory of a live one."""
    done = Applied()
    for d in plan.deletions:
        try:
            os.unlink(d.path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            done.errors.append(f"{d.path}: {exc}")
            continue
        done.deleted_files[d.reason] = done.deleted_files.get(d.reason, 0) + 1
        done.deleted_bytes[d.reason] = done.deleted_bytes.get(d.reason, 0) + d.size
        if d.reason == "capacity":
            done.capacity_ages_s.append(d.age_s)
    for tier in plan.reclaimed_tiers:
        _remove_empty_dirs(root / tier, budget)
    return done


def records(directory: Path, budget: Budget) -> list[Path]:
    """The regular files directly in ``directory`` (the replicas' records), sorted; nothing
    when it, or the state directory above it, is a symlink: records are renamed and deleted,
    and never outside the volume."""
    for path in (directory.parent, directory):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(path).st_mode):
                budget.skip(str(path), "a symlink (not followed)")
                return []
    found = []
    for entry in _entries(directory, budget):
        if budget.over():
            break
        if _regular(entry, budget) is not None:
            found.append(Path(entry.path))
    return sorted(found)


def read_record(path: Path, budget: Budget) -> bytes | None:
    """``path``'s bytes when it is a regular file of at most ``MAX_RECORD_BYTES``, else None
    (noted). Checked with lstat before it is opened, opened without following a symlink or
    blocking (a FIFO), checked again on the open file (it may have been replaced since)."""
    try:
        if not _small_regular(os.lstat(path)):
            budget.skip(str(path), f"not a regular file of at most {MAX_RECORD_BYTES} bytes")
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not _small_regular(os.fstat(fd)):
                return None
            data = os.read(fd, MAX_RECORD_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        budget.skip(str(path), f"cannot read: {exc.strerror}")
        return None
    return data if len(data) <= MAX_RECORD_BYTES else None


def _small_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_size <= MAX_RECORD_BYTES


def _entries(path: str | Path, budget: Budget) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            yield from it
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:  # permissions, a path too long, an I/O error: pass over it
        budget.skip(str(path), f"cannot list: {exc.strerror}")


def _tree(top: str, budget: Budget) -> Iterator[tuple[os.DirEntry[str], os.stat_result | None]]:
    """Every directory (``None``) and regular file (its lstat) under ``top``, depth first,
    with a stack instead of recursion; anything else is noted and passed over."""
    stack = [top]
    while stack and not budget.over():
        for entry in _entries(stack.pop(), budget):
            if budget.over():
                return
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    yield entry, None
                    continue
            except OSError:
                continue
            st = _regular(entry, budget)
            if st is not None:
                yield entry, st


def _regular(entry: os.DirEntry[str], budget: Budget) -> os.stat_result | None:
    """``entry``'s lstat if it is a regular file; otherwise noted (gone: nothing)."""
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        budget.skip(entry.path, f"cannot stat: {exc.strerror}")
        return None
    if stat.S_ISREG(st.st_mode):
        return st
    budget.skip(entry.path, _kind(st.st_mode))
    return None


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symlink (not followed)"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _files(path: str, tier: str, budget: Budget) -> Iterator[TierFile]:
    for entry, st in _tree(path, budget):
        if st is not None:
            yield TierFile(entry.path, tier, kind_of(entry.name), st.st_size, st.st_mtime)


def mtime(path: str | Path) -> float:
    """``path``'s own mtime (a symlink's, not its target's); 0 (the epoch: oldest) when it
    is gone or cannot be looked at."""
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _remove_empty_dirs(top: Path, budget: Budget) -> None:
    """Remove the empty directories under ``top`` and ``top``, deepest first (a directory is
    found after its parent, so the reverse order of the walk is children first)."""
    found = [entry.path for entry, st in _tree(str(top), budget) if st is None]
    for path in [*reversed(found), str(top)]:
        with contextlib.suppress(OSError):  # not empty (a writer came back), or gone
            os.rmdir(path)

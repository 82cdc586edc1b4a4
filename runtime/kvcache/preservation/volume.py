"""Edge: one scan of the snapshot volume, and carrying out a ``retention.Plan`` on it.

Every top-level directory except gpupool's state directory is a tier: gpupool's own
(``gpupool-kv-<digest>``, with an identity file whose mtime is the writers' heartbeat), or
one left by an older layout (vLLM's tree directly under the root), whose heartbeat is its
newest file. Files vanish under the scan while vLLM renames and other replicas' GCs delete:
a file gone by the time it is looked at was simply not there.
"""

from __future__ import annotations

import contextlib
import os
import re
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


def kind_of(name: str) -> FileKind:
    if name.endswith(".bin"):
        return "block"
    return "partial" if _PARTIAL.search(name) else "other"


@dataclass(frozen=True)
class Scan:
    files: tuple[TierFile, ...]
    heartbeats: dict[str, float]


def scan(root: Path) -> Scan:
    """Every regular file of every tier under ``root``, and each tier's heartbeat."""
    files: list[TierFile] = []
    heartbeats: dict[str, float] = {}
    for top in _entries(root):
        if top.name in NOT_TIERS or not top.is_dir(follow_symlinks=False):
            continue
        found = list(_files(Path(top.path), top.name))
        files += found
        identity = next((f for f in found if f.path.endswith(os.sep + IDENTITY_FILE)), None)
        newest = max((f.mtime for f in found), default=mtime(top.path))
        heartbeats[top.name] = identity.mtime if identity else newest
    return Scan(tuple(files), heartbeats)


@dataclass
class Applied:
    """What a plan did: deletions done per reason, and those that failed."""

    deleted_files: dict[Reason, int] = field(default_factory=dict)
    deleted_bytes: dict[Reason, int] = field(default_factory=dict)
    capacity_ages_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def apply(root: Path, plan: Plan) -> Applied:
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
        _remove_empty_dirs(root / tier)
    return done


def _entries(path: str | Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            yield from it
    except (FileNotFoundError, NotADirectoryError):
        return


def _files(path: Path, tier: str) -> Iterator[TierFile]:
    for entry in _entries(path):
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _files(Path(entry.path), tier)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                yield TierFile(entry.path, tier, kind_of(entry.name), st.st_size, st.st_mtime)
        except FileNotFoundError:
            continue


def mtime(path: str | Path) -> float:
    """``path``'s mtime; 0 (the epoch: oldest) when it is gone."""
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0


def _remove_empty_dirs(top: Path) -> None:
    for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):  # not empty (a writer came back), or gone
            os.rmdir(dirpath)

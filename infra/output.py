"""Edge: write a render to a directory atomically and remove what the last render left.

Each file is written to a temporary name and moved into place (``os.replace``), so a reader
never sees half a file. A manifest (``.gpupool-render``) lists the files of the last render;
files it lists that the new render lacks are removed. Files gpupool did not write are never
touched, so ``--out`` may point into a directory that holds other things.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MANIFEST = ".gpupool-render"
"""File listing what the last render wrote (one relative path a line)."""


@dataclass(frozen=True)
class WriteResult:
    """What a write changed on disk."""

    written: list[str]
    """Files whose content is new or different."""
    unchanged: list[str]
    """Files already holding exactly this content (left untouched, mtime kept)."""
    removed: list[str]
    """Stale files of the previous render, deleted."""


def write_documents(out_dir: Path, documents: Mapping[str, str]) -> WriteResult:
    """Write ``documents`` (relative path -> text) under ``out_dir``; remove stale ones."""
    for name in documents:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"refusing to write outside {out_dir}: {name}")
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = _read_manifest(out_dir)
    written, unchanged = [], []
    for name in sorted(documents):
        target = out_dir / name
        data = documents[name].encode("utf-8")
        if target.is_file() and target.read_bytes() == data:
            unchanged.append(name)
            continue
        atomic_write(target, data)
        written.append(name)
    removed = sorted(previous - documents.keys())
    for name in removed:
        (out_dir / name).unlink(missing_ok=True)
        _remove_empty_parents(out_dir, (out_dir / name).parent)
    atomic_write(out_dir / MANIFEST, "".join(f"{n}\n" for n in sorted(documents)).encode())
    return WriteResult(written, unchanged, removed)


def atomic_write(target: Path, data: bytes) -> None:
    """Write to a temporary file beside ``target``, then rename it over ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_manifest(out_dir: Path) -> set[str]:
    path = out_dir / MANIFEST
    if not path.is_file():
        return set()
    names = {line.strip() for line in path.read_text(encoding="utf-8").splitlines()}
    return {n for n in names if n and not Path(n).is_absolute() and ".." not in Path(n).parts}


def _remove_empty_parents(root: Path, folder: Path) -> None:
    while folder != root and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent

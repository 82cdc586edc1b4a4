"""Edge: write a render to a directory all-or-nothing, removing what the last render left.

The new tree is built in a hidden sibling (``.NAME.gpupool-XXXX``, same filesystem) and
swapped in whole, so a reader, a GitOps controller or a crash sees the old render or the new
one, never a mix. On Linux the swap is one ``renameat2(RENAME_EXCHANGE)``; where that call
or the filesystem lacks it, two renames (old aside, new in), which leave a moment with no
directory at all, still never a mix. A failure before the swap removes the sibling and
leaves the old directory as it was.

A manifest (``.gpupool-render``) lists the files of the last render; those the new render
lacks are not carried over (``removed``). Files gpupool did not write are carried into the
new tree as hard links (a copy where the filesystem refuses links; symlinks as symlinks;
empty folders kept), so ``--out`` may still point at a folder that holds other things.
Carrying rather than refusing keeps the guarantee the per-file writer gave, and a link
costs no bytes and keeps the inode, content and mtime. Unchanged documents are carried the
same way, so their mtime stays. Existing folders keep their mode; ownership, ACLs and
xattrs of folders are those of a new folder.

The swap needs write access to the parent folder, and ``out_dir`` may not be the current
directory or hold it (the process and the user's shell would be left in the removed tree).
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

MANIFEST = ".gpupool-render"
"""File listing what the last render wrote (one relative path a line)."""

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}


class OutputError(ValueError):
    """The render could not be written; the directory is as it was before."""


@dataclass(frozen=True)
class WriteResult:
    """What a write changed on disk."""

    written: list[str]
    """Files whose content is new or different."""
    unchanged: list[str]
    """Files already holding exactly this content (carried over, inode and mtime kept)."""
    removed: list[str]
    """Files of the previous render that this one lacks, no longer in the directory."""


def write_documents(out_dir: Path, documents: Mapping[str, str]) -> WriteResult:
    """Make ``out_dir`` hold ``documents`` (relative path -> text) and its foreign files.

    Raises OutputError (one line naming the path) with ``out_dir`` untouched on any failure.
    """
    for name in documents:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise OutputError(f"refusing to write outside {out_dir}: {name}")
    out = Path(os.path.realpath(out_dir))
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out_dir}: not a directory (a render is a folder of YAML files)")
    if Path.cwd().is_relative_to(out):
        raise OutputError(
            f"{out_dir}: is or holds the current directory, which the render would replace; "
            "write into a subfolder"
        )
    missing = [folder for folder in out.parents if not folder.exists()]
    staging: Path | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        candidate = out.with_name(f".{out.name}.gpupool-{secrets.token_hex(6)}")
        candidate.mkdir()
        staging = candidate
        result = _build(staging, out, documents, label=out_dir)
        retired = _swap(staging, out)
    except BaseException as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        for folder in missing:  # deepest first; only the empty folders this call made
            with suppress(OSError):
                folder.rmdir()
        if isinstance(exc, OSError):
            what = f"cannot swap in a new tree built beside it ({exc.filename})"
            raise _failed(out_dir, what, exc) from None
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
    return result


def _build(staging: Path, out: Path, documents: Mapping[str, str], *, label: Path) -> WriteResult:
    """Fill ``staging`` with the documents, the manifest and ``out``'s foreign files."""
    previous = _read_manifest(out)
    written, unchanged = [], []
    for name in sorted(documents):
        data = documents[name].encode("utf-8")
        old, new = out / name, staging / name
        try:
            new.parent.mkdir(parents=True, exist_ok=True)
            if old.is_file() and old.read_bytes() == data:
                _carry(old, new)
                unchanged.append(name)
            else:
                new.write_bytes(data)
                written.append(name)
        except OSError as exc:
            raise _failed(label / name, "cannot write", exc) from None
    ours = previous | documents.keys() | {MANIFEST}
    for rel in _entries(out):
        if rel not in ours:
            try:
                _carry(out / rel, staging / rel)
            except OSError as exc:
                raise _failed(
                    label / rel, "cannot keep this file gpupool did not write", exc
                ) from None
    (staging / MANIFEST).write_text("".join(f"{n}\n" for n in sorted(documents)), "utf-8")
    for root, _dirs, _files in os.walk(staging):
        before = out / Path(root).relative_to(staging)
        if before.is_dir() and not before.is_symlink():
            shutil.copymode(before, root)
    removed = sorted(n for n in previous - documents.keys() if os.path.lexists(out / n))
    return WriteResult(written, unchanged, removed)


def _entries(root: Path) -> list[str]:
    """Every file, symlink and empty folder under ``root`` (relative, ``/``-separated)."""
    found = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder).relative_to(root)
        links = [d for d in dirs if (Path(folder) / d).is_symlink()]  # os.walk does not enter
        found += [(base / name).as_posix() for name in files + links]
        if not dirs and not files and folder != str(root):
            found.append(base.as_posix())
    return found


def _carry(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` in the new tree: a hard link (same inode), a copy where links are
    refused (another filesystem mounted below), a symlink as a symlink, a folder as a folder."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        dst.mkdir()
    else:
        try:
            os.link(src, dst)
        except OSError:
            if not src.is_file():
                raise
            shutil.copy2(src, dst)


def _failed(path: Path, what: str, exc: OSError) -> OutputError:
    """One line: the path the user named, what failed, the system's reason."""
    return OutputError(f"{path}: {what}: {exc.strerror}; nothing written")


def _swap(staging: Path, out: Path) -> Path | None:
    """Put ``staging`` at ``out``; return the path now holding the old tree (to remove)."""
    if not out.exists():
        os.rename(staging, out)
        return None
    if exchange(staging, out):
        return staging
    return replace_by_renames(staging, out)


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    False where the C library or the filesystem does not offer it (the caller falls back).
    """
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(b))


def replace_by_renames(staging: Path, out: Path) -> Path:
    """The fallback swap: ``out`` aside, ``staging`` in (``out`` briefly absent, never mixed).

    Returns the path holding the old tree; puts it back if the second rename fails.
    """
    aside = staging.with_name(staging.name + ".old")
    os.rename(out, aside)
    try:
        os.rename(staging, out)
    except BaseException:
        os.rename(aside, out)
        raise
    return aside


def _read_manifest(out_dir: Path) -> set[str]:
    path = out_dir / MANIFEST
    if not path.is_file():
        return set()
    names = {line.strip() for line in path.read_text(encoding="utf-8").splitlines()}
    return {n for n in names if n and not Path(n).is_absolute() and ".." not in Path(n).parts}

"""Edge: every file gpupool writes, written so a reader, a crash, Ctrl-C or a full disk sees
the old set of files or the new one, never a mix, and never loses a file it did not write.

Everything is built in a hidden staging folder (``STAGING``) beside the outputs, on
their filesystem, each file fsynced, then put in place by renames: one file by
``rename``, a folder by ``renameat2(RENAME_EXCHANGE)`` (two renames where the filesystem
lacks it), several files by a commit record written first and one ``rename`` each. A
failure or an interrupt before that point removes the staging folder; from it on, the set
is new: SIGINT is held until the renames are done (the command exits 0), and a SIGKILL in
the renames is finished by the next write into that folder, which reads the record
(``clean_leftovers``). A live writer holds a lock on its staging folder, so a concurrent
run never takes its files for leftovers.

Files get the mode a plain ``open()`` gives: an existing file's mode (and owner, where
allowed), else 0666 less the umask. Folders: an existing one keeps its mode, a new one is
``mkdir``'s. Nothing is moved or removed across a mount point: an output folder that is or
holds one is refused, and removing the retired tree never leaves its filesystem.

``check_outputs`` refuses, before any long work, an output equal to or holding an input,
outputs at one path or inside each other, a path through a file or a missing folder, and
an output whose folder cannot be written. docs/design/outputs.md has the reasons.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from runtime.fs_steps import (
    exchange,
    fsync_dir,
    held_interrupts,
    lock,
    locked,
    remove_tree,
    replace_by_renames,
)

STAGING = ".gpupool-staging-"
"""Prefix of a staging folder (and 12 hex digits) beside the outputs."""
_RECORD, _LEADER, _TREE = "commit", "leader", "tree"
_WRITTEN: list[Path] = []


class OutputError(ValueError):
    """An output could not be written or is refused; the old files are as they were."""


class Foreign(Enum):
    """What a folder write does with files in the folder it did not write."""

    KEEP = "keep"
    """Carry them into the new folder as hard links (``render``)."""
    REFUSE = "refuse"
    """Refuse the folder (``advise``: a new, empty or earlier output folder only)."""


@dataclass(frozen=True)
class FolderResult:
    """What a folder write changed on disk."""

    written: list[str]
    """Files whose content is new or different."""
    unchanged: list[str]
    """Files already holding exactly this content (carried over, inode and mtime kept)."""
    removed: list[str]
    """Files of the previous write that this one lacks, no longer in the folder."""


def write_atomic(path: Path, text: str) -> None:
    """Replace one file whole (a set of one)."""
    write_files({path: text.encode("utf-8")})


def check_outputs(files: Iterable[Path], inputs: Iterable[Path] = ()) -> None:
    """Refuse, with one line and nothing written, outputs that would destroy an input or each
    other, or whose folder cannot take a file (not creatable, read-only). A check announces
    more outputs to come, so the outputs already written no longer end the command
    (``written``)."""
    _WRITTEN.clear()
    outs = list(files)
    sources = [(s, Path(os.path.realpath(s))) for s in inputs]
    seen: dict[Path, Path] = {}
    for out in outs:
        _check_through_folders(out)
        path = Path(os.path.realpath(out))
        if path in seen:
            raise OutputError(f"{out}: named twice as an output (also {seen[path]})")
        for other, first in seen.items():
            if path.is_relative_to(other) or other.is_relative_to(path):
                raise OutputError(f"{out}: overlaps the output {first}; name another path")
        seen[path] = out
        for source, src in sources:
            if path == src:
                raise OutputError(f"{out}: is an input of this command; name another path")
            if src.is_relative_to(path):
                raise OutputError(f"{out}: holds the input {source}; name another path")
        _check_folder_writable(out, path.parent)


def _check_through_folders(out: Path) -> None:
    """Each existing step of ``out`` as given must be a folder, and the step before a ``..``
    must exist (``file/..`` and ``missing/..`` name no path, whatever ``realpath`` says)."""
    parts = out.parts
    step, rest = (Path(parts[0]), parts[1:]) if out.is_absolute() else (Path(), parts)
    for part in rest:
        if (part == ".." and not os.path.isdir(step)) or (
            os.path.lexists(step) and not os.path.isdir(step)
        ):
            raise OutputError(f"{out}: {step} is not a folder")
        step = step / part


def _check_folder_writable(out: Path, folder: Path) -> None:
    """The nearest existing folder of ``folder`` must be a folder this process may write."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{out}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        reason = "read-only filesystem" if _read_only(existing) else "permission denied"
        raise OutputError(f"{out}: cannot write in {existing} ({reason}); nothing written")


def _read_only(folder: Path) -> bool:
    return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)


def check_files(files: Iterable[Path], inputs: Iterable[Path] = ()) -> None:
    """``check_outputs`` for files: none may be a folder."""
    outs = list(files)
    for out in outs:
        if os.path.isdir(out):
            raise OutputError(f"{out}: is a folder; name a file")
    check_outputs(outs, inputs)


def write_files(files: Mapping[Path, bytes], inputs: Iterable[Path] = ()) -> None:
    """Replace every file of ``files`` (path -> content) as one set: all old or all new."""
    check_files(files, inputs)
    targets = {Path(os.path.realpath(p)): (p, data) for p, data in files.items()}
    folders = sorted({t.parent for t in targets})
    for folder in folders:
        clean_leftovers(folder)
    made = _make_folders(folders)
    with _staging(folders, made) as stages:
        pairs = []
        for target, (label, data) in targets.items():
            staged = stages.dirs[target.parent] / target.name
            _create(staged, data, like=target, label=label)
            pairs.append((staged, target))
        for stage in stages.dirs.values():
            fsync_dir(stage)
        if len(pairs) > 1:
            _write_record(stages.dirs[folders[0]], pairs)
        stages.commit(recorded=len(pairs) > 1)
        for staged, target in pairs:
            os.replace(staged, target)
        for folder in folders:
            fsync_dir(folder)
    _WRITTEN.extend(label for label, _ in targets.values())


def written() -> tuple[Path, ...]:
    """The outputs put in place since the last check (``check_outputs``), in order: when an
    interrupt comes after them and before another check, it cut only the command's closing
    lines, and its work is done."""
    return tuple(_WRITTEN)


def write_folder(
    out: Path,
    files: Mapping[str, bytes],
    *,
    manifest: str,
    foreign: Foreign,
    inputs: Iterable[Path] = (),
) -> FolderResult:
    """Make ``out`` hold ``files`` (relative path -> content), a ``manifest`` listing them
    and, with ``Foreign.KEEP``, the files of ``out`` that the last write did not list."""
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts or name == manifest:
            raise OutputError(f"refusing to write outside {out}: {name}")
    check_folder(out, manifest=manifest, foreign=foreign, inputs=inputs)
    real = Path(os.path.realpath(out))
    clean_leftovers(real.parent, legacy=real.name)
    made = _make_folders([real.parent])
    with _staging([real.parent], made) as stages:
        tree = stages.dirs[real.parent] / _TREE
        tree.mkdir()
        result = _build(tree, real, files, manifest=manifest, label=out)
        fsync_dir(stages.dirs[real.parent])
        stages.commit(recorded=False)  # a failed swap leaves the old folder, the new is dropped
        if not real.exists():
            os.rename(tree, real)
        elif not exchange(tree, real):
            replace_by_renames(tree, real)
        fsync_dir(real.parent)
    _WRITTEN.append(out)
    return result


def check_folder(
    out: Path, *, manifest: str, foreign: Foreign, inputs: Iterable[Path] = ()
) -> None:
    """Refuse ``out`` before any long work: not a folder, a mount point or holding one, the
    current directory or holding it, an input's, foreign files with ``Foreign.REFUSE``."""
    check_outputs([out], inputs)
    if not out.exists():
        return
    if not out.is_dir():  # a symlink to a folder is followed: the folder it names is replaced
        raise OutputError(f"{out}: not a folder (this command writes a folder of files)")
    real = Path(os.path.realpath(out))
    if Path.cwd().resolve().is_relative_to(real):
        raise OutputError(
            f"{out}: is or holds the current directory, which the write would replace; "
            "name a subfolder"
        )
    if os.path.ismount(real):
        raise OutputError(
            f"{out}: is a mount point; the folder is replaced whole, so name a folder inside it"
        )
    device = os.lstat(real).st_dev
    for folder, dirs, _files in os.walk(real):
        for name in dirs:
            path = Path(folder) / name
            if os.lstat(path).st_dev != device or os.path.ismount(path):
                shown = out / path.relative_to(real)
                raise OutputError(
                    f"{out}: holds the mount point {shown}; the folder is replaced whole, "
                    "so unmount it or name another folder"
                )
    entries = sorted(p.name for p in real.iterdir())
    if foreign is Foreign.REFUSE and entries and manifest not in entries:
        listed = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutputError(
            f"{out}: holds files gpupool did not write ({listed}); name a new or empty folder"
        )


def clean_leftovers(folder: Path, *, legacy: str | None = None) -> None:
    """Remove what killed writes left in ``folder``, first finishing a set whose commit
    record was written. ``legacy``: also the ``.NAME.gpupool-*`` siblings earlier versions
    staged that folder in. A staging folder a live writer holds is left alone."""
    if not folder.is_dir():
        return
    for entry in sorted(folder.iterdir()):
        name = entry.name
        ours = name.startswith(STAGING) or (
            legacy is not None and name.startswith(f".{legacy}.gpupool-")
        )
        if not ours or entry.is_symlink() or not entry.is_dir():
            continue
        with locked(entry) as free:
            if free and name.startswith(STAGING):
                _recover(entry)
            elif free:
                remove_tree(entry)


def _recover(stage: Path) -> None:
    """Finish ``stage``'s set where its commit record was written; then remove it."""
    leader = stage
    with suppress(OSError):
        leader = Path(os.fsdecode((stage / _LEADER).read_bytes()))
    record = leader / _RECORD
    pairs = []
    if leader.name.startswith(STAGING) and _regular(record) is not None:
        for line in record.read_text("utf-8").splitlines():
            staged, _, target = (Path(part) for part in line.partition("\t"))
            if staged.parent.name.startswith(STAGING) and staged.parent.parent == target.parent:
                pairs.append((staged, target))
    for staged, target in pairs:
        if os.path.lexists(staged):
            os.replace(staged, target)
    for folder in {staged.parent for staged, _ in pairs} - {leader}:
        remove_tree(folder)
    remove_tree(leader if pairs else stage)
    remove_tree(stage)


@dataclass
class _Stages:
    """The locked staging folder of each output folder, and the set's commit point."""

    dirs: dict[Path, Path]
    hold: ExitStack
    interrupted: Callable[[], bool] = lambda: False
    recorded: bool = False
    """A commit record is on disk: on a failure the staging folders stay to be finished."""

    def commit(self, *, recorded: bool) -> None:
        """From here on the set is new: SIGINT is noted, not raised, until the end."""
        self.interrupted = self.hold.enter_context(held_interrupts())
        self.recorded = recorded


@contextmanager
def _staging(folders: list[Path], made: list[Path]) -> Iterator[_Stages]:
    """A locked staging folder in each of ``folders``, removed on leaving. A failure also
    removes the folders this write made (``made``, deepest first), unless a commit record
    was written: then the staging folders stay for the next run to finish. OSError ->
    OutputError."""
    token = secrets.token_hex(6)
    locks: list[int] = []
    with ExitStack() as hold:
        stages = _Stages({}, hold)
        try:
            for folder in folders:
                stage = folder / f"{STAGING}{token}"
                stage.mkdir()
                stages.dirs[folder] = stage
                locks.append(lock(stage))
                if folder != folders[0]:
                    leader = os.fsencode(stages.dirs[folders[0]])
                    _create(stage / _LEADER, leader, like=None)
            yield stages
        except BaseException as exc:
            if not stages.recorded:
                for stage in stages.dirs.values():
                    remove_tree(stage)
                for path in made:
                    with suppress(OSError):
                        path.rmdir()
            if isinstance(exc, OSError) and stages.recorded:
                raise OutputError(
                    f"{exc.filename}: cannot write: {exc.strerror}; the new files wait beside "
                    "it and the next write into that folder puts them in place"
                ) from None
            if isinstance(exc, OSError):
                raise OutputError(_line(exc)) from None
            raise
        else:
            for stage in stages.dirs.values():
                remove_tree(stage, stop=stages.interrupted)
        finally:
            for fd in locks:
                os.close(fd)


def _line(exc: OSError) -> str:
    """One line naming the path and the system's reason."""
    if isinstance(exc, _Labelled):
        return str(exc)
    return f"{exc.filename}: cannot write: {exc.strerror}; nothing written"


class _Labelled(OSError):
    """An OSError whose message already names the user's path."""


def _make_folders(folders: list[Path]) -> list[Path]:
    """Create the missing ``folders``; return those made, deepest first."""
    made: list[Path] = []
    for folder in folders:
        missing = [f for f in (folder, *folder.parents) if not f.exists()]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{folder}: cannot create: {exc.strerror}; nothing written") from None
        made += missing
    return sorted(set(made), key=lambda p: len(p.parts), reverse=True)


def _create(path: Path, data: bytes, *, like: Path | None, label: Path | None = None) -> None:
    """Write ``data`` to the new file ``path``, fsynced, with the mode (and owner) ``like``
    has as a regular file, else the one ``open()`` gives (0666 less the umask)."""
    old = _regular(like)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            if old is not None:
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
                with suppress(PermissionError):
                    os.fchown(fd, old.st_uid, old.st_gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        shown = label if label is not None else path
        raise _Labelled(f"{shown}: cannot write: {exc.strerror}; nothing written") from None


def _regular(path: Path | None) -> os.stat_result | None:
    if path is None:
        return None
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return found if stat.S_ISREG(found.st_mode) else None


def _write_record(stage: Path, pairs: list[tuple[Path, Path]]) -> None:
    """The commit point of several files: a record naming each staged file and its target,
    renamed into place so the next run finds it whole or not at all."""
    text = "".join(f"{staged}\t{target}\n" for staged, target in pairs)
    _create(stage / f"{_RECORD}.part", text.encode("utf-8"), like=None)
    os.rename(stage / f"{_RECORD}.part", stage / _RECORD)
    fsync_dir(stage)


def _build(
    tree: Path, out: Path, files: Mapping[str, bytes], *, manifest: str, label: Path
) -> FolderResult:
    """Fill ``tree`` with the files, the manifest and ``out``'s files the last write did not
    list (hard links: same inode, nothing copied, nothing foreign ever removed)."""
    previous = _read_manifest(out / manifest)
    written, unchanged = [], []
    for name in sorted(files):
        data = files[name]
        old, new = out / name, tree / name
        try:
            new.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _Labelled(
                f"{label / name}: cannot write: {exc.strerror}; nothing written"
            ) from None
        if _regular(old) is not None and old.read_bytes() == data:
            _carry(old, new, label=label / name)
            unchanged.append(name)
        else:
            _create(new, data, like=old, label=label / name)
            written.append(name)
    ours = previous | files.keys() | {manifest}
    for rel in _entries(out):
        if rel not in ours:
            _carry(out / rel, tree / rel, label=label / rel)
    listing = "".join(f"{n}\n" for n in sorted(files)).encode("utf-8")
    _create(tree / manifest, listing, like=out / manifest, label=label / manifest)
    for root, _dirs, _files in os.walk(tree):
        before = out / Path(root).relative_to(tree)
        if before.is_dir() and not before.is_symlink():
            os.chmod(root, stat.S_IMODE(before.stat().st_mode))
        fsync_dir(Path(root))
    removed = sorted(n for n in previous - files.keys() if os.path.lexists(out / n))
    return FolderResult(written, unchanged, removed)


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


def _carry(src: Path, dst: Path, *, label: Path) -> None:
    """Put ``src`` at ``dst`` in the new tree: a hard link, a symlink as a symlink, a folder
    as a folder. A refused link refuses the write (a copy would remove the original)."""
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():
            dst.mkdir()
        else:
            os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        raise _Labelled(
            f"{label}: cannot keep this file gpupool did not write: {exc.strerror}; nothing written"
        ) from None


def _read_manifest(path: Path) -> set[str]:
    if _regular(path) is None:
        return set()
    names = {line.strip() for line in path.read_text(encoding="utf-8").splitlines()}
    return {n for n in names if n and not Path(n).is_absolute() and ".." not in Path(n).parts}

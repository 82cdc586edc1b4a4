"""Edge: write the advisor's folder all-or-nothing.

The files are written into a hidden sibling and renamed into place, so an interrupted or
failed run leaves no partial folder. The folder must be new, empty, or an earlier advise
output (marked by ``MARKER``), which is replaced whole; a folder holding anything else is
refused before the sweep starts.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

MARKER = ".gpupool-advise"
"""File that marks a folder as an advise output (lists the files it wrote)."""


class FolderError(ValueError):
    """The folder cannot take the output; one line naming it."""


def check_folder(out: Path) -> None:
    """Refuse ``out`` unless it is absent, empty, or an earlier advise output."""
    if not out.exists():
        return
    if not out.is_dir() or out.is_symlink():
        raise FolderError(f"{out}: not a folder (advise writes a folder of files)")
    entries = sorted(p.name for p in out.iterdir())
    if entries and MARKER not in entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise FolderError(
            f"{out}: holds files advise did not write ({shown}); name a new or empty folder"
        )
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise FolderError(f"{out}: is or holds the current directory; name another folder")


def write_folder(out: Path, files: Mapping[str, bytes]) -> None:
    """Make ``out`` hold exactly ``files`` (relative path -> bytes) and the marker."""
    check_folder(out)
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise FolderError(f"refusing to write outside {out}: {name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.gpupool-{secrets.token_hex(6)}")
    retired: Path | None = None
    try:
        staging.mkdir()
        for name, data in files.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        (staging / MARKER).write_text("".join(f"{n}\n" for n in sorted(files)), "utf-8")
        if out.exists():
            retired = out.with_name(f".{out.name}.gpupool-old-{secrets.token_hex(6)}")
            os.rename(out, retired)
        os.rename(staging, out)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if retired is not None and not out.exists():
            with suppress(OSError):
                os.rename(retired, out)
        if isinstance(exc, OSError):
            raise FolderError(f"{out}: cannot write ({exc.strerror})") from None
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)

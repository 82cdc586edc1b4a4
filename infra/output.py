"""Edge: a render on disk, written by ``runtime.atomic_file.write_folder``: the folder is
replaced whole (old render or new, never a mix), files gpupool did not write are kept as
hard links, and ``MANIFEST`` lists what this render wrote so the next one removes only
those."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from runtime.atomic_file import FolderResult, Foreign, OutputError, write_folder

MANIFEST = ".gpupool-render"
"""File listing what the last render wrote (one relative path a line)."""

__all__ = ["MANIFEST", "FolderResult", "OutputError", "write_documents"]


def write_documents(
    out_dir: Path, documents: Mapping[str, str], inputs: Iterable[Path] = ()
) -> FolderResult:
    """Make ``out_dir`` hold ``documents`` (relative path -> text) and its foreign files.

    Raises OutputError (one line naming the path) with ``out_dir`` untouched on any failure.
    """
    files = {name: text.encode("utf-8") for name, text in documents.items()}
    return write_folder(out_dir, files, manifest=MANIFEST, foreign=Foreign.KEEP, inputs=inputs)

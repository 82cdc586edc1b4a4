"""Edge: the advisor's folder, written by ``runtime.atomic_file.write_folder``: new, empty
or an earlier advise output (marked by ``MARKER``), replaced whole; a folder holding
anything else is refused before the sweep starts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from runtime import atomic_file
from runtime.atomic_file import Foreign

MARKER = ".gpupool-advise"
"""File that marks a folder as an advise output (lists the files it wrote)."""

FolderError = atomic_file.OutputError
"""The folder cannot take the output; one line naming it."""


def check_folder(out: Path, inputs: Iterable[Path] = ()) -> None:
    """Refuse ``out`` unless it is absent, empty or an earlier advise output (and no input)."""
    atomic_file.check_folder(out, manifest=MARKER, foreign=Foreign.REFUSE, inputs=inputs)


def write_folder(out: Path, files: Mapping[str, bytes], inputs: Iterable[Path] = ()) -> None:
    """Make ``out`` hold exactly ``files`` (relative path -> bytes) and the marker."""
    atomic_file.write_folder(out, files, manifest=MARKER, foreign=Foreign.REFUSE, inputs=inputs)

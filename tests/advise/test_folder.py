"""The advisor's folder: written whole or not at all, never over someone else's files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import atomic_file
from runtime.advise.folder import MARKER, FolderError, check_folder, write_folder

FILES = {"advise.md": b"# a\n", "models/m.json": b"{}", "pareto.png": b"\x89PNG"}


def _interrupt_on_second_write(monkeypatch: pytest.MonkeyPatch) -> None:
    real = atomic_file._create
    calls: list[Path] = []

    def create(path: Path, data: bytes, **kwargs: Any) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(path, data, **kwargs)

    monkeypatch.setattr(atomic_file, "_create", create)


def test_a_new_folder_holds_the_files_and_the_marker(tmp_path: Path) -> None:
    out = tmp_path / "advice"
    write_folder(out, FILES)
    found = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert found == {**FILES, MARKER: b"advise.md\nmodels/m.json\npareto.png\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["advice"]


def test_an_interrupted_write_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupt_on_second_write(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        write_folder(tmp_path / "advice", FILES)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_rewrite_keeps_the_earlier_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "advice"
    write_folder(out, {"advise.md": b"old"})
    _interrupt_on_second_write(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        write_folder(out, FILES)
    assert (out / "advise.md").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["advice"]


@pytest.mark.parametrize(
    ("prepare", "message"),
    [
        (
            lambda out: (out.mkdir(), (out / "mine.txt").write_text("x")),
            "holds files gpupool did not write (mine.txt)",
        ),
        (lambda out: out.write_text("x"), "not a folder"),
    ],
)
def test_a_folder_that_is_not_advises_is_refused(
    tmp_path: Path, prepare: object, message: str
) -> None:
    out = tmp_path / "advice"
    prepare(out)  # type: ignore[operator]
    with pytest.raises(FolderError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_folder(out)
    with pytest.raises(FolderError):
        write_folder(out, FILES)


def test_names_outside_the_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FolderError, match="refusing to write outside"):
        write_folder(tmp_path / "advice", {"../escape": b"x"})
    assert list(tmp_path.iterdir()) == []

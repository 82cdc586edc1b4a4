"""``write_documents`` replaces the directory whole: never a mix, foreign files kept, failures
leave the old tree and no sibling behind."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from infra.output import MANIFEST, OutputError, write_documents
from runtime.fs_steps import exchange, replace_by_renames

OLD = {"kustomization.yaml": "resources: []\n", "ns/a.yaml": "a: 1\n", "ns/b.yaml": "b: 1\n"}
NEW = {"kustomization.yaml": "resources: []\n", "ns/a.yaml": "a: 2\n", "other/c.yaml": "c: 1\n"}


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: file bytes, symlink targets, empty folders."""
    entries: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            entries[rel] = f"-> {os.readlink(path)}"
        elif path.is_file():
            entries[rel] = path.read_bytes()
        elif not any(path.iterdir()):
            entries[rel] = "<empty folder>"
    return entries


def _old_render(tmp_path: Path) -> Path:
    out = tmp_path / "build"
    write_documents(out, OLD)
    return out


def test_the_directory_is_swapped_whole_and_accounted(tmp_path: Path) -> None:
    out = _old_render(tmp_path)
    kept = os.stat(out / "kustomization.yaml")
    before = os.open(out, os.O_RDONLY)  # a reader holding the old tree
    try:
        result = write_documents(out, NEW)
        # the old directory was replaced, not edited in place, and is gone
        assert os.fstat(before).st_ino != os.stat(out).st_ino
        assert os.fstat(before).st_nlink == 0
    finally:
        os.close(before)
    assert (result.written, result.unchanged, result.removed) == (
        ["ns/a.yaml", "other/c.yaml"],
        ["kustomization.yaml"],
        ["ns/b.yaml"],
    )
    assert _tree(out) == {
        MANIFEST: b"kustomization.yaml\nns/a.yaml\nother/c.yaml\n",
        **{name: text.encode() for name, text in NEW.items()},
    }
    now = os.stat(out / "kustomization.yaml")  # unchanged: the same inode, mtime kept
    assert (now.st_ino, now.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]  # no sibling left


def test_files_gpupool_did_not_write_are_carried_over(tmp_path: Path) -> None:
    out = _old_render(tmp_path)
    (out / "README.md").write_text("not gpupool's\n")
    (out / "ns/notes.txt").write_text("mine\n")
    (out / "empty").mkdir()
    (out / "link").symlink_to("README.md")
    (out / "ns").chmod(0o750)
    readme = os.stat(out / "README.md").st_ino
    write_documents(out, {"other/c.yaml": "c: 1\n"})
    assert _tree(out) == {
        MANIFEST: b"other/c.yaml\n",
        "README.md": b"not gpupool's\n",
        "empty": "<empty folder>",
        "link": "-> README.md",
        "ns/notes.txt": b"mine\n",
        "other/c.yaml": b"c: 1\n",
    }
    assert os.stat(out / "README.md").st_ino == readme  # a hard link, not a copy
    assert (out / "ns").stat().st_mode & 0o777 == 0o750


def test_a_folder_left_empty_by_stale_files_disappears(tmp_path: Path) -> None:
    out = _old_render(tmp_path)
    result = write_documents(out, {"kustomization.yaml": "resources: []\n"})
    assert result.removed == ["ns/a.yaml", "ns/b.yaml"]
    assert not (out / "ns").exists()


class _Failing(Mapping[str, str]):
    """Documents whose second text cannot be produced (an error in the middle of a build)."""

    def __init__(self, documents: dict[str, str]) -> None:
        self.documents = documents

    def __getitem__(self, name: str) -> str:
        if name == sorted(self.documents)[1]:
            raise RuntimeError("render failed half-way")
        return self.documents[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.documents)

    def __len__(self) -> int:
        return len(self.documents)


@pytest.mark.parametrize(
    ("documents", "error", "message"),
    [
        ({**NEW, "ns/" + "x" * 300 + ".yaml": "x: 1\n"}, OutputError, "File name too long"),
        ({**NEW, "ns/a.yaml/inner.yaml": "x: 1\n"}, OutputError, "File exists"),
        (_Failing(NEW), RuntimeError, "render failed half-way"),
    ],
    ids=["unwritable name", "file used as folder", "exception mid-build"],
)
def test_a_failed_build_leaves_the_old_tree_and_no_sibling(
    tmp_path: Path, documents: Mapping[str, str], error: type[Exception], message: str
) -> None:
    out = _old_render(tmp_path)
    (out / "README.md").write_text("not gpupool's\n")
    before, inode = _tree(out), os.stat(out).st_ino
    with pytest.raises(error, match=message) as caught:
        write_documents(out, documents)
    if error is OutputError:  # one line naming the document under the path the user gave
        assert str(caught.value).startswith(f"{out}/ns/")
        assert str(caught.value).endswith("; nothing written")
        assert "\n" not in str(caught.value)
    assert _tree(out) == before
    assert os.stat(out).st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]


def test_a_failed_first_build_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="too long"):
        write_documents(tmp_path / "a/b/build", {"x" * 300: "x: 1\n"})
    assert not any(tmp_path.iterdir())  # not even the parent folders it made


def test_out_naming_a_file_is_one_line_and_touches_nothing(tmp_path: Path) -> None:
    target = tmp_path / "build"
    target.write_text("keep\n")
    with pytest.raises(OutputError) as caught:
        write_documents(target, NEW)
    assert str(caught.value) == f"{target}: not a folder (this command writes a folder of files)"
    assert target.read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]


def test_the_current_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _old_render(tmp_path)
    monkeypatch.chdir(out / "ns")
    with pytest.raises(OutputError, match="holds the current directory"):
        write_documents(out, NEW)
    assert (out / "ns/b.yaml").is_file()


def test_paths_outside_the_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="refusing to write outside"):
        write_documents(tmp_path / "out", {"../escape.yaml": "x: 1\n"})
    assert not any(tmp_path.iterdir())


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    new, old = tmp_path / "new", tmp_path / "old"
    for folder in (new, old):
        folder.mkdir()
        (folder / "which").write_text(folder.name)
    return new, old


def test_exchange_swaps_two_directories_in_one_step(tmp_path: Path) -> None:
    new, old = _pair(tmp_path)
    assert exchange(new, old)  # Linux, glibc >= 2.28, ext4/tmpfs/overlayfs: supported
    assert ((old / "which").read_text(), (new / "which").read_text()) == ("new", "old")


def test_the_two_rename_fallback_swaps_and_returns_the_old_tree(tmp_path: Path) -> None:
    new, old = _pair(tmp_path)
    retired = replace_by_renames(new, old)
    assert (old / "which").read_text() == "new"
    assert (retired / "which").read_text() == "old"
    assert not new.exists()


def test_the_fallback_puts_the_old_tree_back_when_the_second_rename_fails(tmp_path: Path) -> None:
    _new, old = _pair(tmp_path)
    with pytest.raises(FileNotFoundError):
        replace_by_renames(tmp_path / "missing", old)
    assert (old / "which").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "old"]

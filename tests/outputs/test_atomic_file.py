"""The one output writer: sets all old or all new, modes per umask, inputs and mounts safe,
leftovers of killed runs finished or removed, Ctrl-C after the commit not a failure.

Filesystem faults are real where the machine allows: a full disk is a small tmpfs, a
read-only folder a read-only tmpfs, a mount point a tmpfs mounted inside the output folder
(``tests.harness.mounts``; these skip without CAP_SYS_ADMIN). Kills are real SIGKILLs of a
child process (``test_fault_injection``).
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import atomic_file
from runtime.atomic_file import (
    STAGING,
    Foreign,
    OutputError,
    check_outputs,
    clean_leftovers,
    write_files,
    write_folder,
)
from tests.harness.mounts import remount, tmpfs

MANIFEST = ".test-manifest"


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_new_files_get_the_umask_and_existing_ones_keep_their_mode(
    tmp_path: Path, umask_027: None
) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    kept.chmod(0o604)
    write_files({tmp_path / "new.md": b"new", kept: b"new", tmp_path / "sub/x.png": b"x"})
    assert _mode(tmp_path / "new.md") == 0o640  # 0666 less the umask, as open() gives
    assert _mode(kept) == 0o604  # a plain write keeps an existing file's mode
    assert _mode(tmp_path / "sub") == 0o750  # mkdir's, under the umask
    out = tmp_path / "render"
    write_folder(out, {"a/b.yaml": b"x"}, manifest=MANIFEST, foreign=Foreign.KEEP)
    assert (_mode(out), _mode(out / "a"), _mode(out / "a/b.yaml")) == (0o750, 0o750, 0o640)
    (out / "a/b.yaml").chmod(0o644)
    write_folder(out, {"a/b.yaml": b"y"}, manifest=MANIFEST, foreign=Foreign.KEEP)
    assert _mode(out / "a/b.yaml") == 0o644


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("policy/pool.yaml", "is an input of this command"),
        ("policy", "holds the input"),
        (".", "holds the input"),
        ("policy/pool.yaml/x", "policy/pool.yaml is not a folder"),  # inside an input file
        ("link/pool.yaml", "is an input of this command"),  # through a symlink
        ("other/../policy/pool.yaml", "is an input of this command"),
    ],
)
def test_an_output_touching_an_input_is_refused_and_nothing_written(
    tmp_path: Path, output: str, message: str
) -> None:
    (tmp_path / "policy").mkdir()
    (tmp_path / "other").mkdir()
    policy = tmp_path / "policy/pool.yaml"
    policy.write_text("cluster: {}\n")
    (tmp_path / "link").symlink_to("policy")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(OutputError, match=message) as caught:
        if (tmp_path / output).is_dir():  # a render's or advise's folder
            write_folder(
                tmp_path / output,
                {"a": b"x"},
                manifest=MANIFEST,
                foreign=Foreign.KEEP,
                inputs=[policy],
            )
        else:
            write_files({tmp_path / output: b"x"}, inputs=[policy])
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(str(tmp_path / output))
    assert sorted(tmp_path.rglob("*")) == before
    assert policy.read_text() == "cluster: {}\n"


def test_two_outputs_at_one_path_are_refused(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    with pytest.raises(OutputError, match="named twice as an output"):
        check_outputs([tmp_path / "r.md", tmp_path / "x/../r.md"])


@pytest.mark.process
def test_a_read_only_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", size_kib=64) as folder:
        (folder / "report.md").write_text("old")
        remount(folder, "ro")
        with pytest.raises(OutputError) as caught:
            check_outputs([folder / "report.md", folder / "new/plot.png"])
        assert str(caught.value) == (
            f"{folder / 'report.md'}: cannot write in {folder} (read-only filesystem); "
            "nothing written"
        )
        assert (folder / "report.md").read_text() == "old"


@pytest.mark.process
def test_a_full_disk_keeps_the_old_set_and_leaves_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", size_kib=256) as folder:
        old = {folder / "report.md": b"old report", folder / "img/plot.png": b"old plot"}
        write_files(old)
        new = {folder / "report.md": b"new", folder / "img/plot.png": b"x" * 400_000}
        with pytest.raises(OutputError) as caught:
            write_files(new)
        assert str(caught.value).endswith("No space left on device; nothing written")
        assert str(caught.value).startswith(str(folder / "img/plot.png"))
        assert {p: p.read_bytes() for p in old} == old
        assert sorted(p.name for p in folder.rglob("*")) == ["img", "plot.png", "report.md"]


@pytest.mark.process
def test_a_folder_holding_a_mount_point_is_refused_and_the_mount_untouched(
    tmp_path: Path,
) -> None:
    out = tmp_path / "build"
    write_folder(out, {"a.yaml": b"a"}, manifest=MANIFEST, foreign=Foreign.KEEP)
    with tmpfs(out / "data" / "disk", size_kib=64) as disk:
        (disk / "precious").write_text("keep me")
        with pytest.raises(OutputError) as caught:
            write_folder(out, {"a.yaml": b"b"}, manifest=MANIFEST, foreign=Foreign.KEEP)
        assert str(caught.value) == (
            f"{out}: holds the mount point {out / 'data/disk'}; the folder is replaced whole, "
            "so unmount it or name another folder"
        )
        assert (disk / "precious").read_text() == "keep me"
        assert (out / "a.yaml").read_text() == "a"
        with pytest.raises(OutputError, match="is a mount point"):
            write_folder(disk, {"a.yaml": b"b"}, manifest=MANIFEST, foreign=Foreign.KEEP)
        assert sorted(p.name for p in disk.iterdir()) == ["precious"]


@pytest.mark.process
def test_removing_a_tree_never_leaves_its_filesystem(tmp_path: Path) -> None:
    """A mount appearing in a retired tree (after the check) keeps its files."""
    tree = tmp_path / "retired"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub/old.yaml").write_text("x")
    with tmpfs(tree / "sub/disk", size_kib=64) as disk:
        (disk / "precious").write_text("keep me")
        atomic_file.remove_tree(tree)
        assert (disk / "precious").read_text() == "keep me"
        assert not (tree / "sub/old.yaml").exists()


def test_a_live_writers_staging_folder_is_left_alone(tmp_path: Path) -> None:
    stage = tmp_path / f"{STAGING}0123456789ab"
    stage.mkdir()
    (stage / "report.md").write_text("half")
    fd = os.open(stage, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: as another process's lock
        clean_leftovers(tmp_path)
        assert (stage / "report.md").exists()
    finally:
        os.close(fd)
    clean_leftovers(tmp_path)
    assert not stage.exists()


def test_a_committed_set_is_finished_by_the_next_write(tmp_path: Path) -> None:
    """The state a SIGKILL between two renames leaves: record written, one file moved."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "out").write_text("old")
    lead, follow = a / f"{STAGING}aaaaaaaaaaaa", b / f"{STAGING}aaaaaaaaaaaa"
    lead.mkdir()
    follow.mkdir()
    (follow / "leader").write_bytes(os.fsencode(lead))
    (follow / "out").write_text("new")
    (lead / "commit").write_text(f"{lead / 'out'}\t{a / 'out'}\n{follow / 'out'}\t{b / 'out'}\n")
    (a / "out").write_text("new")  # the first rename happened
    write_files({b / "other": b"x"})  # any later write into b finishes the set
    assert ((a / "out").read_text(), (b / "out").read_text()) == ("new", "new")
    assert sorted(p.name for p in a.iterdir()) == ["out"]
    assert sorted(p.name for p in b.iterdir()) == ["other", "out"]


def test_an_uncommitted_set_is_removed_by_the_next_write(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("old")
    stage = tmp_path / f"{STAGING}bbbbbbbbbbbb"
    stage.mkdir()
    (stage / "out").write_text("new")
    legacy = tmp_path / ".build.gpupool-1234"  # an earlier version's render staging
    (legacy / "ns").mkdir(parents=True)
    (legacy / "ns/a.yaml").write_text("x")
    write_folder(tmp_path / "build", {"a": b"a"}, manifest=MANIFEST, foreign=Foreign.KEEP)
    assert (tmp_path / "out").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "out"]


def test_ctrl_c_after_the_swap_is_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "build"
    old = {f"ns/{i}.yaml": b"old" for i in range(50)}
    write_folder(out, old, manifest=MANIFEST, foreign=Foreign.KEEP)
    real = atomic_file.remove_tree
    seen: list[Path] = []

    def interrupted(root: Path, **kwargs: object) -> None:
        seen.append(root)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the old tree is removed
        real(root, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(atomic_file, "remove_tree", interrupted)
    result = write_folder(out, {"a.yaml": b"new"}, manifest=MANIFEST, foreign=Foreign.KEEP)
    assert seen and result.written == ["a.yaml"]
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a.yaml"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_before_the_commit_keeps_the_old_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {tmp_path / "r.md": b"old", tmp_path / "img/p.png": b"old"}
    write_files(files)
    real = atomic_file._write_record

    def interrupted(stage: Path, pairs: list[tuple[Path, Path]]) -> None:
        real(stage, pairs)
        raise KeyboardInterrupt  # after the record, before the commit point

    monkeypatch.setattr(atomic_file, "_write_record", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_files({p: b"new" for p in files})
    assert {p: p.read_bytes() for p in files} == files
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["img", "p.png", "r.md"]


def test_a_symlinked_output_folder_replaces_the_folder_it_names(tmp_path: Path) -> None:
    real, link = tmp_path / "real", tmp_path / "build"
    write_folder(real, {"a": b"old"}, manifest=MANIFEST, foreign=Foreign.KEEP)
    link.symlink_to("real")
    write_folder(link, {"a": b"new"}, manifest=MANIFEST, foreign=Foreign.KEEP)
    assert link.is_symlink() and (real / "a").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "real"]

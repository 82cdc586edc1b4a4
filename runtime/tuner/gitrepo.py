"""Edge: git through its CLI. Proposals are committed in a temporary worktree, so the
user's checkout, index and uncommitted work are never touched."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

COMMITTER = ("gpupool-tuner", "gpupool-tuner@users.noreply.localhost")
"""Identity of the tuner's commits (``git -c user.name/user.email``)."""


class GitError(Exception):
    """A git command failed; the message carries the command and git's stderr."""


def git(repo: Path, *args: str, stdin: str | None = None, timeout_s: float | None = None) -> str:
    """Run git; network commands pass ``timeout_s`` and never prompt for credentials."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
    except subprocess.TimeoutExpired:
        raise GitError(f"git {' '.join(args)} in {repo}: no answer in {timeout_s:g} s") from None
    if done.returncode != 0:
        raise GitError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout


def common_dir(repo: Path) -> Path:
    """The repository's shared git directory (``.git`` even from a linked worktree)."""
    return (repo / git(repo, "rev-parse", "--git-common-dir").strip()).resolve()


def resolve(repo: Path, ref: str) -> str:
    return git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()


def has_remote(repo: Path, remote: str) -> bool:
    return remote in git(repo, "remote").split()


def branch_of(repo: Path, ref: str) -> str | None:
    """The local branch ``ref`` names (``HEAD``: the checked-out one); None for anything
    else (a commit, a tag, a remote-tracking ref, a detached HEAD)."""
    full = git(repo, "rev-parse", "--symbolic-full-name", ref).strip()
    return full.removeprefix("refs/heads/") if full.startswith("refs/heads/") else None


def fetch_branch(repo: Path, remote: str, branch: str, *, timeout_s: float) -> str:
    """Fetch ``branch`` from ``remote`` into ``refs/remotes/<remote>/<branch>`` and return
    its commit. Only that ref moves: the local branch, index and work tree are untouched."""
    tracking = f"refs/remotes/{remote}/{branch}"
    refspec = f"+refs/heads/{branch}:{tracking}"
    git(repo, "fetch", "--quiet", "--no-tags", remote, refspec, timeout_s=timeout_s)
    return resolve(repo, tracking)


def read_at(repo: Path, commit: str, path: str) -> str:
    """A file's text as committed (the proposal's base), not as it sits in the work tree."""
    return git(repo, "show", f"{commit}:{path}")


def branch_exists(repo: Path, branch: str) -> bool:
    done = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def commit_on_new_branch(
    repo: Path, *, base: str, branch: str, path: str, text: str, message: str
) -> str:
    """Create ``branch`` at a new commit on ``base`` with ``path`` set to ``text``."""
    return commit_files_on_new_branch(
        repo, base=base, branch=branch, files={path: text.encode("utf-8")}, message=message
    )


def commit_files_on_new_branch(
    repo: Path, *, base: str, branch: str, files: Mapping[str, bytes], message: str
) -> str:
    """Create ``branch`` at a new commit on ``base`` with each of ``files`` (path relative
    to the repository root -> bytes) written.

    The commit is made on a detached temporary worktree and the branch is created last, in
    one ref update: a run killed half-way leaves no branch behind (only a worktree entry
    that the next run prunes), so a re-run retries instead of finding an empty proposal.
    """
    name, email = COMMITTER
    git(repo, "worktree", "prune")
    with tempfile.TemporaryDirectory(prefix="gpupool-tune-") as scratch:
        tree = Path(scratch) / "tree"
        git(repo, "worktree", "add", "--quiet", "--detach", str(tree), base)
        try:
            for path, data in files.items():
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                (tree / path).write_bytes(data)
            git(tree, "add", "--", *files)
            git(
                tree,
                "-c",
                f"user.name={name}",
                "-c",
                f"user.email={email}",
                "commit",
                "--quiet",
                "--no-verify",
                "-F",
                "-",
                stdin=message,
            )
            commit = git(tree, "rev-parse", "HEAD").strip()
        finally:
            git(repo, "worktree", "remove", "--force", str(tree))
    git(repo, "branch", branch, commit)
    return commit


def export_folder(repo: Path, commit: str, folder: str, dest: Path) -> None:
    """``folder`` of the repository as committed at ``commit``, written under ``dest``
    (``git archive``; the work tree is never read)."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit, "--", folder],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        stderr = archive.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git archive {commit} -- {folder} in {repo}: {stderr}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")


def push(repo: Path, remote: str, branch: str) -> None:
    git(repo, "push", "--quiet", remote, f"refs/heads/{branch}:refs/heads/{branch}")

"""Edge: what a proposal changes, for its PR body: the rendered-manifest diff (what ``gpupool
diff`` prints) and the what-if replay of both policies (what ``gpupool whatif`` prints).

Both policies are materialised beside the model configs committed at the proposal's base
(read with ``git show`` into a scratch directory), so neither depends on the work tree.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path, PurePosixPath

from infra.builders.nodepools import Target as NodePoolTarget
from infra.diff import diff_documents
from infra.pipeline import render_policy_file
from policy import PoolPolicy, load_policy
from runtime.sim import markdown
from runtime.sim.options import DEMO, build_whatif
from runtime.sim.service_time import ServiceTimeError
from runtime.sim.traces import TraceError
from runtime.sim.whatif import WhatIfError, run
from runtime.tuner import gitrepo
from runtime.vllm import BackendError, KvPlanError, ModelConfigError

REPLAY_ERRORS = (
    TraceError,
    WhatIfError,
    ServiceTimeError,
    ModelConfigError,
    KvPlanError,
    BackendError,
)
"""What a replay can refuse with; the PR body then says why instead of a what-if."""


@contextmanager
def _committed_pair(
    repo: Path,
    *,
    base_commit: str,
    policy_path: str,
    policy: PoolPolicy,
    base_text: str,
    new_text: str,
) -> Iterator[tuple[Path, Path]]:
    """The policy before and after the change as files beside its committed model configs."""
    folder = PurePosixPath(policy_path).parent
    with tempfile.TemporaryDirectory(prefix="gpupool-tune-render-") as scratch:
        root = Path(scratch)
        for hf_config in sorted({w.hf_config for w in policy.workloads}):
            if ".." in PurePosixPath(hf_config).parts or PurePosixPath(hf_config).is_absolute():
                raise ValueError(
                    f"hf_config {hf_config!r} leaves the policy's directory; the tuner renders "
                    "only model configs committed beside the policy"
                )
            model = root / hf_config
            model.parent.mkdir(parents=True, exist_ok=True)
            model.write_text(gitrepo.read_at(repo, base_commit, str(folder / hf_config)))
        files = (root / "before.yaml", root / "after.yaml")
        for file, text in zip(files, (base_text, new_text), strict=True):
            file.write_text(text, encoding="utf-8")
        yield files


def manifest_diff(
    repo: Path,
    *,
    base_commit: str,
    policy_path: str,
    policy: PoolPolicy,
    base_text: str,
    new_text: str,
    target: NodePoolTarget,
) -> str:
    """Object-level diff of the two renders; empty when no manifest changes.

    Raises ``PolicyError`` when either policy cannot render: such a proposal is not made.
    """
    with _committed_pair(
        repo,
        base_commit=base_commit,
        policy_path=policy_path,
        policy=policy,
        base_text=base_text,
        new_text=new_text,
    ) as (before, after):
        return diff_documents(
            render_policy_file(before, target=target), render_policy_file(after, target=target)
        )


def whatif_comparison(
    repo: Path,
    *,
    base_commit: str,
    policy_path: str,
    policy: PoolPolicy,
    base_text: str,
    new_text: str,
    hours: float,
) -> str:
    """Markdown of both policies replayed on the bundled traces for ``hours`` (the demo's
    layout: a cluster sized to the production trace), or one line saying why not."""
    options = replace(DEMO, hours=hours)
    try:
        with _committed_pair(
            repo,
            base_commit=base_commit,
            policy_path=policy_path,
            policy=policy,
            base_text=base_text,
            new_text=new_text,
        ) as files:
            results = []
            for file in files:
                loaded = load_policy(file)
                results.append(run(loaded, file.parent, build_whatif(options, loaded)))
    except REPLAY_ERRORS as exc:
        return f"_The what-if replay could not run: {exc}_"
    return markdown.comparison(
        results[0], results[1], base_ref=f"{policy_path}@{base_commit[:12]}", head_ref="proposed"
    )

"""Edge: what a proposal changes, for its PR body: the rendered-manifest diff (what ``gpupool
diff`` prints) and the what-if replay of both policies (what ``gpupool whatif`` prints).

Both policies are materialised beside the model configs committed at the proposal's base
(read with ``git show`` into a scratch directory), so neither depends on the work tree.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from infra.builders.stack_options import StackOptions
from infra.builders.stack_options import Target as NodePoolTarget
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


@dataclass(frozen=True)
class PolicyChange:
    """A proposal's edit of the policy file, as committed at its base."""

    repo: Path
    base_commit: str
    policy_path: str
    policy: PoolPolicy
    """The policy at ``base_commit`` (its workloads name the model configs to read)."""
    base_text: str
    new_text: str


@contextmanager
def _committed_pair(change: PolicyChange) -> Iterator[tuple[Path, Path]]:
    """The policy before and after the change as files beside its committed model configs."""
    folder = PurePosixPath(change.policy_path).parent
    with tempfile.TemporaryDirectory(prefix="gpupool-tune-render-") as scratch:
        root = Path(scratch)
        for hf_config in sorted({w.hf_config for w in change.policy.workloads}):
            if ".." in PurePosixPath(hf_config).parts or PurePosixPath(hf_config).is_absolute():
                raise ValueError(
                    f"hf_config {hf_config!r} leaves the policy's directory; the tuner renders "
                    "only model configs committed beside the policy"
                )
            model = root / hf_config
            model.parent.mkdir(parents=True, exist_ok=True)
            model.write_text(
                gitrepo.read_at(change.repo, change.base_commit, str(folder / hf_config))
            )
        files = (root / "before.yaml", root / "after.yaml")
        for file, text in zip(files, (change.base_text, change.new_text), strict=True):
            file.write_text(text, encoding="utf-8")
        yield files


def manifest_diff(change: PolicyChange, *, target: NodePoolTarget) -> str:
    """Object-level diff of the two renders; empty when no manifest changes.

    Raises ``PolicyError`` when either policy cannot render: such a proposal is not made.
    """
    stack = StackOptions(target)
    with _committed_pair(change) as (before, after):
        return diff_documents(
            render_policy_file(before, stack=stack), render_policy_file(after, stack=stack)
        )


def whatif_comparison(change: PolicyChange, *, hours: float) -> str:
    """Markdown of both policies replayed on the demo's inputs for ``hours`` (each policy's
    pools as declared, the bundled production trace, a flex backlog), or one line saying
    why not."""
    options = replace(DEMO, hours=hours)
    try:
        with _committed_pair(change) as files:
            results = []
            for file in files:
                loaded = load_policy(file)
                results.append(run(loaded, file.parent, build_whatif(options, loaded)))
    except REPLAY_ERRORS as exc:
        return f"_The what-if replay could not run: {exc}_"
    return markdown.comparison(
        results[0],
        results[1],
        base_ref=f"{change.policy_path}@{change.base_commit[:12]}",
        head_ref="proposed",
    )

"""Edge: the rendered-manifest diff of a proposal for its PR body (what ``gpupool diff`` prints).

Both policies are rendered with the model configs committed at the proposal's base (read
with ``git show`` into a scratch directory), so the diff never depends on the work tree.
"""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath

from infra.builders.nodepools import Target as NodePoolTarget
from infra.diff import diff_documents
from infra.pipeline import render_policy_file
from policy import PoolPolicy
from runtime.tuner import gitrepo


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
        renders = []
        for name, text in (("before.yaml", base_text), ("after.yaml", new_text)):
            # beside the committed model configs, so hf_config resolves to them
            (root / name).write_text(text, encoding="utf-8")
            renders.append(render_policy_file(root / name, target=target))
        return diff_documents(renders[0], renders[1])

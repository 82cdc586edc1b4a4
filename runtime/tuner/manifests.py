"""Edge: the rendered-manifest diff of a proposal for its PR body (what ``gpupool diff`` prints).

Both policies are rendered with the model configs committed at the proposal's base (read
with ``git show`` into a scratch directory), so the diff never depends on the work tree.
"""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath

from infra.builders.nodepools import Target as NodePoolTarget
from infra.bundle import build_bundle
from infra.diff import diff_documents
from infra.inputs import load_inputs
from infra.render import render_documents
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
            (root / name).write_text(text, encoding="utf-8")
            inputs = load_inputs(root / name)
            renders.append(
                render_documents(
                    build_bundle(inputs.policy, target=target, vllm_args=inputs.vllm_args)
                )
            )
        return diff_documents(renders[0], renders[1])

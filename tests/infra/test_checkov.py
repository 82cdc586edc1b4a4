"""checkov (Kubernetes framework) on the rendered bundle: no failed check outside ALLOWED.

checkov pins an older ``packaging`` than Pulumi needs, so it lives in a virtualenv of its own
that ``make checkov`` (a prerequisite of ``make test``) builds. The same allow-list, with the
same reasons, is in docs/design/infra.md "checkov".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from policy import DEFAULT_POLICY
from runtime.cli.app import app
from tests.infra.policies import edited
from tests.infra.test_cli import write_policy
from tests.infra.test_security import PINNED

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
DOCS = ROOT / "docs" / "design" / "infra.md"

ALLOWED: dict[str, str] = {
    "CKV_K8S_43": "Image should use digest: the default policy names its images by tag, "
    "because no digest of vllm/vllm-openai:v0.32.0 could be verified and the runtime image "
    "is built by the cluster owner; `gpupool validate` warns on every tag-only image, and a "
    "policy that pins both by digest passes (test_a_pinned_policy_passes_the_image_checks).",
    "CKV_K8S_15": "Image Pull Policy should be Always: checkov passes a digest-pinned image "
    "without it, so this is the same tag-only default as CKV_K8S_43 (same test).",
    "CKV_K8S_9": "Readiness Probe Should be Configured: the compaction sidecar has none by "
    "design; a sidecar that is not ready must never take a serving vLLM pod out of its "
    "Service (vLLM's container has its readiness probe).",
}
"""Check id -> why the finding stays; nothing else may fail."""


def _render(policy: Path, out: Path, target: str) -> None:
    result = CliRunner().invoke(app, ["render", str(policy), "--out", str(out), "--target", target])
    assert result.exit_code == 0, result.output


def failed_checks(directory: Path) -> list[dict[str, Any]]:
    """checkov's failed checks on every manifest under ``directory``."""
    if not CHECKOV.is_file():
        pytest.fail(f"{CHECKOV} is missing: run `make checkov` (a prerequisite of `make test`)")
    run = subprocess.run(
        # --skip-download: no network (checkov would fetch its guidelines)
        [
            str(CHECKOV),
            "-d",
            str(directory),
            "--framework",
            "kubernetes",
            "-o",
            "json",
            "--quiet",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode in (0, 1), run.stderr  # 1: some check failed
    reports = json.loads(run.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert all(r["summary"]["parsing_errors"] == 0 for r in reports), run.stdout
    assert sum(r["summary"]["resource_count"] for r in reports) > 0, run.stdout
    return [c for r in reports for c in r["results"]["failed_checks"]]


def test_the_rendered_bundle_fails_no_check_outside_the_allow_list(tmp_path: Path) -> None:
    for target in ("labels", "karpenter"):
        _render(DEFAULT_POLICY, tmp_path / target, target)
    found = failed_checks(tmp_path)
    unexpected = sorted(
        f"{c['check_id']} {c['check_name']}: {c['resource']} ({c['file_path']})"
        for c in found
        if c["check_id"] not in ALLOWED
    )
    assert unexpected == []
    # the allow-list is not stale: every entry still explains a real finding
    assert {c["check_id"] for c in found} == set(ALLOWED)


def test_a_pinned_policy_passes_the_image_checks(tmp_path: Path) -> None:
    policy = write_policy(tmp_path, edited(PINNED))
    _render(policy, tmp_path / "build", "labels")
    rendered = "\n".join(p.read_text() for p in (tmp_path / "build").rglob("deployment-*.yaml"))
    assert rendered.count("@sha256:") >= 3  # tuner, its init container, vLLM
    ids = {c["check_id"] for c in failed_checks(tmp_path / "build")}
    assert not ids & {"CKV_K8S_43", "CKV_K8S_15"}, ids


def test_the_allow_list_is_documented() -> None:
    section = DOCS.read_text().split("### checkov", 1)[1].split("\n## ", 1)[0]
    for check in ALLOWED:
        assert f"`{check}`" in section, check

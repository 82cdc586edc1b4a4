"""Edge: write a policy's monitoring bundle into a directory, atomically.

Layout of ``OUT``: ``rules/<concern>.yaml`` (Prometheus rule files, one per concern),
``alertmanager.yml``, ``prometheus-adapter.yaml`` and ``dashboard.json``. Everything is built
in memory first, written to a sibling temporary directory, then swapped into place, so a
failure never leaves a half-written bundle and an unchanged policy gives identical bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from alerts.adapter import adapter_config
from alerts.bundle import rule_files
from alerts.dashboard import dashboard
from alerts.recording import with_help
from alerts.routing import alertmanager_config
from infra.yaml_text import to_yaml
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import build_catalogue


def bundle_files(policy: PoolPolicy) -> dict[str, str]:
    """Relative path -> file text of everything ``render`` writes."""
    catalogue = build_catalogue(policy)
    files = {
        f"rules/{stem}.yaml": with_help(to_yaml({"groups": groups}, sort_keys=False), catalogue)
        for stem, groups in rule_files(policy).items()
    }
    files["alertmanager.yml"] = to_yaml(alertmanager_config(policy), sort_keys=False)
    files["prometheus-adapter.yaml"] = to_yaml(adapter_config(), sort_keys=False)
    files["dashboard.json"] = json.dumps(dashboard(policy), indent=2, sort_keys=True) + "\n"
    return files


def render(policy: PoolPolicy, out: Path) -> list[Path]:
    """Replace ``out`` with the policy's bundle; returns the files written."""
    files = bundle_files(policy)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if out.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, retired / out.name)
            os.replace(staging, out)
            shutil.rmtree(retired)
        else:
            os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return [out / relative for relative in sorted(files)]

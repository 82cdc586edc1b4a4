"""What makes KV bytes on the snapshot volume reusable, and the directory name that says so.

vLLM's own directory (``<model>_<digest>``, vllm/v1/kv_offload/file_mapper.py) hashes the
model name, KV dtype, block size, layer names and parallel sizes, but not the model
revision, the vLLM version, the KV layout of the direct format, or the prefix-hash algorithm
and seed that name every file. Any of those changing would make a restarted replica load
bytes of another layout, or miss every block, from the same tree. gpupool therefore gives
vLLM a root one level down, named by a digest of all of them; vLLM's tree lives inside.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

TIER_DIR_PREFIX = "gpupool-kv-"
"""Top-level directories of the snapshot volume that gpupool's tier writes."""
IDENTITY_FILE = "gpupool-tier.json"
"""In each tier directory: the fields its name digests; its mtime is the writers' heartbeat."""
STATE_DIR = ".gpupool"
"""Top-level directory of per-replica status files (never a tier, never reclaimed whole)."""
DIGEST_CHARS = 16


def digest(fields: Mapping[str, object]) -> str:
    """Stable digest of ``fields`` (key order and JSON spacing do not matter)."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS]


def tier_dir_name(fields: Mapping[str, object]) -> str:
    """Name of the directory, under the volume's root, that holds KV of this identity."""
    return f"{TIER_DIR_PREFIX}{digest(fields)}"

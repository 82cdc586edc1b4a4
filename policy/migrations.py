"""Fields of older policies and what replaced them, so the loader says more than "unknown"."""

from __future__ import annotations

RENAMED_FIELDS: dict[tuple[str, ...], str] = {
    ("elastic", "scale_up_below"): (
        "renamed elastic.grow_while_production_below: it now reads production's GPU "
        "utilization, not the cluster mean that counted flex's own load"
    ),
    ("elastic", "shed_above"): (
        "renamed elastic.shed_while_production_above: it now reads production's GPU "
        "utilization, not the cluster mean that counted flex's own load"
    ),
    ("elastic", "idle_gpu_below"): (
        "removed: headroom is now the GPUs no pod requests (kube-state-metrics), so a GPU "
        "held by an idle pod is never free; delete the line"
    ),
    ("elastic", "flex_target_utilization"): (
        "removed: it never changed a decision; delete the line"
    ),
    ("kv_cache", "compaction_worker_port"): (
        "renamed kv_cache.compaction_sidecar_port: the port of the compaction sidecar "
        '("worker" now means vLLM\'s worker process only)'
    ),
    ("metrics", "alertmanager_secret"): (
        "removed: gpupool no longer replaces the Alertmanager's configuration Secret; it "
        "renders an AlertmanagerConfig in network.alertmanager_namespace that adds its routes "
        "(docs/alerts.md); delete the line"
    ),
}
"""Fields of older policies and what replaced them; the loader reports these instead of
"unknown field" (docs/policy.md "Migrating from 0.1")."""

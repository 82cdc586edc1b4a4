"""KV snapshot tier alerts: the volume that keeps KV blocks across replica restarts.

With ``kv_cache.kv_preservation: filesystem`` every flex pod runs a snapshot GC sidecar that
bounds the tier and exports ``gpupool_kv_tier_*`` (runtime/kvcache/preservation/gc.py),
scraped with the same ``namespace``/``pod``/workload labels as vLLM. Every alert here reads
only those series, so where preservation is off they are absent and nothing can fire.

- KVSnapshotTierThrashing (per volume): capacity passes delete blocks still in use.
- KVSnapshotGCStalled (per pod): no completed pass for several GC intervals, or the sidecar
  stopped answering: nothing bounds the tier, the volume fills, vLLM's writes fail.
- KVSnapshotGCErrors (per pod): the GC keeps failing to delete files.
- KVSnapshotFlushDropped (per volume): stopping replicas drop writes at the grace budget.

The tier's state lives on a volume each workload's replicas share, so the thrashing and
flush alerts sum the GCs of a workload: every GC scans the whole volume and an exited
replica's flush is counted by whichever GC renames its record first. These read raw sidecar
series: they need the histogram's buckets and windows of their own, not a catalogue ratio.
"""

from __future__ import annotations

from alerts.rules import Group, Rule, alert, group
from policy.base import duration_seconds, format_duration
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import Catalogue, num

PREFIX = "gpupool_kv_tier_"


def _quantile_name(q: float) -> str:
    return "median" if q == 0.5 else f"{q * 100:g}th percentile"


def thrashing_window(policy: PoolPolicy) -> str:
    """``metrics.rate_window``, or three GC intervals if longer: every window holds passes,
    so a slow GC does not blank the quantile between them and reset the ``for:``."""
    window = policy.metrics.rate_window
    three = 3 * duration_seconds(policy.kv_cache.snapshot_gc_interval)
    return window if duration_seconds(window) >= three else format_duration(three)


def _flex_namespace(policy: PoolPolicy) -> str:
    """Matcher of the flex namespace, where every snapshot GC sidecar runs."""
    return f'namespace="{policy.cluster.flex_namespace}"'


def _volume(policy: PoolPolicy) -> str:
    """The labels of one snapshot volume: a workload's replicas share it."""
    return f"namespace, {policy.metrics.workload_label}"


def _tier_thrashing(policy: PoolPolicy) -> Rule:
    """KVSnapshotTierThrashing: capacity passes delete blocks still in use."""
    m, ns = policy.metrics, _flex_namespace(policy)
    thrash = policy.alerting.thresholds.kv_tier_thrashing
    window = thrashing_window(policy)
    young = duration_seconds(thrash.evicted_age_below)
    return alert(
        "KVSnapshotTierThrashing",
        f"histogram_quantile({num(thrash.quantile)}, sum by ({_volume(policy)}, le) "
        f"(rate({PREFIX}evicted_age_seconds_bucket{{{ns}}}[{window}]))) < {num(young)}",
        thrash,
        summary="The KV snapshot tier deletes blocks that are still in use.",
        description=(
            "Capacity passes of the snapshot GC on the volume of workload "
            f"{{{{ $labels.{m.workload_label} }}}} (namespace {{{{ $labels.namespace }}}}) "
            f"deleted blocks whose {_quantile_name(thrash.quantile)} time since last use over "
            f"{window} was {{{{ $value | humanizeDuration }}}} (limit: below "
            f"{thrash.evicted_age_below} for {thrash.for_}): the tier is smaller than "
            "its working set; raise the workload's snapshot_volume.tier_capacity or the "
            "PVC size."
        ),
    )


def _gc_stalled(policy: PoolPolicy) -> Rule:
    """KVSnapshotGCStalled: no completed pass for several GC intervals, or no sidecar.

    The last pass per scrape target, looked up over ``lookback`` and kept while the target
    exists (``up``, 0 or 1): a sidecar whose scrape fails has no current series, a deleted
    pod has no ``up`` (silent)."""
    m, ns = policy.metrics, _flex_namespace(policy)
    instance = ", ".join(m.instance_labels)
    target = ", ".join(dict.fromkeys([*m.instance_labels, "instance"]))
    gc_interval = policy.kv_cache.snapshot_gc_interval
    stalled = policy.alerting.thresholds.kv_snapshot_gc_stalled
    stale_s = stalled.missed_passes * duration_seconds(gc_interval)
    return alert(
        "KVSnapshotGCStalled",
        f"(time() - max by ({instance}) "
        f"(max_over_time({PREFIX}gc_last_pass_timestamp_seconds{{{ns}}}[{stalled.lookback}])"
        f" and on ({target}) up{{{ns}}})) > {num(stale_s)}",
        stalled,
        summary="A flex pod's KV snapshot GC is not running.",
        description=(
            "The snapshot GC of {{ $labels.pod }} (workload "
            f"{{{{ $labels.{m.workload_label} }}}}, namespace {{{{ $labels.namespace }}}}) "
            "completed its last pass {{ $value | humanizeDuration }} ago (limit "
            f"{stalled.missed_passes} x kv_cache.snapshot_gc_interval {gc_interval} for "
            f"{stalled.for_}; decades: no pass completed since the sidecar started). "
            "Nothing bounds the tier: the volume fills and vLLM's snapshot writes fail."
        ),
    )


def _gc_errors(policy: PoolPolicy) -> Rule:
    """KVSnapshotGCErrors: the GC keeps failing to delete files."""
    m, ns = policy.metrics, _flex_namespace(policy)
    instance = ", ".join(m.instance_labels)
    errors = policy.alerting.thresholds.kv_snapshot_gc_errors
    return alert(
        "KVSnapshotGCErrors",
        f"sum by ({instance}) (rate({PREFIX}gc_errors_total{{{ns}}}[{m.rate_window}])) * 60 > 0",
        errors,
        summary="A flex pod's KV snapshot GC cannot delete files.",
        description=(
            "The snapshot GC of {{ $labels.pod }} (workload "
            f"{{{{ $labels.{m.workload_label} }}}}, namespace {{{{ $labels.namespace }}}}) "
            "failed to delete {{ $value | humanize }} files per minute over "
            f"{m.rate_window} for {errors.for_} (its log names each file and error): "
            "what it cannot delete it cannot free, so the volume fills."
        ),
    )


def _flush_dropped(policy: PoolPolicy) -> Rule:
    """KVSnapshotFlushDropped: stopping replicas drop writes at the grace budget."""
    m, volume = policy.metrics, _volume(policy)
    flush = policy.alerting.thresholds.kv_snapshot_flush_dropped
    blocks = f"{PREFIX}flush_blocks_total{{{_flex_namespace(policy)}"
    return alert(
        "KVSnapshotFlushDropped",
        f'sum by ({volume}) (increase({blocks}, outcome="dropped"}}[{flush.window}]))'
        f" / (sum by ({volume}) (increase({blocks}}}[{flush.window}])) > 0)"
        f" > {num(flush.max_dropped_share)}",
        flush,
        summary="Stopping KV snapshot replicas drop writes at the grace budget.",
        description=(
            "Replicas of workload "
            f"{{{{ $labels.{m.workload_label} }}}} (namespace {{{{ $labels.namespace }}}}) "
            "that stopped over the last "
            f"{flush.window} dropped {{{{ $value | humanizePercentage }}}} of the KV blocks "
            "in flight when their grace-period flush ran out of time (limit "
            f"{flush.max_dropped_share * 100:g}% for {flush.for_}): disruption.snapshot_s "
            f"({policy.disruption.snapshot_s}s) is too short for the volume's write rate."
        ),
    )


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    """The snapshot tier's group: thrashing, a stalled or failing GC, dropped flushes."""
    rules = [
        _tier_thrashing(policy),
        _gc_stalled(policy),
        _gc_errors(policy),
        _flush_dropped(policy),
    ]
    return [group("gpupool.kv-snapshots", policy, rules)]

"""The flex vLLM instances' serving: preemptions, queues, restarts."""

from __future__ import annotations

from policy.pool import PoolPolicy
from runtime.metrics.catalogue.names import VLLM_PREEMPTIONS, VLLM_QUEUE_DEPTH, VLLM_START_TIME
from runtime.metrics.catalogue.promql import Selectors
from runtime.metrics.catalogue.query import Query


class _ServingQueries(Selectors):
    """The serving queries and the join only they read."""

    def vllm_start_time(self) -> str:
        """Unix time the vLLM API server of each instance started: ``process_start_time_seconds``
        of the very target that serves its ``vllm:`` series (``instance``), not of a sidecar
        of the same pod; the youngest where an instance has several."""
        on = ", ".join(dict.fromkeys([*self.m.instance_labels, "instance"]))
        return (
            f"max by ({self.by_instance}) "
            f'(process_start_time_seconds{{namespace="{self.flex_ns}"}}'
            f" and on ({on}) {self.vllm('prefix_cache_queries_total')})"
        )

    def queries(self) -> list[Query]:
        """The flex vLLM instances' serving: preemptions, queues, restarts."""
        by, w = self.by_instance, self.window
        instances = ("cluster.flex_namespace", "metrics.instance_labels")
        return [
            Query(
                VLLM_PREEMPTIONS,
                f"sum by ({by}) (rate({self.vllm('num_preemptions_total')}[{w}]))",
                "vLLM request preemptions per second (KV cache ran out) per instance.",
                "per_second",
                (*instances, "metrics.rate_window"),
            ),
            Query(
                VLLM_QUEUE_DEPTH,
                f"sum by (namespace, {self.m.workload_label}) "
                f"({self.vllm('num_requests_waiting')})",
                "Requests waiting for a slot, per flex workload.",
                "requests",
                ("cluster.flex_namespace", "metrics.workload_label"),
            ),
            Query(
                VLLM_START_TIME,
                self.vllm_start_time(),
                "Unix time each flex vLLM instance's API server process started "
                "(process_start_time_seconds of the target serving its vllm: series); "
                "KVCacheHitRateLow waits alerting.thresholds.kv_hit_rate.warmup after it. "
                "Absent where vLLM exports no process metrics (several API server processes).",
                "seconds",
                instances,
            ),
        ]


def queries(policy: PoolPolicy) -> list[Query]:
    """The serving queries, each with the policy fields it reads."""
    return _ServingQueries(policy).queries()

"""The exporters the catalogue reads, and what it needs from each: the one list of them
(staleness and prerequisite alerts and docs/alerts.md follow it)."""

from __future__ import annotations

from policy.pool import PoolPolicy
from runtime.metrics.catalogue.promql import Selectors
from runtime.metrics.catalogue.query import Requirement, Source


class _Sources(Selectors):
    """The sources, built from the policy's selectors."""

    def sources(self) -> list[Source]:
        """The exporters gpupool needs, and what it reads from each (the one list of them:
        staleness and prerequisite alerts and docs/alerts.md follow it)."""
        gpu, flex = self.m.gpu_resource, self.flex_ns
        keep = "keep it out of --metric-denylist (and in --metric-allowlist if one is set)"

        def resource(name: str) -> str:
            return f"add {name} to kube-state-metrics' --resources and {keep}"

        dropped = f"kube-state-metrics drops it (its pods resource is on): {keep}"
        ksm_needs = [
            Requirement("kube_node_labels", resource("nodes")),
            Requirement(
                f'kube_node_status_allocatable{{resource="{gpu}"}}',
                f"no node advertises {gpu}: check the GPU device plugin and "
                f"metrics.gpu_resource, or {resource('nodes')}",
            ),
            Requirement("kube_pod_info", dropped),
            Requirement("kube_pod_container_resource_requests", dropped),
        ]
        if self.policy.workloads:
            ksm_needs += [
                Requirement(
                    f'kube_deployment_spec_replicas{{namespace="{flex}"}}',
                    resource("deployments"),
                ),
                Requirement(
                    f'kube_horizontalpodautoscaler_spec_max_replicas{{namespace="{flex}"}}',
                    resource("horizontalpodautoscalers"),
                ),
            ]
        dcgm_needs = (
            Requirement(
                f'up{{job=~"{self.m.dcgm_job}"}}',
                "no scrape job matches metrics.dcgm_job: set it to the job of the dcgm-exporter "
                "targets (count by (job) (DCGM_FI_DEV_GPU_UTIL)); GPUExporterDown is blind",
            ),
            *(
                Requirement(
                    field, f"add {field} to dcgm-exporter's counters CSV (it is a default counter)"
                )
                for field in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
            ),
        )
        sources = [
            Source("dcgm-exporter", "DCGM_FI_DEV_GPU_UTIL", dcgm_needs),
            Source("kube-state-metrics", "kube_pod_status_phase", tuple(ksm_needs)),
        ]
        if self.policy.workloads:
            sources.append(Source("vllm", self.vllm("kv_cache_usage_perc")))
        return sources


def sources(policy: PoolPolicy) -> list[Source]:
    """The exporters gpupool needs, and what it reads from each."""
    return _Sources(policy).sources()

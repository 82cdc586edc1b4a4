# gpupool's runtime image: the `gpupool` CLI (tuner, KV compaction sidecar) and, under
# /opt/gpupool/vllm-plugin, gpupool's own code with its dist-info and no dependencies: the
# flex pods' initContainer copies that tree into the stock vLLM image, which puts it on
# PYTHONPATH so vLLM finds the `vllm.general_plugins` entry point (docs/kvcache.md).
#
# Build from the repository root:
#   docker build -f infra/images/runtime.Dockerfile -t REGISTRY/gpupool:0.1.0 .
# then set cluster.runtime_image and kv_cache.compaction_worker_image to that tag.
FROM python:3.11-slim

# git: the tuner clones the policy repository and pushes proposal branches.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY policy ./policy
COPY infra ./infra
COPY alerts ./alerts
COPY runtime ./runtime

# One source tree, installed twice: with its dependencies for the CLI, and without them as
# the plugin tree (vLLM's image already has what the plugin imports: torch, numpy,
# prometheus_client; a second pydantic there would shadow vLLM's).
RUN pip install --no-cache-dir . \
    && pip install --no-cache-dir --no-compile --no-deps --target /opt/gpupool/vllm-plugin . \
    && rm -rf /src /opt/gpupool/vllm-plugin/bin

# Non-root, numeric so `runAsNonRoot` can verify it; the pods run as this UID too.
RUN useradd --uid 10001 --user-group --create-home gpupool
USER 10001
WORKDIR /home/gpupool
ENTRYPOINT ["gpupool"]

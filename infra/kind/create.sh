#!/usr/bin/env bash
# Create the gpupool kind cluster and advertise fake nvidia.com/gpu capacity on its workers.
#
#   infra/kind/create.sh                 # cluster "gpupool", 8 fake GPUs per worker
#   GPUS_PER_NODE=4 infra/kind/create.sh
#
# Needs docker, kind and kubectl. kind has no GPUs: the capacity is an extended resource
# patched into each worker's node status (the Kubernetes "advertise extended resources"
# recipe), so the scheduler places GPU-requesting pods as if the GPUs existed. Nothing can
# use them; this cluster checks scheduling objects (priorities, PDBs, HPAs, node pools),
# not inference. Then:  gpupool render --out build && kubectl apply --server-side -k build
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cluster="${CLUSTER_NAME:-gpupool}"
gpus="${GPUS_PER_NODE:-8}"

for tool in kind kubectl; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found on PATH" >&2; exit 1; }
done

if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --config "$here/cluster.yaml" --wait 120s
fi
context="kind-$cluster"

for node in $(kubectl --context "$context" get nodes -l gpupool.io/pool -o name); do
  # "~1" escapes "/" in a JSON-patch path; --subresource=status needs kubectl >= 1.24.
  kubectl --context "$context" patch "$node" --subresource=status --type=json \
    -p "[{\"op\": \"add\", \"path\": \"/status/capacity/nvidia.com~1gpu\", \"value\": \"$gpus\"}]"
done

kubectl --context "$context" get nodes -L gpupool.io/pool \
  -o custom-columns='NAME:.metadata.name,POOL:.metadata.labels.gpupool\.io/pool,GPUS:.status.capacity.nvidia\.com/gpu'

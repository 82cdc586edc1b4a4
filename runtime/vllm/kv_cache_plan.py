"""The KV-cache plan of one flex workload: every number behind its vLLM arguments, and the
table that explains each (``gpupool vllm-args``). ``runtime.vllm.plan`` computes it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.vllm.backends import BlockRule

GIB = 1024**3
CUDA_CONTEXT_BYTES = 1 * GIB
"""GPU memory a vLLM worker already holds when its start-up check measures free memory: the
CUDA context (about 0.5 GiB with CUDA 12 on Hopper, not measured here) and NCCL's buffers
for tensor parallelism. The activation reserve covers it, so ``--gpu-memory-utilization``
leaves it out; counted twice, a weights-bound plan (weights + reserve + KV = the whole GPU)
would ask for more free memory than an idle GPU has after the context exists."""
UTILIZATION_GRAIN = 1_000_000
"""``--gpu-memory-utilization`` is emitted in millionths of the GPU (150 KB on 140 GiB): its
rounding up stays far below what the CUDA context's size varies by, so a weights-bound plan
still starts on an idle GPU."""


class KvPlanError(ValueError):
    """Policy, model and GPU do not fit together; says which values and which limit.

    ``field`` is the workload field to change (``max_model_len``, ``gpus_per_replica``,
    ``resources.memory``), so ``infra.inputs`` can point at its line in pool.yaml."""

    def __init__(self, message: str, field: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Derivation:
    """One derived number as the table shows it: name, value, and how it was obtained."""

    name: str
    value: str
    why: str


@dataclass(frozen=True)
class KvCachePlan:
    """Every number behind the vLLM arguments of one flex workload on one GPU type."""

    model_path: str
    """``--model``: what the container serves."""
    port: int
    backend: BlockRule
    tensor_parallel: int
    gpu_memory_bytes: int
    kv_dtype: str
    """Resolved KV element type (``auto`` resolved to the model dtype)."""
    kv_dtype_flag: str
    """``--kv-cache-dtype`` as passed (the policy's value)."""
    bytes_per_token_per_layer: int
    """KV bytes one token takes in one layer on one rank."""
    page_bytes_target: int
    ideal_block_tokens: float
    block_size: int
    weight_bytes: int
    activation_reserve_bytes: int
    share_cap_bytes: int
    """KV may take at most ``max_gpu_memory_share`` of the GPU."""
    left_after_weights_bytes: int
    """GPU memory minus weights minus the activation reserve."""
    kv_cache_bytes: int
    num_layers: int
    max_model_len: int
    max_num_seqs: int
    prefix_caching: bool
    prefix_caching_hash_algo: str
    shutdown_timeout_s: int
    kv_transfer_config: dict[str, Any] | None
    preservation_note: str
    env_unset: tuple[str, ...] = ()
    """Environment variables that must be absent for these arguments to mean what they say."""
    compilation_config: dict[str, Any] | None = None
    """``--compilation-config``: set when the KV compaction plugin must be able to resize the
    pool on a GPU (full CUDA graphs capture the KV buffer's address; piecewise ones do not)."""

    @property
    def page_bytes_per_layer(self) -> int:
        """Bytes of one block in one layer: vLLM's ``page_size_bytes``."""
        return self.bytes_per_token_per_layer * self.block_size

    @property
    def startup_bytes(self) -> int:
        """What the worker allocates after vLLM's start-up memory check: weights, the KV cache
        and the activation reserve less the part of it that exists by then
        (``CUDA_CONTEXT_BYTES``)."""
        reserve = max(self.activation_reserve_bytes - CUDA_CONTEXT_BYTES, 0)
        return self.weight_bytes + self.kv_cache_bytes + reserve

    @property
    def gpu_memory_utilization(self) -> str | None:
        """``--gpu-memory-utilization``: the smallest share of the GPU, rounded up to
        ``UTILIZATION_GRAIN``, that covers ``startup_bytes``; None on the CPU backend.

        vLLM 0.32 refuses to start unless free memory >= ceil(total x utilization)
        (``vllm/v1/worker/utils.py`` ``request_memory``, called from ``Worker.init_device``
        after the CUDA context and NCCL exist), even with ``--kv-cache-memory-bytes``, which
        alone sizes the KV. Its default 0.92 asks a restarted flex pod for 92 % of the GPU
        whatever it needs; this asks for what it will allocate. The CPU worker skips the
        check when the KV bytes are given."""
        if self.backend.vllm_name.startswith("CPU"):
            return None
        grains = -(-self.startup_bytes * UTILIZATION_GRAIN // self.gpu_memory_bytes)
        return f"{grains / UTILIZATION_GRAIN:.6f}"

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers: the unit vLLM divides the KV budget by."""
        return self.page_bytes_per_layer * self.num_layers

    @property
    def target_expressible(self) -> bool:
        """Whether some legal block size gives exactly the policy's page-bytes target."""
        per_token = self.bytes_per_token_per_layer
        if self.page_bytes_target % per_token:
            return False
        return self.backend.allows(self.page_bytes_target // per_token)

    @property
    def num_blocks(self) -> int:
        """Blocks vLLM allocates: ``kv_cache_bytes // block_bytes`` (kv_cache_utils.py)."""
        return self.kv_cache_bytes // self.block_bytes

    @property
    def max_concurrent_tokens(self) -> int:
        """Tokens all running sequences together can hold in the cache."""
        return self.num_blocks * self.block_size

    @property
    def max_full_length_sequences(self) -> float:
        """How many ``max_model_len`` sequences fit at once (vLLM logs this as max concurrency)."""
        return self.max_concurrent_tokens / self.max_model_len

    @property
    def weight_bound(self) -> bool:
        """True when weights, not the share cap, limit the KV budget."""
        return self.left_after_weights_bytes < self.share_cap_bytes

    def derivations(self) -> list[Derivation]:
        """Each derived number and the arithmetic behind it, in the order they depend."""
        return [*self._block_derivations(), *self._memory_derivations(), *self._flag_derivations()]

    def _block_derivations(self) -> list[Derivation]:
        """From the bytes one token takes to the block size and the bytes of one block."""
        rule, per_token = self.backend, self.bytes_per_token_per_layer
        target_note = (
            f"{self.page_bytes_target} B is exactly {self.page_bytes_target // per_token} tokens"
            if self.target_expressible
            else f"{self.page_bytes_target} B/page is NOT expressible: it would be "
            f"{self.ideal_block_tokens:g} tokens, and {rule.vllm_name} needs {rule.describe()}"
        )
        return [
            Derivation(
                "KV bytes per token per layer",
                f"{self.bytes_per_token_per_layer:,}",
                f"kv heads per rank x (K+V or MLA latent width) x {self.kv_dtype} bytes",
            ),
            Derivation("ideal block (tokens)", f"{self.ideal_block_tokens:g}", target_note),
            Derivation(
                "--block-size",
                str(self.block_size),
                f"nearest to {self.ideal_block_tokens:g} that {rule.vllm_name} accepts "
                f"({rule.describe()})",
            ),
            Derivation(
                "page bytes per layer",
                f"{self.page_bytes_per_layer:,}",
                f"{self.bytes_per_token_per_layer:,} B x {self.block_size} tokens",
            ),
            Derivation(
                "block bytes, all layers",
                f"{self.block_bytes:,}",
                f"{self.page_bytes_per_layer:,} B x {self.num_layers} layers",
            ),
        ]

    def _memory_derivations(self) -> list[Derivation]:
        """From the GPU's memory to the KV budget, the blocks and the tokens they hold."""
        bound = (
            "weights bound: GPU - weights - activation reserve < share cap"
            if self.weight_bound
            else "share cap bound: min(share cap, GPU - weights - activation reserve)"
        )
        return [
            Derivation(
                "weights per GPU",
                gib(self.weight_bytes),
                f"estimated parameters x dtype bytes / TP {self.tensor_parallel}",
            ),
            Derivation(
                "activation reserve",
                gib(self.activation_reserve_bytes),
                "kv_cache.activation_reserve_share x GPU memory",
            ),
            Derivation(
                "KV share cap",
                gib(self.share_cap_bytes),
                "kv_cache.max_gpu_memory_share x GPU memory",
            ),
            Derivation(
                "--kv-cache-memory-bytes",
                f"{self.kv_cache_bytes:,}",
                f"{bound}, rounded down to whole blocks",
            ),
            Derivation(
                "--gpu-memory-utilization",
                self.gpu_memory_utilization or "none",
                f"(weights + KV + activation reserve - {gib(CUDA_CONTEXT_BYTES)} CUDA context) "
                f"/ GPU = {gib(self.startup_bytes)} / {gib(self.gpu_memory_bytes)}, rounded "
                "up: vLLM starts when that much of the GPU is free"
                if self.gpu_memory_utilization
                else "CPU backend: vLLM checks no free memory when the KV bytes are given",
            ),
            Derivation(
                "KV blocks",
                f"{self.num_blocks:,}",
                f"{self.kv_cache_bytes:,} // {self.block_bytes:,} (vLLM's own division)",
            ),
            Derivation(
                "max concurrent tokens",
                f"{self.max_concurrent_tokens:,}",
                f"{self.num_blocks:,} blocks x {self.block_size} tokens = "
                f"{self.max_full_length_sequences:.1f} sequences of max_model_len",
            ),
        ]

    def _flag_derivations(self) -> list[Derivation]:
        """The flags that follow from the policy rather than from memory."""
        return [
            Derivation(
                "--shutdown-timeout",
                str(self.shutdown_timeout_s),
                "disruption.drain_s: SIGTERM drains in-flight requests this long",
            ),
            Derivation(
                "--kv-transfer-config",
                "set" if self.kv_transfer_config else "none",
                self.preservation_note,
            ),
            Derivation(
                "--compilation-config",
                json.dumps(self.compilation_config) if self.compilation_config else "none",
                "KV compaction on a GPU: piecewise CUDA graphs leave attention (and the KV "
                "buffer) outside the graphs, so the pool can be resized"
                if self.compilation_config
                else "vLLM's default (no KV resize on this instance, or no CUDA graphs)",
            ),
        ]


def gib(value: int) -> str:
    """Human-readable bytes: GiB, or MiB below one GiB (the test engine's pretend GPU)."""
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / 2**20:.2f} MiB"

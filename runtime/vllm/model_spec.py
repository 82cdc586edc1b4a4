"""What vLLM's KV cache and weights need to know about a model, read from its ``config.json``.

``parse_model_config`` is pure (a dict in, a ``ModelSpec`` out); ``load_model_spec`` is the
file edge. Every error names the file and the field, what was expected and what was found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy.bounded_read import MODEL_CONFIG_BYTES, FileRefused, read_text

DTYPE_BYTES: Mapping[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
"""Bytes per element of every dtype name gpupool understands (model and KV cache dtypes)."""

MODEL_DTYPES = ("bfloat16", "float16", "float32")
"""Weight dtypes a ``config.json`` may name in ``torch_dtype``."""


class ModelConfigError(ValueError):
    """A model ``config.json`` gpupool cannot size: names the file, the field and the problem."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source, self.field = source, field
        super().__init__(f"{source}: {field}: {message}")


@dataclass(frozen=True)
class MlaDims:
    """Multi-head latent attention: one compressed latent (plus a RoPE part) per token."""

    kv_lora_rank: int
    """Width of the compressed KV latent (DeepSeek-V2: 512)."""
    qk_rope_head_dim: int
    """Width of the decoupled RoPE key stored beside the latent (DeepSeek-V2: 64)."""


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a model as far as KV-cache paging and GPU memory care."""

    source: str
    """Where the numbers came from (the config file), for error messages and reports."""
    architecture: str
    """First entry of ``architectures`` (for example ``LlamaForCausalLM``)."""
    num_layers: int
    """``num_hidden_layers``: attention layers, each with its own KV page per block."""
    num_attention_heads: int
    """Query heads."""
    num_kv_heads: int
    """KV heads before tensor-parallel sharding (GQA: fewer than query heads)."""
    head_dim: int
    """Per-head width of keys and values (MLA: unused, see ``mla``)."""
    mla: MlaDims | None
    """Set for MLA models (DeepSeek-V2/V3): the KV of a token is one latent, not K and V."""
    dtype: str
    """Weight dtype from ``torch_dtype`` (or ``dtype``); ``--kv-cache-dtype auto`` follows it."""
    param_count: int
    """Estimated parameters, from the layer shapes; sizes the weights in GPU memory."""
    max_position_embeddings: int
    """Longest context the model was trained for; ``--max-model-len`` may not exceed it."""

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight element."""
        return DTYPE_BYTES[self.dtype]

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one tensor-parallel rank stores; vLLM replicates heads when tp exceeds them.

        MLA stores a single latent "head" on every rank (it is not sharded).
        """
        if self.mla is not None:
            return 1
        return max(1, self.num_kv_heads // tp)

    @property
    def kv_width(self) -> int:
        """Elements one token stores per KV head and layer: K plus V, or the MLA latent."""
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.head_dim

    def kv_bytes_per_token_per_layer(self, tp: int, kv_dtype: str) -> int:
        """KV bytes one token takes in one layer on one rank (vLLM's page size per token)."""
        return self.kv_heads_per_rank(tp) * self.kv_width * DTYPE_BYTES[kv_dtype]

    def weight_bytes_per_rank(self, tp: int) -> int:
        """Weight bytes on one GPU when the model is split over ``tp`` ranks."""
        return self.param_count * self.dtype_bytes // tp


def read_model_config(file: Path) -> str:
    """The text of a model config file a policy or command names, at most ``CONFIG_BYTES``
    of a regular file (``hf_config: /dev/zero`` is refused, not read); raises ``FileRefused``
    or ``OSError``."""
    return read_text(file, MODEL_CONFIG_BYTES)


def load_model_spec(path: Path) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (or the model directory that holds one)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        document = json.loads(read_model_config(file))
    except FileNotFoundError:
        raise ModelConfigError(
            str(file),
            "<file>",
            "file not found (expected a Hugging Face config.json, or a directory holding one)",
        ) from None
    except FileRefused as exc:
        at = "" if exc.line is None else f" (line {exc.line})"
        raise ModelConfigError(str(file), "<file>", f"{exc}{at}") from None
    except OSError as exc:
        raise ModelConfigError(str(file), "<file>", f"cannot read file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            str(file), "<file>", f"invalid JSON at line {exc.lineno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise ModelConfigError(
            str(file), "<file>", "expected a config.json, found JSON nested too deeply"
        ) from None
    return parse_model_config(document, str(file))


def parse_model_config(document: Any, source: str) -> ModelSpec:
    """Validate a parsed ``config.json`` and derive the KV and weight shapes."""
    if not isinstance(document, dict):
        raise ModelConfigError(source, "<top>", f"expected a JSON object, found {document!r:.60}")
    cfg = _Fields(document, source)
    hidden = cfg.positive_int("hidden_size")
    layers = cfg.positive_int("num_hidden_layers")
    heads = cfg.positive_int("num_attention_heads")
    kv_heads = cfg.positive_int("num_key_value_heads", default=heads)
    head_dim = cfg.positive_int("head_dim", default=hidden // heads)
    mla = None
    if "kv_lora_rank" in document and document["kv_lora_rank"] is not None:
        mla = MlaDims(cfg.positive_int("kv_lora_rank"), cfg.positive_int("qk_rope_head_dim"))
    dtype_field = "torch_dtype" if "torch_dtype" in document else "dtype"
    dtype = cfg.choice(dtype_field, list(MODEL_DTYPES))
    architectures = document.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise ModelConfigError(
            source, "architectures", f"expected a non-empty list, found {architectures!r}"
        )
    return ModelSpec(
        source=source,
        architecture=str(architectures[0]),
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        mla=mla,
        dtype=dtype,
        param_count=_param_count(cfg, hidden, layers, heads, kv_heads, head_dim, mla),
        max_position_embeddings=cfg.positive_int("max_position_embeddings"),
    )


def _param_count(
    cfg: _Fields,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    mla: MlaDims | None,
) -> int:
    """Parameters of a decoder-only transformer from its shapes (norm weights and biases included
    only where they are large enough to matter: they are < 0.1 % for every published model)."""
    vocab = cfg.positive_int("vocab_size")
    embeddings = vocab * hidden * (1 if cfg.flag("tie_word_embeddings") else 2)
    if mla is None:
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    else:
        nope = cfg.positive_int("qk_nope_head_dim")
        v_dim = cfg.positive_int("v_head_dim")
        q_rank = cfg.optional_int("q_lora_rank")
        q_dim = heads * (nope + mla.qk_rope_head_dim)
        query = hidden * q_dim if q_rank is None else hidden * q_rank + q_rank * q_dim
        attention = (
            query
            + hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim)
            + mla.kv_lora_rank * heads * (nope + v_dim)
            + heads * v_dim * hidden
        )
    dense_mlp = 3 * hidden * cfg.positive_int("intermediate_size")
    experts = cfg.optional_int("n_routed_experts")
    if experts is None:
        mlp_total = layers * dense_mlp
    else:
        expert_mlp = 3 * hidden * cfg.positive_int("moe_intermediate_size")
        shared = cfg.optional_int("n_shared_experts") or 0
        dense_layers = cfg.optional_int("first_k_dense_replace") or 0
        moe_layer = (experts + shared) * expert_mlp + hidden * experts
        mlp_total = dense_layers * dense_mlp + (layers - dense_layers) * moe_layer
    return embeddings + layers * attention + mlp_total


class _Fields:
    """Typed access to config.json fields with errors that name the file and field."""

    def __init__(self, document: dict[str, Any], source: str) -> None:
        self._doc, self._source = document, source

    def _error(self, field: str, message: str) -> ModelConfigError:
        return ModelConfigError(self._source, field, message)

    def positive_int(self, field: str, default: int | None = None) -> int:
        value = self._doc.get(field, default)
        if value is None:
            raise self._error(field, "required field is missing (expected a positive integer)")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self._error(field, f"expected a positive integer, found {value!r}")
        return value

    def optional_int(self, field: str) -> int | None:
        return None if self._doc.get(field) is None else self.positive_int(field)

    def flag(self, field: str) -> bool:
        value = self._doc.get(field, False)
        if not isinstance(value, bool):
            raise self._error(field, f"expected true or false, found {value!r}")
        return value

    def choice(self, field: str, allowed: list[str]) -> str:
        value = self._doc.get(field)
        if value is None:
            raise self._error(field, f"required field is missing (expected one of {allowed})")
        if value not in allowed:
            raise self._error(field, f"unknown dtype {value!r}; expected one of {allowed}")
        return str(value)

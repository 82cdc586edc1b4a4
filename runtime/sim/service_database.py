"""aiconfigurator-core as the service model's first source: which of its models a policy's model
is, and its measured latencies sampled on the tables' grids (``runtime.sim.service_time``)."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
import re
import tempfile
from importlib import resources
from pathlib import Path

from runtime.sim.service_tables import StepTables, tabulate
from runtime.vllm.model_spec import (
    ModelConfigError,
    ModelSpec,
    parse_model_config,
    read_model_config,
)

DATABASE_PACKAGE = "aiconfigurator-core"
DATABASE_BACKEND = "vllm"


def database_model(model_id: str, spec: ModelSpec | None = None) -> str | None:
    """The aiconfigurator-core model whose normalised name is ``model_id``'s, or None.

    With ``spec``, a candidate counts only when its packaged config has the same shape (layers,
    heads, KV heads, head width, MLA, dtype, parameters within 1 %)."""
    key = _normalise(model_id)
    org = model_id.split("/")[0].lower() if "/" in model_id else ""
    candidates = sorted(
        _database_models().get(key, ()), key=lambda name: name.split("/")[0].lower() != org
    )
    for name in candidates:
        if spec is None or _same_shape(spec, _database_spec(name)):
            return name
    return None


def _normalise(model_id: str) -> str:
    name = model_id.rstrip("/").rsplit("/", 1)[-1].lower()
    name = re.sub(r"^meta-(?=llama)", "", name)
    return re.sub(r"-(instruct|chat|base|it|hf)(?=-|$)", "", name)


@functools.cache
def database_version() -> str | None:
    try:
        return importlib.metadata.version(DATABASE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def _model_configs() -> Path:
    return Path(str(resources.files("aiconfigurator_core") / "model_configs"))


@functools.cache
def _database_models() -> dict[str, tuple[str, ...]]:
    """Normalised name -> packaged models (only those with a config the package ships: any
    other name makes aiconfigurator-core download from Hugging Face)."""
    if database_version() is None:
        return {}
    from aiconfigurator_core.sdk.common import DefaultHFModels

    folder = _model_configs()
    table: dict[str, list[str]] = {}
    for name in sorted(DefaultHFModels):
        if (folder / f"{name.replace('/', '--')}_config.json").is_file():
            table.setdefault(_normalise(name), []).append(name)
    return {key: tuple(names) for key, names in table.items()}


@functools.cache
def _database_spec(name: str) -> ModelSpec | None:
    path = _model_configs() / f"{name.replace('/', '--')}_config.json"
    try:
        return parse_model_config(json.loads(path.read_text(encoding="utf-8")), str(path))
    except (OSError, ValueError, ModelConfigError):
        return None


def _same_shape(spec: ModelSpec, other: ModelSpec | None) -> bool:
    if other is None:
        return False
    fields = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "mla", "dtype")
    return all(getattr(spec, f) == getattr(other, f) for f in fields) and (
        abs(spec.param_count - other.param_count) <= 0.01 * spec.param_count
    )


def config_text(spec: ModelSpec) -> str | None:
    """The ``config.json`` text the spec was read from, when ``spec.source`` is that file."""
    path = Path(spec.source)
    file = path / "config.json" if path.is_dir() else path
    try:
        return read_model_config(file)
    except (OSError, ValueError):
        return None


class _QuietDatabase(logging.Filter):
    """Drops aiconfigurator-core's per-load notices that say nothing about our models: the
    "Loading low-fidelity fallback rows" of other frameworks' tables it loads with every
    database, and "resolve_attention_lane_order: ..." (no framework-default attention kernel
    for vLLM on a100_sxm / l40s: it ranks its measured kernels generically). Other warnings
    pass."""

    NOISE = ("Loading low-fidelity fallback rows", "resolve_attention_lane_order:")
    LOGGERS = ("aiconfigurator_core.sdk.perf_database", "aiconfigurator_core.sdk.attention_lanes")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOISE)


_QUIET = _QuietDatabase()


def _quiet_database_logs() -> None:
    for name in _QuietDatabase.LOGGERS:
        logger = logging.getLogger(name)
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)


@functools.lru_cache(maxsize=64)
def database_tables(
    system: str, db_name: str | None, config: str | None, tp: int, max_context: int
) -> StepTables | str:
    """Compile the model (a packaged name, or a ``config.json`` text) and sample the grid;
    a one-line reason when the database cannot (cached too: failing costs seconds)."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    _quiet_database_logs()
    try:
        if db_name is not None:
            handle = EngineHandle.compile(db_name, system, DATABASE_BACKEND, tp_size=tp)
        else:
            assert config is not None
            with tempfile.TemporaryDirectory(prefix="gpupool-model-") as folder:
                (Path(folder) / "config.json").write_text(config, encoding="utf-8")
                handle = EngineHandle.compile(folder, system, DATABASE_BACKEND, tp_size=tp)

        def decode(b: float, c: float) -> float:
            return handle.predict_decode_latency(int(b), int(c), 2) / 1e3

        def prefill(n: float) -> float:
            return handle.predict_prefill_latency(1, int(n)) / 1e3

        return tabulate(max_context, decode, prefill)
    except Exception as exc:  # any rejection (architecture, tp, ...) means: use the roofline
        return _one_line(exc)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."

"""The engine's KV cache size on a CPU host where the user gave none."""

from __future__ import annotations

import os
from typing import Any

from lmi_server.config import host
from lmi_server.config.schema import ConfigError, ServingConfig
from lmi_server.kvcache.engine_memory import EngineMemoryError, EngineMemoryPlan, plan_cpu_kv_cache, probe_memory
from lmi_server.kvcache.footprint import DTYPE_BYTES, ModelConfigError, kv_footprint
from lmi_server.kvcache.host import safetensors_bytes
from lmi_server.runtime.model_files import kv_dtype
from lmi_server.runtime.model_files import model_config as read_model_config


# vLLM's default max_num_seqs for its OpenAI server on CPU hosts (EngineArgs, vLLM 0.32).
DEFAULT_CPU_MAX_NUM_SEQS = 128


def user_sized_engine_memory(cfg: ServingConfig, engine_args: dict[str, Any]) -> str | None:
    """Which setting already sizes the engine's memory, if any."""
    if cfg.server.cpu_kv_cache_space is not None:
        return "option.cpu_kv_cache_space"
    for key in ("kv_cache_memory_bytes", "gpu_memory_utilization"):
        if engine_args.get(key) is not None:
            return f"option.{key}"
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return "VLLM_CPU_KVCACHE_SPACE"
    return None


FLOAT_BYTES = {name: n for name, n in DTYPE_BYTES.items() if n >= 2}  # types weights are cast between


def loaded_weight_bytes(file_bytes: int | None, model_config: dict[str, Any] | None, dtype: str | None) -> int | None:
    """The weights' size in memory: the files' size, scaled when the engine casts them (bf16 files
    served in float32 take twice their size)."""
    stored = (model_config or {}).get("torch_dtype") or (model_config or {}).get("dtype")
    if file_bytes is None or not isinstance(stored, str) or stored not in FLOAT_BYTES or dtype not in FLOAT_BYTES:
        return file_bytes
    return file_bytes * FLOAT_BYTES[dtype] // FLOAT_BYTES[stored]


def default_engine_memory(
    cfg: ServingConfig, engine_args: dict[str, Any], env: dict[str, str], *, lmcache_cpu_bytes: int = 0
) -> EngineMemoryPlan | None:
    """The engine's KV size on a CPU host where the user gave none (GPU hosts keep vLLM's rule)."""
    if host.gpu_count() > 0:
        return None
    given = user_sized_engine_memory(cfg, engine_args)
    if given is not None:
        return None
    model_path, model_config = read_model_config(str(engine_args["model"]))
    bytes_per_token = None
    max_len = engine_args.get("max_model_len")
    if model_config is not None:
        try:
            bytes_per_token = kv_footprint(model_config, kv_dtype(engine_args)).bytes_per_token
        except ModelConfigError:
            bytes_per_token = None
        max_len = max_len or model_config.get("max_position_embeddings")
    try:
        return plan_cpu_kv_cache(
            probe_memory(),
            weight_bytes=loaded_weight_bytes(safetensors_bytes(model_path), model_config, engine_args.get("dtype")),
            lmcache_cpu_bytes=lmcache_cpu_bytes,
            bytes_per_token=bytes_per_token,
            max_model_len=int(max_len) if max_len else None,
            max_num_seqs=int(engine_args.get("max_num_seqs") or DEFAULT_CPU_MAX_NUM_SEQS),
        )
    except EngineMemoryError as exc:
        raise ConfigError([str(exc)]) from exc

"""LMCache's MP connector with this server's KV namespace in every key it stores or looks up.

LMCache 0.5.6 keys a chunk by `model_name`, which its connector takes from vLLM's model path
(`get_dcp_decorated_model_name`, a module function the connector calls while it builds its
scheduler and worker adapters). When the transfer config carries a namespace
(`kv_connector_extra_config["lmi.kv_namespace"]`, see `namespace.py`), the model path inside
that name is replaced by the namespace: the disk tier's file names and the Redis keys then
change with the model's files (a hub model's commit), dtype, KV dtype, KV-changing settings
(quantization, config overrides, a draft's layers), chunk size and versions, so a cache that
outlives the server is only ever read by a server that would have written the same bytes.
Without the key the name is LMCache's own.
"""

from __future__ import annotations

from typing import Any

from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector

from lmi_server.compat import lmcache as compat_lmcache
from lmi_server.kvcache.namespace import EXTRA_CONFIG_KEY


def namespace_of(vllm_config: Any) -> str | None:
    """The namespace given in the transfer config, if any."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(transfer, "kv_connector_extra_config", None) or {}
    value = extra.get(EXTRA_CONFIG_KEY)
    return str(value) if value else None


def namespaced_model_name(original: Any) -> Any:
    """Wrap LMCache's model-name function: the model path in its result becomes the namespace
    (a DCP layout suffix that LMCache appends is kept)."""

    def model_name(vllm_config: Any, kv_cache_config: Any = None) -> str:
        name = original(vllm_config, kv_cache_config)
        namespace = namespace_of(vllm_config)
        if namespace is None:
            return name
        model = vllm_config.model_config.model
        return namespace + name[len(model):] if name.startswith(model) else f"{namespace}-{name}"

    model_name.lmi_namespaced = True  # type: ignore[attr-defined]
    return model_name


def install() -> None:
    """Replace LMCache's model-name function once per process (idempotent)."""
    compat_lmcache.wrap_model_name(namespaced_model_name, "lmi_namespaced")


class NamespacedLMCacheMPConnector(LMCacheMPConnector):
    """`LMCacheMPConnector` whose keys carry the KV namespace (CUDA hosts; CPU hosts use
    `GuardedLMCacheMPConnector`, which derives from this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install()
        super().__init__(*args, **kwargs)

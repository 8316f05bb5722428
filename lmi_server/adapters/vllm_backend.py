"""The vLLM side of the adapter registry: the `LoRABackend` that loads through vLLM's serving
objects, and the adapter listing added to GET /v1/models. vLLM is imported only when called."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmi_server.adapters.registry import AdapterRegistry
from lmi_server.compat import vllm as compat_vllm


class VLLMBackend:
    """Loads through vLLM's own serving objects: `load_lora_adapter` builds the LoRARequest and
    adds it to the engine; eviction removes it from the engine and from the served-model map."""

    def __init__(self, serving_models: Any, engine_client: Any):
        self.models = serving_models
        self.engine = engine_client

    def is_base_model(self, name: str) -> bool:
        return bool(self.models.is_base_model(name))

    def base_names(self) -> list[str]:
        return [b.name for b in self.models.base_model_paths]

    async def load(self, name: str, path: Path) -> Any:
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        result = await self.models.load_lora_adapter(
            LoadLoRAAdapterRequest(lora_name=name, lora_path=str(path)), base_model_name=self.base_names()[0]
        )
        if type(result).__name__ == "ErrorResponse":
            raise RuntimeError(result.error.message)
        return compat_vllm.lora_request(self.models, name)

    def detach(self, name: str, handle: Any) -> None:
        """Forget the name in vLLM's served-model map (the engine keeps the weights by int id)."""
        compat_vllm.forget_lora(self.models, name, handle)

    async def unload(self, name: str, handle: Any) -> None:
        self.detach(name, handle)
        await self.engine.remove_lora(handle.lora_int_id)

    async def pin(self, handle: Any) -> None:
        await self.engine.pin_lora(handle.lora_int_id)


def with_adapter_listing(serving_models: Any, registry: AdapterRegistry) -> None:
    """Make vLLM's `show_available_models` (GET /v1/models) list registered adapters, loaded or not."""
    from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelPermission

    def with_adapters(models: Any) -> Any:
        parent = serving_models.base_model_paths[0].name
        models.data.extend(
            ModelCard(id=e.name, root=str(e.spec.path), parent=parent, permission=[ModelPermission()])
            for e in sorted(registry.adapters.values(), key=lambda e: e.name)
        )
        return models

    compat_vllm.extend_model_listing(serving_models, with_adapters)

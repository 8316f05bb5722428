"""The adapter keys that are ours (enable_lora, max_loras, max_lora_rank, max_cpu_loras are vLLM's)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class AdapterOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    adapters_path: Path | None = Field(
        None,
        description="Directory of LoRA adapters (one sub-directory each); default `adapters/` next to the model.",
    )

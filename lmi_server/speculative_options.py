"""The speculative-decoding convenience keys (`option.speculative_config` itself is vLLM's)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SpeculativeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    speculative_method: Literal["eagle", "eagle3", "ngram", "mtp", "draft_model"] | None = Field(
        None, description="Speculative method; combined with the two keys below into speculative_config."
    )
    speculative_draft_model: str | None = Field(
        None, description="Draft model directory (relative paths resolve against the model directory)."
    )
    num_speculative_tokens: int | None = Field(
        None, ge=1, le=16, description="Tokens drafted per step."
    )

"""The `option.lmcache_*` keys. Field names are the option keys without the `option.` prefix."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LMCacheOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lmcache_config_file: Path | None = Field(
        None,
        description="LMCache YAML file (LMCache's own keys). Relative paths resolve against the model directory.",
    )
    lmcache_auto_config: bool = Field(
        False, description="Plan LMCache tiers from the host and the model (see `lmi-server config`)."
    )
    lmcache_mode: Literal["mp", "inprocess", "auto"] = Field(
        "auto",
        description="mp: LMCache's multiprocess cache server (works on CPU and GPU); inprocess: "
        "LMCacheConnectorV1 inside the engine (GPU only); auto: mp.",
    )
    lmcache_expected_context_tokens: int | None = Field(
        None, gt=0, description="Working set in tokens for the auto plan (default max_num_seqs x max_model_len)."
    )

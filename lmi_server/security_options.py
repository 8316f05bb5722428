"""The access-control keys: API keys for every route but /ping and /health."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class SecurityOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    api_key: SecretStr | None = Field(
        None,
        description="API key(s) clients must send (`Authorization: Bearer KEY` or `X-Api-Key: KEY`); "
        "comma-separated for rotation. Protects every route except /ping and /health. Unset: no "
        "authentication (a warning at start-up when listening beyond loopback). Shown as *** everywhere.",
    )
    api_key_file: Path | None = Field(
        None,
        description="File with one API key per line (blank lines and # comments skipped), so the key "
        "need not sit in the environment; relative to the model directory. Adds to option.api_key.",
    )
    metrics_public: bool = Field(
        False, description="Serve /metrics without an API key (for a scraper on a trusted network)."
    )

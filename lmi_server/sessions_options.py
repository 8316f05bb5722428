"""The sticky-session keys (SageMaker stateful sessions)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class SessionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enable_stateful_sessions: bool = Field(
        True, description="Accept SageMaker NEW_SESSION / CLOSE requests and session headers."
    )
    sessions_expiration: int = Field(1200, gt=0, description="Seconds a session lives after its creation.")
    sessions_path: Path | None = Field(
        None, description="Directory where sessions are kept so that they survive a restart (default: memory only)."
    )

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
    max_sessions: int = Field(
        10000, gt=0, description="Most live (open, unexpired) sessions; NEW_SESSION beyond it gets 429."
    )
    sessions_sweep_interval: int = Field(
        60, gt=0, description="Seconds between sweeps that remove expired sessions from memory and disk."
    )

"""How much media a request may carry: the limits both the HTTP checks (`api/media.py`) and the
engine's own per-prompt limits (`runtime.defaults.vision_defaults`) are set from, kept below api/ so
the runtime reads them without importing the HTTP layer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_IMAGES = 8
"""Images per request when `option.limit_mm_per_prompt` does not say (vLLM's own default is far higher)."""


@dataclass(frozen=True)
class MediaPolicy:
    """What a chat message may carry: allowed URL hosts, image size and pixel limits, items per modality."""

    allowed_domains: frozenset[str] = frozenset()
    max_image_bytes: int = 10 * 1024 * 1024
    max_image_pixels: int = 16 * 1024 * 1024
    max_items: Mapping[str, int] = field(default_factory=lambda: {"image": DEFAULT_MAX_IMAGES})

    @classmethod
    def from_options(cls, *, allowed_domains: Iterable[str] | None, max_image_bytes: int, max_image_pixels: int,
                     limit_mm_per_prompt: Mapping[str, Any] | None) -> MediaPolicy:
        limits = {"image": DEFAULT_MAX_IMAGES}
        for modality, value in (limit_mm_per_prompt or {}).items():
            count = value.get("count") if isinstance(value, Mapping) else value
            if isinstance(count, int):
                limits[modality] = count
        return cls(frozenset(d.lower() for d in allowed_domains or ()), max_image_bytes, max_image_pixels, limits)

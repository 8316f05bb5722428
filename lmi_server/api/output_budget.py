"""The output budget of a front door whose client asks for more than the context holds.

Coding agents ask a fixed `max_tokens` (Claude Code: 32,000) whatever the model: vLLM answers a 400
when the prompt plus that budget exceeds the context. Here the budget is clamped to what fits
(context length minus prompt tokens), and the response says so in `CLAMP_HEADER`
(`32000->7800`). The prompt is counted by rendering it as vLLM will (the caller's job), and only
when the request could overflow: a byte-level tokenizer never makes more tokens than the body has
bytes, so `could_overflow` skips the render for requests that fit by a margin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

CLAMP_HEADER = "x-lmi-max-tokens-clamped"
TEMPLATE_MARGIN = 2048
"""Tokens a chat template may add around the body's text (roles, tool descriptions, special tokens)."""


def could_overflow(requested: int | None, body_bytes: int, max_model_len: int) -> bool:
    """False when the request surely fits: its budget plus an upper bound of its prompt."""
    if requested is None:
        return False
    return requested + body_bytes + TEMPLATE_MARGIN > max_model_len


def fitted(requested: int | None, prompt_tokens: int, max_model_len: int) -> int | None:
    """The budget to use instead of `requested`, or None when it fits as asked (or when the prompt
    alone fills the context: vLLM's own 400 then says that)."""
    if requested is None:
        return None
    room = max_model_len - prompt_tokens
    if room < 1 or requested <= room:
        return None
    return room


def clamp_header(requested: int, used: int) -> dict[str, str]:
    return {CLAMP_HEADER: f"{requested}->{used}"}


async def clamp(
    serving: Any, parsed: Any, size: int, field: str, prompt_tokens: Callable[[Any, Any], Awaitable[int | None]]
) -> dict[str, str]:
    """The budget in `parsed.<field>` lowered to the context's room when it is beyond it; the header
    that says so. `prompt_tokens(serving, parsed)`: the prompt as the front door's vLLM class counts it."""
    limit = serving.model_config.max_model_len
    requested = getattr(parsed, field)
    if not could_overflow(requested, size, limit):
        return {}
    used = fitted(requested, await prompt_tokens(serving, parsed) or limit, limit)
    if used is None:
        return {}
    setattr(parsed, field, used)
    return clamp_header(requested, used)

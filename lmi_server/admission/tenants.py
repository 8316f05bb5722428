"""Who a request belongs to, how much it weighs, how urgent it is, and whether its tenant's rate
limits let it in. Built once at start-up (`Tenants.from_config`) and used by the request pipeline
(`api/admit.py`). No HTTP here: the caller hands in the headers and what it knows of the request.

Tenant identity comes from the server's own view of the request, never from its body: the named
API key that authenticated it (api/auth.py), else the adapter that routing resolved for it (a
registered adapter, validated), else the header the operator names (`option.tenant_header`), else
one shared tenant, `default`.

Priority: LMI's `x-priority` header, else OpenAI's `priority` field (vLLM's: an integer, lower is
earlier). It orders the admission queue; with `option.scheduling_policy=priority` it also goes to
vLLM's scheduler, otherwise vLLM gets 0 (it refuses a priority under its fcfs policy).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lmi_server.admission.controller import BadPriority
from lmi_server.admission.limits import Limits, RateLimiter
from lmi_server.admission.queue import DEFAULT_TENANT

log = logging.getLogger(__name__)

PRIORITY_HEADER = "x-priority"
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
_HEADER_TENANT_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:@")


@dataclass
class Tenants:
    header: str | None = None
    weights: dict[str, float] = field(default_factory=dict)
    default_limits: Limits = field(default_factory=Limits)
    key_limits: dict[str, Limits] = field(default_factory=dict)
    vllm_priority: bool = False
    clock: Callable[[], float] = time.monotonic
    limiter: RateLimiter = field(init=False)

    def __post_init__(self) -> None:
        self.limiter = RateLimiter(self.limits, self.clock)

    @classmethod
    def from_config(cls, cfg: Any, entries: list[Any]) -> "Tenants":
        """`entries`: the API keys' entries (name, weight, requests_per_second, tokens_per_minute)."""
        opts = cfg.tenants
        weights = dict(opts.tenant_weights)
        key_limits: dict[str, Limits] = {}
        for e in entries:
            if e.weight is not None:
                weights[e.name] = e.weight
            if e.requests_per_second is not None or e.tokens_per_minute is not None:
                key_limits[e.name] = Limits(
                    e.requests_per_second if e.requests_per_second is not None else opts.tenant_requests_per_second,
                    e.tokens_per_minute if e.tokens_per_minute is not None else opts.tenant_tokens_per_minute,
                )
        return cls(
            header=opts.tenant_header.lower() if opts.tenant_header else None,
            weights=weights,
            default_limits=Limits(opts.tenant_requests_per_second, opts.tenant_tokens_per_minute),
            key_limits=key_limits,
            vllm_priority=cfg.engine_args.get("scheduling_policy") == "priority",
        )

    def limits(self, tenant: str) -> Limits:
        return self.key_limits.get(tenant, self.default_limits)

    def identify(self, key_name: str | None, headers: Any, adapter: str | None) -> str:
        """The request's tenant: named key, else adapter, else the operator's header, else default."""
        if key_name is not None:
            return key_name
        if adapter:
            return adapter
        if self.header:
            value = (headers.get(self.header) or "").strip()
            if value:
                # a client-chosen name: bounded and printable (it becomes a log field and a label)
                return "".join(c if c in _HEADER_TENANT_CHARS else "_" for c in value[:64])
        return DEFAULT_TENANT


def body_priority(value: Any) -> int:
    """The body's `priority` (vLLM's and OpenAI's field) as an integer, or BadPriority."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadPriority(f"priority: {str(value)[:40]!r} is not an integer (lower is earlier)")
    return value


def parse_priority(headers: Any, parsed: Any) -> int:
    """x-priority header, else the body's `priority` (vLLM's field), else 0."""
    raw = headers.get(PRIORITY_HEADER)
    if raw is not None:
        try:
            value = int(raw.strip())
        except ValueError:
            raise BadPriority(f"{PRIORITY_HEADER}: {raw[:40]!r} is not an integer (lower is earlier; e.g. x-priority: -1)") from None
    else:
        value = body_priority(getattr(parsed, "priority", 0) or 0)
    if not PRIORITY_RANGE[0] <= value <= PRIORITY_RANGE[1]:
        raise BadPriority(f"priority {value} is out of range [{PRIORITY_RANGE[0]}, {PRIORITY_RANGE[1]}]")
    return value


TEXT_KEYS = ("content", "text", "arguments", "output", "input", "system", "instructions")
"""Where a request's text lives: OpenAI chat/completion, Responses items (`output` of a tool
result) and Anthropic's typed blocks, as dicts or as the protocol's pydantic objects."""
PROMPT_FIELDS = ("prompt", "messages", "input", "system", "instructions")
OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if hasattr(value, "model_dump"):  # the protocols' typed messages and blocks
        value = value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return sum(_text_chars(v) for k, v in value.items() if k in TEXT_KEYS)
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, int) for v in value):
            return 4 * len(value)  # token ids: one each
        return sum(_text_chars(v) for v in value)
    return 0


def estimate_tokens(parsed: Any) -> int:
    """Tokens a request may use, known before it runs: its prompt at ~4 characters a token (the
    prompt, messages, Responses input and instructions, Anthropic's system), plus the most it may
    generate (max_tokens / max_completion_tokens / max_output_tokens; vLLM's default 16 when unset).
    A request type with none of those output fields (embeddings) generates nothing: its texts only."""
    text = sum(_text_chars(getattr(parsed, name, None)) for name in PROMPT_FIELDS)
    prompt_tokens = math.ceil(text / 4)
    if parsed is not None and not any(hasattr(parsed, name) for name in OUTPUT_FIELDS):
        return int(prompt_tokens)
    out = next((v for v in (getattr(parsed, name, None) for name in OUTPUT_FIELDS) if v), None) or 16
    n = getattr(parsed, "n", None) or 1
    return int(prompt_tokens + out * n)

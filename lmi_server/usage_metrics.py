"""Per-tenant and per-adapter usage series: what an operator of a multi-tenant LoRA endpoint bills
and alarms on (README, Metrics reference).

Why here: vLLM exports engine-wide figures (vllm:prompt_tokens, vllm:time_to_first_token_seconds,
...) and, with LoRA on, only `vllm:lora_requests_info` (which adapters are running or waiting, as
one label string). Who sent a request, and which adapter it used, is known only in the HTTP layer;
it hands both in (`api/admit.py`, `api/pipeline.py`). Label values are bounded
(`metric_labels`: the first N names, then "other"). No HTTP here.

Tokens counted: a JSON answer's `usage` (prompt_tokens/completion_tokens, or Anthropic's and the
Responses API's input_tokens/output_tokens). A stream's usage when it carries one (OpenAI's
`stream_options.include_usage`, Anthropic's message_start/message_delta, the Responses API's
response.completed); a stream without usage counts one generated token per event carrying text and
no prompt tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import Counter, Histogram

from lmi_server.metric_labels import BASE, adapter_label, tenant_label
from lmi_server.metrics import TOKEN_CHUNK

ADAPTER_REQUESTS = Counter(
    "lmi_adapter_requests", "Requests by adapter (\"base\": the base model) and admission outcome "
    "(admitted or the refusal's reason)", ["adapter", "outcome"],
)
ADAPTER_WAIT = Histogram(
    "lmi_adapter_queue_wait_seconds", "Time admitted requests waited for an engine slot, by adapter", ["adapter"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
TTFT = Histogram(
    "lmi_usage_time_to_first_token_seconds",
    "Streamed answers: time from request arrival to the first event carrying generated text, by tenant and adapter",
    ["tenant", "adapter"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PROMPT_TOKENS = Counter("lmi_usage_prompt_tokens", "Prompt tokens of answered requests, by tenant and adapter",
                        ["tenant", "adapter"])
GENERATION_TOKENS = Counter("lmi_usage_generation_tokens", "Generated tokens sent, by tenant and adapter",
                            ["tenant", "adapter"])


def adapter_name(adapter: Any) -> str:
    """The label of a request's adapter use (api/adapters/routing.AdapterUse or None: the base model)."""
    return adapter_label(getattr(adapter, "name", None) or BASE)


def admitted(adapter: Any, waited_s: float) -> None:
    label = adapter_name(adapter)
    ADAPTER_REQUESTS.labels(adapter=label, outcome="admitted").inc()
    ADAPTER_WAIT.labels(adapter=label).observe(waited_s)


def refused(adapter: Any, reason: str) -> None:
    ADAPTER_REQUESTS.labels(adapter=adapter_name(adapter), outcome=reason).inc()


def usage_of(value: Any, depth: int = 0) -> tuple[int, int] | None:
    """(prompt, generated) tokens of the first `usage` object in a JSON value, or None."""
    if not isinstance(value, dict) or depth > 3:
        return None
    usage = value.get("usage")
    if isinstance(usage, dict):
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        generated = usage.get("completion_tokens", usage.get("output_tokens"))
        if isinstance(prompt, int) or isinstance(generated, int):
            return (prompt if isinstance(prompt, int) else 0, generated if isinstance(generated, int) else 0)
    for key in ("message", "response"):  # Anthropic's message_start, the Responses API's events
        found = usage_of(value.get(key), depth + 1)
        if found is not None:
            return found
    return None


class Usage:
    """One answer's usage, counted once under its tenant and adapter labels."""

    def __init__(self, tenant: str | None, adapter: Any, arrived: float):
        self.labels = {"tenant": tenant_label(tenant or "default"), "adapter": adapter_name(adapter)}
        self.arrived = arrived
        self.prompt = 0
        self.generated = 0
        self.text_events = 0
        self.first = False

    def count(self, prompt: int, generated: int) -> None:
        PROMPT_TOKENS.labels(**self.labels).inc(max(0, prompt))
        GENERATION_TOKENS.labels(**self.labels).inc(max(0, generated))

    def json(self, body: Any) -> Any:
        """A JSON answer (vLLM's, dumped) passes through; its usage is counted."""
        found = usage_of(body)
        if found is not None:
            self.count(*found)
        return body

    def _chunk(self, chunk: bytes) -> None:
        for line in chunk.splitlines():
            if TOKEN_CHUNK.search(line):
                self.text_events += 1
                if not self.first:
                    self.first = True
                    TTFT.labels(**self.labels).observe(time.perf_counter() - self.arrived)
            if b'"usage"' not in line:
                continue
            try:
                found = usage_of(json.loads(line.removeprefix(b"data:").strip()))
            except ValueError:
                continue
            if found is not None:  # usage figures are cumulative: keep the largest
                self.prompt, self.generated = max(self.prompt, found[0]), max(self.generated, found[1])

    async def stream(self, body: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """A response stream passed through: TTFT at its first text event, tokens when it ends."""
        try:
            async for chunk in body:
                self._chunk(chunk if isinstance(chunk, bytes) else str(chunk).encode("utf-8"))
                yield chunk
        finally:
            self.count(self.prompt, self.generated or self.text_events)

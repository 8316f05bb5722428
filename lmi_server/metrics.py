"""Prometheus metrics that vLLM does not already export (the /metrics route: `api/metrics_route.py`).

vLLM registers its engine metrics (vllm:*) in the default registry of this process; this module
adds the HTTP layer's view: requests by route and status, latency, and time to first token as
the client sees it (first streamed chunk that carries generated text).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


REQUESTS = Counter("lmi_requests", "HTTP requests by route and status", ["route", "status"])
LATENCY = Histogram(
    "lmi_request_latency_seconds",
    "Time from request arrival to the last byte of the response",
    ["route"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
TTFT = Histogram(
    "lmi_time_to_first_token_seconds",
    "Streaming responses: time from request arrival to the first chunk carrying generated text",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

DERIVED = CollectorRegistry(auto_describe=True)

# A streamed chunk carries text when an OpenAI delta/choice, an Anthropic text delta or an LMI token
# has non-empty text, or a Responses API delta event a non-empty delta.
TOKEN_CHUNK = re.compile(rb'"(?:content|text|delta)":\s*"[^"]')

def render() -> bytes:
    """The exposition text of this process's metrics: vLLM's, ours and the derived ones."""
    return generate_latest(REGISTRY) + generate_latest(DERIVED)


def _sum_samples(name: str) -> float | None:
    """Sum of a counter's samples over all label sets, read from the default registry."""
    total = None
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name:
                total = (total or 0.0) + sample.value
    return total


class SpecDecodeCollector:
    """Acceptance rate and mean acceptance length, derived from vLLM's speculative counters.

    Lives in its own registry (DERIVED) because it reads the default one while collecting."""

    def collect(self):
        drafts = _sum_samples("vllm:spec_decode_num_drafts_total")
        drafted = _sum_samples("vllm:spec_decode_num_draft_tokens_total")
        accepted = _sum_samples("vllm:spec_decode_num_accepted_tokens_total")
        if drafts is None or drafted is None or accepted is None:
            return
        rate = GaugeMetricFamily("lmi_spec_decode_acceptance_rate", "Accepted draft tokens / drafted tokens since start")
        rate.add_metric([], accepted / drafted if drafted else 0.0)
        yield rate
        length = GaugeMetricFamily(
            "lmi_spec_decode_mean_acceptance_length",
            "Tokens emitted per verification step: 1 + accepted / drafts (1.0 = no gain)",
        )
        length.add_metric([], 1.0 + accepted / drafts if drafts else 1.0)
        yield length


class MetricsMiddleware:
    """Pure ASGI middleware (works with streaming and client disconnects). `label`: a request
    path -> its route's label; the app hands in the route table's (`api/routes.label_for`: each
    route under its own name, "other" for a path no route serves, so /metrics stays bounded)."""

    def __init__(self, app, label: Callable[[str], str]):
        self.app = app
        self.label = label

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = self.label(scope["path"])
        start = time.perf_counter()
        status = {"code": 500, "streaming": False, "first": False}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                for name, value in message.get("headers", []):
                    if name.lower() == b"content-type" and (b"event-stream" in value or b"jsonlines" in value):
                        status["streaming"] = True
            elif message["type"] == "http.response.body" and status["streaming"] and not status["first"]:
                if TOKEN_CHUNK.search(message.get("body", b"")):
                    status["first"] = True
                    TTFT.labels(route).observe(time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            REQUESTS.labels(route, str(status["code"])).inc()
            LATENCY.labels(route).observe(time.perf_counter() - start)


class LMCacheCollector:
    """Scrapes the LMCache MP server's own counters at /metrics time and re-exports them."""

    # Scrapes run in a worker thread (see `metrics()`), so the cache server's HTTP round trip never
    # blocks the event loop. Readings are not reused across scrapes: a scrape right after a
    # request must see that request's hits. Concurrent scrapes share one reading at a time.
    CACHE_S = 0.0

    def __init__(self, plan, supervisor):
        self.plan = plan
        self.supervisor = supervisor
        self._lock = threading.Lock()
        self._cached: tuple[float, dict | None] = (0.0, None)

    def _stats(self):
        from lmi_server.kvcache.stats import read_lmcache_stats

        with self._lock:
            at, stats = self._cached
            if self.CACHE_S and time.monotonic() - at < self.CACHE_S:
                return stats
            try:
                stats = read_lmcache_stats(self.plan.metrics_url, timeout_s=1.0)
            except OSError:
                stats = None  # server restarting: the series reappear on the next scrape
            self._cached = (time.monotonic(), stats)
            return stats

    def collect(self):
        restarts = CounterMetricFamily("lmi_lmcache_server_restarts", "Times the LMCache cache server was restarted")
        restarts.add_metric([], float(getattr(self.supervisor, "restarts", 0)))
        yield restarts
        up = GaugeMetricFamily("lmi_lmcache_server_up", "1 while the LMCache cache server process is alive")
        up.add_metric([], 1.0 if self.supervisor is not None and self.supervisor.alive else 0.0)
        yield up
        if not self.plan.metrics_url:
            return
        stats = self._stats()
        if stats is None:
            return
        for key, help_text in (
            ("lookup_requested_tokens", "Prompt tokens looked up in LMCache"),
            ("lookup_hit_tokens", "Prompt tokens found in LMCache (any tier)"),
            ("lookup_hit_l1_tokens", "Prompt tokens found in the CPU RAM tier"),
            ("lookup_hit_l2_tokens", "Prompt tokens found in a second tier (disk/remote)"),
            ("l1_written_chunks", "Chunks written to the CPU RAM tier"),
            ("l2_stored_chunks", "Chunks stored in second tiers"),
        ):
            family = CounterMetricFamily(f"lmi_lmcache_{key}", help_text)
            family.add_metric([], float(stats.get(key, 0.0)))
            yield family
        hit_rate = GaugeMetricFamily("lmi_lmcache_hit_rate", "Hit tokens / requested tokens since start")
        hit_rate.add_metric([], float(stats.get("hit_rate", 0.0)))
        yield hit_rate
        stored = GaugeMetricFamily("lmi_lmcache_stored_bytes", "KV bytes held per tier", labels=["tier"])
        stored.add_metric(["cpu"], float(stats.get("l1_bytes", 0.0)))
        for name, value in dict(stats.get("l2_bytes_by_adapter") or {}).items():
            stored.add_metric([str(name)], float(value))
        yield stored


def register_lmcache_collector(plan, supervisor):
    if plan is None or plan.mode != "mp":
        return None
    collector = LMCacheCollector(plan, supervisor)
    REGISTRY.register(collector)
    return collector


class BlendCollector:
    """What KV blending did, from the counters the engine's worker keeps beside the segment store."""

    HELP = {
        "blended_requests": ("lmi_blend_requests", "Prompts served by KV blending (CacheBlend)"),
        "stored_segments": ("lmi_blend_stored_segments", "Segments whose KV was stored for blending"),
        "missed_loads": ("lmi_blend_missed_loads", "Cached segments gone between lookup and load (computed instead)"),
        "blend_seconds": ("lmi_blend_seconds", "Seconds spent in blended prefills (load, forward, copy, store)"),
    }

    def __init__(self, store_dir: str) -> None:
        self.store_dir = store_dir

    def collect(self):
        from lmi_server.kvcache.blend.store import BlendCounters, store_bytes

        values = BlendCounters.read(self.store_dir)
        tokens = CounterMetricFamily(
            "lmi_blend_tokens", "Prompt tokens of blended prompts: KV reused, reused but recomputed at the check "
            "layer, and computed (segments that missed, separators, the query)", labels=["kind"])
        for kind in ("reused", "recomputed", "computed"):
            tokens.add_metric([kind], values[f"{kind}_tokens"])
        yield tokens
        for key, (name, help_text) in self.HELP.items():
            family = CounterMetricFamily(name, help_text)
            family.add_metric([], values[key])
            yield family
        stored = GaugeMetricFamily("lmi_blend_store_bytes", "Bytes of segment KV held for blending")
        stored.add_metric([], float(store_bytes(self.store_dir)))
        yield stored


def register_blend_collector(blend: dict | None):
    """The blend counters in /metrics when blending is on (`Runtime.blend`)."""
    if not blend or not blend.get("store_dir"):
        return None
    collector = BlendCollector(blend["store_dir"])
    REGISTRY.register(collector)
    return collector


def unregister_collector(collector) -> None:
    if collector is not None:
        REGISTRY.unregister(collector)


DERIVED.register(SpecDecodeCollector())

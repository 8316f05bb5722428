"""LMCache hit and storage numbers for /metrics, read from the MP server's own Prometheus endpoint.

The MP server publishes OpenTelemetry counters on `--prometheus-port` (`KVCachePlan.metrics_url`):
tokens looked up and hit (split L1/L2), chunks written, bytes held in L1 and in each L2 adapter.
vLLM's own Prometheus output adds the engine-side view of the connector:
`vllm:external_prefix_cache_queries` / `vllm:external_prefix_cache_hits` (tokens) and
`vllm:lmcache_mp_lookup_duration_seconds`; those come for free with vLLM's metrics.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# Our name -> the MP server's sample name (OTel name with '.' -> '_', unit and _total appended).
COUNTERS = {
    "lookup_requested_tokens": "lmcache_mp_lookup_requested_tokens_total",
    "lookup_hit_tokens": "lmcache_mp_lookup_hit_tokens_total",
    "lookup_hit_l1_tokens": "lmcache_mp_lookup_hit_l1_tokens_total",
    "lookup_hit_l2_tokens": "lmcache_mp_lookup_hit_l2_tokens_total",
    "l1_written_chunks": "lmcache_mp_l1_write_chunks_total",
    "l1_evicted_chunks": "lmcache_mp_l1_evicted_chunks_total",
    "l2_stored_chunks": "lmcache_mp_l2_store_completed_objects_chunks_total",
}
GAUGES = {
    "l1_bytes": "lmcache_mp_l1_memory_usage_bytes",
    "l2_bytes": "lmcache_mp_l2_usage_bytes",
}


def parse_lmcache_metrics(text: str) -> dict[str, float | dict[str, float]]:
    """The numbers above from a Prometheus text page (missing counters read 0: OTel publishes
    a counter only after its first increment). `l2_bytes_by_adapter` is keyed by `l2_name`."""
    samples: dict[str, float] = {}
    l2_by_adapter: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + s.value
            if s.name == GAUGES["l2_bytes"]:
                key = s.labels.get("l2_name", "l2")
                l2_by_adapter[key] = l2_by_adapter.get(key, 0.0) + s.value
    out: dict[str, float | dict[str, float]] = {k: samples.get(v, 0.0) for k, v in COUNTERS.items()}
    out.update({k: samples.get(v, 0.0) for k, v in GAUGES.items()})
    out["l2_bytes_by_adapter"] = l2_by_adapter
    requested = float(out["lookup_requested_tokens"])  # type: ignore[arg-type]
    out["hit_rate"] = float(out["lookup_hit_tokens"]) / requested if requested else 0.0  # type: ignore[arg-type]
    return out


def read_lmcache_stats(metrics_url: str, timeout_s: float = 2.0) -> dict[str, float | dict[str, float]]:
    """Scrape the MP server's /metrics (`KVCachePlan.metrics_url`) and return the numbers."""
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as resp:  # noqa: S310 - local URL from the plan
        return parse_lmcache_metrics(resp.read().decode("utf-8"))

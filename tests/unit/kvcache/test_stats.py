import pytest

from lmi_server.kvcache.stats import parse_lmcache_metrics

pytestmark = pytest.mark.unit

# Shape of the MP server's /metrics after a cold and a warm request of 5,100 tokens
# (numbers as observed with the 4-layer demo model; OTel counters carry _total).
PAGE = """\
# HELP lmcache_mp_lookup_requested_tokens_total Tokens submitted for lookup
# TYPE lmcache_mp_lookup_requested_tokens_total counter
lmcache_mp_lookup_requested_tokens_total 9728.0
# TYPE lmcache_mp_lookup_hit_tokens_total counter
lmcache_mp_lookup_hit_tokens_total 4864.0
# TYPE lmcache_mp_lookup_hit_l1_tokens_total counter
lmcache_mp_lookup_hit_l1_tokens_total 4864.0
# TYPE lmcache_mp_l1_write_chunks_total counter
lmcache_mp_l1_write_chunks_total 19.0
# TYPE lmcache_mp_l1_memory_usage_bytes gauge
lmcache_mp_l1_memory_usage_bytes{backend="dram",l1_tag="_default"} 9961472.0
# TYPE lmcache_mp_l2_usage_bytes gauge
lmcache_mp_l2_usage_bytes{l2_name="fs"} 9961472.0
lmcache_mp_l2_usage_bytes{l2_name="resp"} 100.0
# TYPE lmcache_mp_l2_store_completed_objects_chunks_total counter
lmcache_mp_l2_store_completed_objects_chunks_total{adapter="fs"} 19.0
"""


def test_parse_counts_hits_and_bytes_per_tier():
    s = parse_lmcache_metrics(PAGE)
    assert s["lookup_requested_tokens"] == 9728
    assert s["lookup_hit_tokens"] == 4864
    assert s["lookup_hit_l1_tokens"] == 4864 and s["lookup_hit_l2_tokens"] == 0  # not published yet -> 0
    assert s["hit_rate"] == 0.5
    assert s["l1_bytes"] == 9961472 and s["l1_written_chunks"] == 19
    assert s["l2_bytes_by_adapter"] == {"fs": 9961472.0, "resp": 100.0}
    assert s["l2_bytes"] == 9961572 and s["l2_stored_chunks"] == 19


def test_empty_page_is_all_zero():
    s = parse_lmcache_metrics("")
    assert s["lookup_hit_tokens"] == 0 and s["hit_rate"] == 0.0 and s["l2_bytes_by_adapter"] == {}

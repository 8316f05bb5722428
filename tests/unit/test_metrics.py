from prometheus_client import REGISTRY, Counter, generate_latest

from lmi_server import metrics


def test_spec_decode_derived_series_follow_vllm_counters():
    assert b"lmi_spec_decode" not in generate_latest(metrics.DERIVED)  # absent until vLLM reports
    drafts = Counter("vllm:spec_decode_num_drafts", "d", ["engine"])
    drafted = Counter("vllm:spec_decode_num_draft_tokens", "d", ["engine"])
    accepted = Counter("vllm:spec_decode_num_accepted_tokens", "a", ["engine"])
    try:
        drafts.labels("0").inc(10)
        drafted.labels("0").inc(30)
        accepted.labels("0").inc(21)
        text = generate_latest(metrics.DERIVED).decode()
        assert "lmi_spec_decode_acceptance_rate 0.7" in text
        assert "lmi_spec_decode_mean_acceptance_length 3.1" in text
    finally:
        for c in (drafts, drafted, accepted):
            REGISTRY.unregister(c)


def test_route_labels_are_bounded():
    assert metrics.route_label("/v1/completions") == "/v1/completions"
    assert metrics.route_label("/adapters/foo") == "/adapters"
    assert metrics.route_label("/random/" + "x" * 50) == "other"

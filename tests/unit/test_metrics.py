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
    from lmi_server.api.routes import label_for  # the route table's labels, handed to MetricsMiddleware

    assert label_for("/v1/completions") == "/v1/completions"
    assert label_for("/adapters/foo") == "/adapters/{name}"  # its route's own label, not the name sent
    assert label_for("/random/" + "x" * 50) == "other"

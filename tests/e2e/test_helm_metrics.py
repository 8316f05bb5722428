"""The series the chart's autoscalers read (KEDA queries, HPA metric names) exist on a live
server's /metrics, the way the chart's PodMonitor scrapes it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_helm_chart import chart_autoscaler_metrics, one, rendered


def test_autoscaler_metrics_exist_on_a_live_server(server):
    objs = rendered("gpu-hub-keda")
    endpoint = one(objs, "PodMonitor", "server")["spec"]["podMetricsEndpoints"][0]
    r = httpx.get(server.base_url + endpoint["path"], timeout=30)
    assert r.status_code == 200, r.text[:500]
    exported = {s.name for family in text_string_to_metric_families(r.text) for s in family.samples}
    wanted = chart_autoscaler_metrics()
    assert wanted == {"vllm:num_requests_waiting", "lmi_queue_depth"}
    assert wanted <= exported, f"missing on /metrics: {sorted(wanted - exported)}"

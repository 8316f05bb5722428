"""The chart's Grafana dashboard (deploy/helm/lmi-server/dashboards/lmi-server.json): every metric
name its PromQL reads is one the server exports (our collectors, read from prometheus_client's
registry, or vLLM's, read from vLLM's source), and the chart ships it as a valid ConfigMap for
Grafana's dashboard sidecar."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "helm" / "lmi-server" / "dashboards" / "lmi-server.json"
# The modules that register the series of /metrics (vLLM's are read from its source below).
METRIC_MODULES = ("lmi_server.metrics", "lmi_server.usage_metrics", "lmi_server.admission.controller",
                  "lmi_server.adapters.registry")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",), "summary": ("_count", "_sum", "")}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def exported(name: str, kind: str) -> set[str]:
    return {name + suffix for suffix in SUFFIXES.get(kind, ("",))}


def our_metric_names() -> set[str]:
    for module in METRIC_MODULES:
        importlib.import_module(module)
    names: set[str] = set()
    for family in REGISTRY.collect():
        names |= exported(family.name, family.type)
    return names


def vllm_metric_names() -> set[str]:
    """vLLM's Prometheus series, as its stat logger registers them (gauges, counters, histograms)."""
    import vllm.v1.metrics.loggers as loggers

    source = Path(loggers.__file__).read_text()
    found = re.findall(r'self\._(gauge|counter|histogram)_cls\(\s*name="(vllm:[a-z0-9_:]+)"', source)
    assert len(found) > 30, "vLLM's stat logger changed shape: the dashboard's names cannot be checked"
    names: set[str] = set()
    for kind, name in found:
        names |= exported(name, kind)
    return names


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads: identifiers once strings, label matchers,
    `by (...)` groupings and ranges are removed, less functions and keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word, rest = match.group(), text[match.end():].lstrip()
        if rest.startswith("(") or word in KEYWORDS:
            continue
        names.add(word)
    return names


def dashboard_queries(dashboard: dict) -> list[str]:
    queries = []
    for panel in dashboard["panels"]:
        for sub in [panel] + panel.get("panels", []):
            queries += [t["expr"] for t in sub.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            queries.append(query["query"])
    return queries


def test_the_name_extraction_sees_through_promql():
    expr = 'histogram_quantile(0.95, sum by (le, tenant) (rate(lmi_x_bucket{tenant=~"a|b", le!="1"}[5m]))) / on (tenant) vllm:y'
    assert metric_names(expr) == {"lmi_x_bucket", "vllm:y"}
    assert metric_names("label_values(lmi_tenant_requests_total, tenant)") == {"lmi_tenant_requests_total", "tenant"}


def test_every_dashboard_metric_is_exported():
    dashboard = json.loads(DASHBOARD.read_text())
    known = our_metric_names() | vllm_metric_names()
    used: set[str] = set()
    for query in dashboard_queries(dashboard):
        if query.startswith("label_values("):  # label_values(metric, label): the label is not a series
            used.add(query[len("label_values("):].split(",")[0].strip())
        else:
            used |= metric_names(query)
    assert not used - known, f"dashboard reads series nobody exports: {sorted(used - known)}"
    # the per-tenant and per-adapter series and vLLM's engine metrics each have a panel
    for name in ("lmi_usage_time_to_first_token_seconds_bucket", "lmi_tenant_queue_wait_seconds_bucket",
                 "lmi_adapter_queue_wait_seconds_bucket", "lmi_usage_prompt_tokens_total",
                 "lmi_usage_generation_tokens_total", "lmi_tenant_requests_total", "lmi_adapter_requests_total",
                 "lmi_adapter_resident", "lmi_adapter_loads_total", "lmi_adapter_evictions_total",
                 "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:lora_requests_info"):
        assert name in used, f"no panel reads {name}"


def test_panels_have_unique_ids_and_a_datasource():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar():
    chart = pytest.importorskip("tests.integration.test_helm_chart")
    assert not any(o["kind"] == "ConfigMap" and "lmi-server.json" in o.get("data", {}) for o in chart.render_values({}))
    values = {"metrics": {"grafanaDashboard": {"enabled": True, "labels": {"team": "llm"}, "annotations": {"grafana_folder": "LLM"}}}}
    cms = [o for o in chart.render_values(values) if o["kind"] == "ConfigMap" and "lmi-server.json" in o.get("data", {})]
    assert len(cms) == 1
    cm = cms[0]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["labels"]["team"] == "llm"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert json.loads(cm["data"]["lmi-server.json"]) == json.loads(DASHBOARD.read_text())
    for version in chart.KUBE_VERSIONS:
        chart.validate_object(cm, version)

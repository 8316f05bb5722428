"""The chart's multi-node mode: `multiNode.enabled` renders a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)
instead of the server Deployment, validated by Helm's engine and by the LWS CRD's own OpenAPI schema
(tests/data/crds, strict); leader and worker templates are the server pod, the group restarts as a
whole, the Service, router and PodMonitor select leaders only, the autoscaler scales groups; and the
single-node render is what it was."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_helm_chart import (
    CASES, CHART, KUBE_VERSIONS, MULTI_NODE, NAMESPACE, RELEASE, case_values, crd_schemas, find, helm, one,
    render_values, validate_object,
)

LEADER = {"leaderworkerset.sigs.k8s.io/worker-index": "0"}


def multi(extra: dict | None = None) -> list[dict]:
    values = json.loads(json.dumps(MULTI_NODE))
    for key, value in (extra or {}).items():
        values[key] = {**values.get(key, {}), **value}
    return render_values(values)


def test_multi_node_renders_a_leaderworkerset_in_place_of_the_deployment():
    objs = multi()
    assert not find(objs, "Deployment", "server")
    lws = one(objs, "LeaderWorkerSet", "server")
    tpl = lws["spec"]["leaderWorkerTemplate"]
    assert tpl["size"] == 2 and tpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["replicas"] == 2  # server.replicas counts groups
    for role in ("leaderTemplate", "workerTemplate"):
        pod = tpl[role]["spec"]
        container = next(c for c in pod["containers"] if c["name"] == "lmi-server")
        assert container["readinessProbe"]["httpGet"]["path"] == "/ping"  # workers answer it: 503 until joined
        assert container["startupProbe"]["httpGet"]["path"] == "/ping"
        assert container["livenessProbe"]["httpGet"]["path"] == "/live"
        assert any(v["name"] == "dshm" and v["emptyDir"]["medium"] == "Memory" for v in pod["volumes"])


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_multi_node_object_is_valid(kube_version):
    for obj in multi({"autoscaling": {"enabled": True}}):
        validate_object(obj, kube_version)


def test_the_lws_crd_schema_knows_our_fields_and_refuses_others():
    schema = crd_schemas()[("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")]
    assert "restartPolicy" in schema["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
    lws = one(multi(), "LeaderWorkerSet", "server")
    lws["spec"]["leaderWorkerTemplate"]["restartPolcy"] = "RecreateGroupOnPodRestart"
    with pytest.raises(Exception, match="restartPolcy"):
        validate_object(lws, "1.33.0")
    lws = one(multi(), "LeaderWorkerSet", "server")
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(Exception, match="Always"):
        validate_object(lws, "1.33.0")


def test_service_router_and_podmonitor_select_leaders_only():
    objs = multi({"metrics": {"podMonitor": {"enabled": True}}})
    assert one(objs, "Service", "server")["spec"]["selector"].items() >= LEADER.items()
    assert one(objs, "PodMonitor", "server")["spec"]["selector"]["matchLabels"].items() >= LEADER.items()
    router = one(objs, "Deployment", "router")["spec"]["template"]["spec"]["containers"][0]
    args = router.get("args") or router.get("command")
    assert "leaderworkerset.sigs.k8s.io/worker-index=0" in args


@pytest.mark.parametrize("kind", ["hpa", "keda"])
def test_the_autoscaler_scales_groups(kind):
    objs = multi({"autoscaling": {"enabled": True, "kind": kind}})
    target_kind = "HorizontalPodAutoscaler" if kind == "hpa" else "ScaledObject"
    ref = one(objs, target_kind)["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")


@pytest.mark.parametrize("size", [1, "2"])
def test_a_group_size_below_two_or_not_a_number_is_refused(size):
    with pytest.raises(Exception, match="multiNode/size"):
        render_values({"multiNode": {"enabled": True, "size": size}})


# Rendered before the multi-node mode existed (same chart, every case of the matrix): the objects of a
# single-node release must not change.
@pytest.mark.parametrize("case", sorted(CASES))
def test_single_node_render_has_no_group_objects_or_labels(case):
    files = helm.Chart.load(str(CHART)).render(case_values(case), name=RELEASE, namespace=NAMESPACE, is_install=True)
    text = "".join(files.values())
    assert "leaderworkerset" not in text.lower() and "LWS_" not in text
    objs = render_values(case_values(case))
    assert one(objs, "Deployment", "server")["spec"]["template"]["spec"]["containers"]

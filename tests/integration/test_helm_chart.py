"""The Helm chart deploy/helm/lmi-server, checked without a cluster.

- Rendered with Helm's own engine (helm-python-sdk) for a matrix of values files (the defaults, the
  CPU profile, every ci/*-values.yaml) and linted strictly for Kubernetes 1.29-1.33.
- Every rendered object validated strictly (unknown fields are errors) against Kubernetes' published
  schemas for 1.29-1.33 (kubernetes-validate); the custom resources (KEDA ScaledObject, PodMonitor)
  against their CRDs' openAPIV3Schema (tests/data/crds), made strict the same way.
- Negative cases: a misspelt field, a string where an integer belongs, values that values.schema.json
  or the chart's own checks refuse, each with the message a user sees.
- Contracts with the real programs: the rendered serving.properties, LMCache YAML and environment
  load with `lmi-server config`; the LMCache YAML with LMCache's own loader; the router's arguments
  with vllm-router's own parser; the probe paths answer as the chart expects on the real app in
  every state (starting, ready, draining, engine dead).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import yaml

helm = pytest.importorskip("helm_python.chart", reason="pip install helm-python-sdk (the test extra)")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
from kubernetes_validate.utils import SchemaNotFoundError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "lmi-server"
CRDS = REPO / "tests" / "data" / "crds"
RELEASE, NAMESPACE = "lmi", "llm"
KUBE_VERSIONS = ["1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0"]
CASES = {"default": None, "cpu": CHART / "values-cpu.yaml"} | {
    p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))
}
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "PodMonitor"),
                ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")}
# Multi-node groups (tests/integration/test_helm_multinode.py): rendered besides the matrix.
MULTI_NODE = {"multiNode": {"enabled": True, "size": 2}}


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def case_values(case: str) -> dict:
    path = CASES[case]
    return yaml.safe_load(path.read_text()) if path else {}


def merged_values(case: str) -> dict:
    """values.yaml with the case's file on top (Helm's coalescing: maps merge, the rest replaces)."""

    def merge(base, top):
        out = dict(base)
        for k, v in top.items():
            out[k] = merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
        return out

    return merge(yaml.safe_load((CHART / "values.yaml").read_text()), case_values(case))


def render_values(values: dict) -> list[dict]:
    files = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objs = []
    for path, text in sorted(files.items()):
        if path.endswith(".yaml"):
            objs += [d for d in yaml.safe_load_all(text) if d]
    return objs


@functools.cache
def _rendered(case: str) -> str:
    return json.dumps(render_values(case_values(case)))


def rendered(case: str) -> list[dict]:
    return json.loads(_rendered(case))


def find(objs: list[dict], kind: str, component: str | None = None) -> list[dict]:
    return [
        o for o in objs
        if o["kind"] == kind and (component is None or o["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]


def one(objs: list[dict], kind: str, component: str | None = None) -> dict:
    found = find(objs, kind, component)
    assert len(found) == 1, f"expected one {kind} ({component}), found {len(found)}"
    return found[0]


def server_container(objs: list[dict]) -> dict:
    pod = one(objs, "Deployment", "server")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "lmi-server")


def properties(objs: list[dict]) -> dict[str, str]:
    cm = next(o for o in find(objs, "ConfigMap") if "serving.properties" in o["data"])
    lines = [ln for ln in cm["data"]["serving.properties"].splitlines() if ln.strip() and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


# ---------------------------------------------------------------------------------------------
# Strict schemas for custom resources
# ---------------------------------------------------------------------------------------------


def _strict(schema: dict) -> dict:
    """The CRD schema with unknown fields refused, as the API server's strict field validation
    does: every object that lists its properties and does not keep unknown fields gets
    additionalProperties: false."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object" and "properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    # metadata is checked by the API server's ObjectMeta, not by the CRD's (empty) schema
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            out[key] = _strict(version["schema"]["openAPIV3Schema"])
    return out


def validate_object(obj: dict, kube_version: str) -> None:
    """Raises when the object is not valid for that Kubernetes version (strict)."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CUSTOM_KINDS:
        jsonschema.validate(obj, crd_schemas()[key], cls=jsonschema.Draft7Validator)
        return
    kubernetes_validate.validate(obj, kube_version, strict=True)


# ---------------------------------------------------------------------------------------------
# Render, lint, validate: the matrix
# ---------------------------------------------------------------------------------------------


def test_the_matrix_covers_every_template_and_kind():
    kinds = {o["kind"] for case in CASES for o in rendered(case)}
    assert kinds == {
        "ConfigMap", "Secret", "ServiceAccount", "Service", "Deployment", "PodDisruptionBudget", "Role",
        "RoleBinding", "NetworkPolicy", "ScaledObject", "HorizontalPodAutoscaler", "PodMonitor",
    }
    templates = {p.name for p in (CHART / "templates").glob("*.yaml")}
    names = set()
    for values in [case_values(case) for case in CASES] + [MULTI_NODE]:
        files = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        names |= {Path(p).name for p, text in files.items() if p.endswith(".yaml") and any(yaml.safe_load_all(text))}
    assert templates <= names, f"templates never rendered by the matrix: {sorted(templates - names)}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_template_per_object(case):
    files = helm.Chart.load(str(CHART)).render(case_values(case), name=RELEASE, namespace=NAMESPACE, is_install=True)
    for path, text in files.items():
        if path.endswith(".yaml"):
            assert len([d for d in yaml.safe_load_all(text) if d]) <= 1, path


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_is_clean_in_strict_mode(case, kube_version):
    report = helm.lint(str(CHART), case_values(case), strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}")
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_object_is_valid_for_the_kubernetes_version(case, kube_version):
    objs = rendered(case)
    assert objs
    for obj in objs:
        try:
            validate_object(obj, kube_version)
        except SchemaNotFoundError:
            pytest.fail(f"{obj['apiVersion']} {obj['kind']} has no schema in Kubernetes {kube_version} (and no CRD here)")
        except Exception as exc:  # noqa: BLE001 - report which object and why
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} ({case}, {kube_version}): {exc}")


def test_custom_resources_are_checked_against_their_crds():
    objs = rendered("gpu-hub-keda")
    so, pm = one(objs, "ScaledObject"), one(objs, "PodMonitor", "server")
    for obj in (so, pm):
        validate_object(obj, "1.33.0")
    # the CRD schemas are not empty shells: they know the fields we use and refuse others
    assert "minReplicaCount" in crd_schemas()[("keda.sh/v1alpha1", "ScaledObject")]["properties"]["spec"]["properties"]
    assert "podTargetLabels" in crd_schemas()[("monitoring.coreos.com/v1", "PodMonitor")]["properties"]["spec"]["properties"]


# ---------------------------------------------------------------------------------------------
# Negative cases
# ---------------------------------------------------------------------------------------------


def _mutated(case: str, kind: str, component: str | None, change) -> dict:
    obj = copy.deepcopy(one(rendered(case), kind, component))
    change(obj)
    return obj


@pytest.mark.parametrize(
    "kind, component, change, message",
    [
        ("Deployment", "server",
         lambda o: o["spec"]["template"]["spec"]["containers"][0].__setitem__("readinesProbe", {"httpGet": {"path": "/ping", "port": 8080}}),
         "readinesProbe"),
        ("Deployment", "server", lambda o: o["spec"].__setitem__("replicas", "2"), "'2' is not of type 'integer'"),
        ("Service", "router", lambda o: o["spec"]["ports"][0].__setitem__("port", "eighty"), "'eighty' is not of type 'integer'"),
        ("PodDisruptionBudget", "server", lambda o: o["spec"].__setitem__("maxUnavalable", 1), "maxUnavalable"),
        ("ScaledObject", None, lambda o: o["spec"].__setitem__("minReplicaCont", 1), "minReplicaCont"),
        ("ScaledObject", None, lambda o: o["spec"].__setitem__("pollingInterval", "15"), "'15' is not of type 'integer'"),
        ("PodMonitor", "server", lambda o: o["spec"]["podMetricsEndpoints"][0].__setitem__("intervl", "15s"), "intervl"),
    ],
    ids=["misspelt-probe", "string-replicas", "string-port", "misspelt-pdb", "misspelt-scaledobject",
         "string-polling-interval", "misspelt-podmonitor"],
)
@pytest.mark.parametrize("kube_version", ["1.29.0", "1.33.0"])
def test_invalid_objects_are_refused(kind, component, change, message, kube_version):
    obj = _mutated("gpu-hub-keda", kind, component, change)
    with pytest.raises(Exception) as excinfo:
        validate_object(obj, kube_version)
    assert message in str(excinfo.value)


def test_a_misspelt_field_passed_through_values_is_refused_after_rendering():
    values = {"server": {"extraEnv": [{"name": "FOO", "vaule": "1"}]}}
    deployment = one(render_values(values), "Deployment", "server")
    with pytest.raises(Exception, match="vaule"):
        validate_object(deployment, "1.32.0")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"server": {"replicas": "two"}}, "at '/server/replicas': got string, want integer"),
        ({"server": {"replicsa": 2}}, "additional properties 'replicsa' not allowed"),
        ({"router": {"policy": "sticky"}}, "at '/router/policy': value must be one of"),
        ({"server": {"probes": {"liveness": {"path": "/ping", "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 5}}}},
         "at '/server/probes/liveness/path'"),
        ({"servingProperties": {"option.model_id": "x"}}, "invalid propertyName 'option.model_id'"),
        ({"servingProperties": {"max_model_len": "4096"}}, "invalid propertyName 'max_model_len'"),
        ({"model": {"source": "s3", "id": "https://bucket/model"}}, "at '/model/id'"),
        ({"model": {"source": "s3", "id": ""}}, "at '/model/id'"),
        ({"model": {"source": "ftp", "id": "x"}}, "at '/model/source': value must be one of"),
        ({"hashSeed": "random"}, "at '/hashSeed'"),
        ({"lmcache": {"config": {"chunk_size": "256"}}}, "at '/lmcache/config/chunk_size': got string, want integer"),
        ({"lmcache": {"config": {"remote_url": "redis://x:1"}}}, "invalid propertyName 'remote_url'"),
        ({"sharedCache": {"mode": "external", "external": {"url": "redis://user:pw@cache:6379"}}}, "at '/sharedCache/external/url'"),
        ({"apiKeys": {"keys": ["short"]}}, "at '/apiKeys/keys/0'"),
        ({"autoscaling": {"kind": "vpa"}}, "at '/autoscaling/kind': value must be one of"),
        ({"server": {"gpu": {"count": -1}}}, "at '/server/gpu/count'"),
        ({"sharedCache": {"sessions": "yes"}}, "at '/sharedCache/sessions': got string, want boolean"),
    ],
)
def test_values_schema_refuses_bad_values_with_a_message(values, message):
    with pytest.raises(Exception) as excinfo:
        render_values(values)
    assert type(excinfo.value).__name__ == "HelmValuesError"
    assert message in str(excinfo.value), str(excinfo.value)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"server": {"drain": {"timeoutSeconds": 120, "preStopSleepSeconds": 10, "terminationGracePeriodSeconds": 100}}},
         "must exceed server.drain.preStopSleepSeconds + server.drain.timeoutSeconds (130)"),
        ({"model": {"source": "pvc", "id": "m"}}, "model.source=pvc needs model.pvc.claimName"),
        ({"sharedCache": {"mode": "external"}}, "sharedCache.mode=external needs sharedCache.external.url"),
        ({"lmcache": {"enabled": False}}, "needs lmcache.enabled=true"),
        ({"apiKeys": {"existingSecret": "k"}, "metrics": {"public": False, "podMonitor": {"enabled": True}}},
         "give metrics.podMonitor.bearerTokenSecret"),
        ({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}, "autoscaling.minReplicas (5) is above"),
    ],
)
def test_the_chart_refuses_inconsistent_values_with_a_message(values, message):
    with pytest.raises(Exception) as excinfo:
        render_values(values)
    assert message in str(excinfo.value), str(excinfo.value)


# ---------------------------------------------------------------------------------------------
# What the chart promises, read from what it renders
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_drain_fits_in_the_grace_period_and_liveness_survives_it(case):
    objs = rendered(case)
    props = properties(objs)
    pod = one(objs, "Deployment", "server")["spec"]["template"]["spec"]
    container = server_container(objs)
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = float(props["option.graceful_shutdown_timeout"])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain
    assert container["startupProbe"]["httpGet"]["path"] == "/ping"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ping"
    assert container["livenessProbe"]["httpGet"]["path"] not in ("/ping", "/health")
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": merged_values(case)["server"]["shmSize"]}} in pod["volumes"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_replica_hashes_and_chunks_alike(case):
    objs = rendered(case)
    values = merged_values(case)
    props = properties(objs)
    env = {e["name"]: e.get("value") for e in server_container(objs)["env"]}
    assert env["PYTHONHASHSEED"] == props["option.lmcache_hash_seed"] == values["hashSeed"]
    # one Deployment, whose pods all mount the same ConfigMaps, and roll together when they change
    pod = one(objs, "Deployment", "server")["spec"]["template"]
    mounted = {v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v}
    served = {cm["metadata"]["name"] for cm in find(objs, "ConfigMap") if "grafana_dashboard" not in cm["metadata"]["labels"]}
    assert served == mounted  # the Grafana dashboard's ConfigMap is Grafana's, not the replicas'
    changed = copy.deepcopy(case_values(case))
    changed.setdefault("lmcache", {}).setdefault("config", dict(values["lmcache"]["config"]))["chunk_size"] = 512
    other = one(render_values(changed), "Deployment", "server")["spec"]["template"]["metadata"]["annotations"]
    if values["lmcache"]["enabled"]:
        assert other["checksum/lmcache"] != pod["metadata"]["annotations"]["checksum/lmcache"]


def test_gpu_count_is_the_resource_request_and_the_tensor_parallel_degree():
    objs = rendered("single-no-router")
    assert server_container(objs)["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert properties(objs)["option.tensor_parallel_degree"] == "4"
    cpu = rendered("cpu")
    assert "nvidia.com/gpu" not in json.dumps(server_container(cpu)["resources"])
    assert "option.tensor_parallel_degree" not in properties(cpu)
    assert "option.model_id" not in properties(cpu)  # the image's embedded assistant


def test_secrets_stay_out_of_configmaps():
    objs = rendered("s3-tls")
    config_text = json.dumps(find(objs, "ConfigMap"))
    assert "alice-key-0123456789" not in config_text and "password" not in config_text
    env = {e["name"]: e for e in server_container(objs)["env"]}
    assert env["LMCACHE_RESP_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "valkey-auth", "key": "password"}
    assert server_container(objs)["envFrom"] == [{"secretRef": {"name": "aws-credentials"}}]
    secret = one(objs, "Secret")
    assert "name=alice key=alice-key-0123456789 weight=2" in secret["stringData"]["api-keys"]


def test_sessions_live_in_the_shared_tier_so_they_outlive_their_replica(tmp_path):
    """option.sessions_redis_url is the shared tier's URL (through the TLS sidecar for rediss://),
    never with credentials: the server reads them from the tier's Secret-backed environment."""
    from lmi_server.config.schema import build_serving_config

    urls = {case: properties(rendered(case)).get("option.sessions_redis_url") for case in CASES}
    assert urls == {
        "default": "redis://lmi-lmi-server-valkey:6379",
        "cpu": "redis://lmi-lmi-server-valkey:6379",
        "gpu-hub-keda": "redis://lmi-lmi-server-valkey:6379",
        "pvc-hpa-external": "redis://cache.internal.example:6379",
        "s3-tls": "redis://127.0.0.1:6380",
        "single-no-router": None,  # no shared tier: each replica keeps its own
    }, urls
    for case in ("pvc-hpa-external", "s3-tls"):
        env = {e["name"] for e in server_container(rendered(case))["env"]}
        assert "LMCACHE_RESP_PASSWORD" in env  # the session store's credentials too
    props = properties(rendered("default"))
    assert build_serving_config(props, tmp_path).sessions.sessions_redis_url == urls["default"]
    off = properties(render_values({"sharedCache": {"sessions": False}}))
    assert "option.sessions_redis_url" not in off
    own = properties(render_values({"servingProperties": {"option.sessions_path": "/opt/ml/sessions"}}))
    assert "option.sessions_redis_url" not in own and own["option.sessions_path"] == "/opt/ml/sessions"


def test_rediss_goes_through_a_tls_sidecar_and_lmcache_talks_to_it_locally():
    objs = rendered("s3-tls")
    pod = one(objs, "Deployment", "server")["spec"]["template"]["spec"]
    (tunnel,) = pod["initContainers"]
    assert tunnel["restartPolicy"] == "Always"  # native sidecar: up before the server, down after it
    args = tunnel["args"]
    assert args[0] == "client" and "--target=master.my-valkey.abc123.use1.cache.amazonaws.com:6379" in args
    assert "--cacert=/etc/lmi/redis-tls/ca/ca.crt" in args and "--cert=/etc/lmi/redis-tls/client/tls.crt" in args
    listen = next(a for a in args if a.startswith("--listen=")).split("=", 1)[1]
    lmcache = yaml.safe_load(next(o for o in find(objs, "ConfigMap") if "lmcache.yaml" in o["data"])["data"]["lmcache.yaml"])
    assert lmcache["remote_url"] == f"redis://{listen}"


# ---------------------------------------------------------------------------------------------
# Contracts with the real programs
# ---------------------------------------------------------------------------------------------

MODEL_CONFIG = {  # a Llama-3.1-8B-shaped config.json for the PVC case (no weights needed for `config`)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
}


def materialize_pod(objs: list[dict], root: Path) -> tuple[Path, dict[str, str]]:
    """The server container's files and environment under `root`: every ConfigMap and Secret
    volume written where the pod would see it, emptyDirs and claims as directories, and every path
    that names a mount rewritten to its place under root. Returns (model dir, environment)."""
    container = server_container(objs)
    pod = one(objs, "Deployment", "server")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = sorted(container["volumeMounts"], key=lambda m: -len(m["mountPath"]))

    def local(text: str) -> str:
        for m in mounts:
            text = text.replace(m["mountPath"], str(root / m["mountPath"].lstrip("/")))
        return text

    for m in mounts:
        dest = root / m["mountPath"].lstrip("/")
        dest.mkdir(parents=True, exist_ok=True)
        vol = volumes[m["name"]]
        if "configMap" in vol:
            cm = next(o for o in find(objs, "ConfigMap") if o["metadata"]["name"] == vol["configMap"]["name"])
            for key, text in cm["data"].items():
                (dest / key).write_text(local(text))
        elif "secret" in vol:
            made = [o for o in find(objs, "Secret") if o["metadata"]["name"] == vol["secret"]["secretName"]]
            for item in vol["secret"].get("items", []):
                text = made[0]["stringData"][item["key"]] if made else "a-key-from-an-existing-secret\n"
                (dest / item["path"]).write_text(text)
        elif "persistentVolumeClaim" in vol:
            model = Path(local(properties(objs)["option.model_id"]))
            model.mkdir(parents=True, exist_ok=True)
            (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    env = {"PATH": os.environ["PATH"], "HOME": str(root / "home"), "LMI_SERVER_CACHE": os.environ.get("LMI_SERVER_CACHE", "")}
    if not env["LMI_SERVER_CACHE"]:
        env["LMI_SERVER_CACHE"] = str(Path.home() / ".cache" / "lmi_server")  # the embedded models `make setup` built
    for e in container.get("env", []):
        env[e["name"]] = local(e["value"]) if "value" in e else "value-from-a-secret"
    gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu", 0)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus)) if gpus else ""  # the device plugin's
    for ref in container.get("envFrom", []):
        env |= {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-from-" + ref["secretRef"]["name"]}
    model_dir = Path(local(container["args"][container["args"].index("--model-dir") + 1]))
    return model_dir, env


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_configuration_loads_with_lmi_server_config(case, tmp_path):
    # `lmi-server config` checks that the CPU tier fits this host's RAM: size it for this host
    # (a GPU node's tier is tens of GiB); everything else is rendered as the case gives it.
    fit = copy.deepcopy(case_values(case))
    fit.setdefault("lmcache", {}).setdefault("config", {})["max_local_cpu_size"] = 1
    objs = render_values(fit)
    values = merged_values(case)
    container = server_container(objs)
    from lmi_server.cli import build_parser

    args = build_parser().parse_args(container["args"])  # the image's entrypoint is `lmi-server`
    assert args.command == "serve" and args.model_dir == "/opt/ml/model"
    assert int(args.port) == container["ports"][0]["containerPort"] == values["server"]["port"]
    model_dir, env = materialize_pod(objs, tmp_path / "root")
    out = subprocess.run(
        [sys.executable, "-m", "lmi_server.cli", "config", "--model-dir", str(model_dir)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["lmcache"]["lmcache_hash_seed"] == values["hashSeed"]
    assert doc["server"]["graceful_shutdown_timeout"] == values["server"]["drain"]["timeoutSeconds"]
    gpus = values["server"]["gpu"]["count"]
    assert doc["vllm_engine_args"].get("tensor_parallel_size", 1) == max(gpus, 1)
    if values["model"]["source"] != "builtin":
        expected = values["model"]["id"] if values["model"]["source"] != "pvc" else None
        assert expected is None or expected in json.dumps(doc["model"])
    if values["lmcache"]["enabled"]:
        plan = doc["lmcache_plan"]
        assert plan["mode"] == "mp" and plan["source"] == "config_file", plan
        argv = plan["server_argv"]
        assert argv[argv.index("--chunk-size") + 1] == str(values["lmcache"]["config"]["chunk_size"])
        assert plan["env"]["PYTHONHASHSEED"] == values["hashSeed"]  # the cache server hashes like the engine
        remote = yaml.safe_load((tmp_path / "root/etc/lmi/lmcache/lmcache.yaml").read_text()).get("remote_url")
        l2 = [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "--l2-adapter"]
        if remote:
            host, port = re.match(r"\w+://([^:/]+):(\d+)", remote).groups()
            assert l2 == [{"type": "resp", "host": host, "port": int(port)}], argv
        else:
            assert l2 == []
    else:
        assert doc["lmcache_plan"]["mode"] is None


LMCACHE_LOADER = r"""
import json, sys
from lmcache.v1.config import LMCacheEngineConfig
cfg = LMCacheEngineConfig.from_file(sys.argv[1])
keys = sorted(getattr(cfg, "_user_set_keys"))
print(json.dumps({"user_set": keys, "chunk_size": cfg.chunk_size, "remote_url": cfg.remote_url,
                  "max_local_cpu_size": cfg.max_local_cpu_size, "local_cpu": cfg.local_cpu}))
"""


def test_rendered_lmcache_yaml_loads_with_lmcache_own_loader(tmp_path):
    seen_remote = set()
    for case in ("default", "cpu", "pvc-hpa-external", "s3-tls"):
        objs = rendered(case)
        text = next(o for o in find(objs, "ConfigMap") if "lmcache.yaml" in o["data"])["data"]["lmcache.yaml"]
        path = tmp_path / f"{case}.yaml"
        path.write_text(text)
        out = subprocess.run([sys.executable, "-c", LMCACHE_LOADER, str(path)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        loaded = json.loads(out.stdout.strip().splitlines()[-1])
        written = yaml.safe_load(text)
        # LMCache drops keys it does not know without a word: every key we wrote must be one it read
        assert loaded["user_set"] == sorted(written), (case, loaded["user_set"], sorted(written))
        assert loaded["chunk_size"] == written["chunk_size"] and loaded["remote_url"] == written["remote_url"]
        assert loaded["max_local_cpu_size"] == written["max_local_cpu_size"]
        seen_remote.add(written["remote_url"])
    assert seen_remote == {"redis://lmi-lmi-server-valkey:6379", "redis://cache.internal.example:6379", "redis://127.0.0.1:6380"}


@pytest.mark.parametrize("case", [c for c in sorted(CASES) if c != "single-no-router"])
def test_rendered_router_arguments_are_accepted_by_vllm_router(case):
    from vllm_router.launch_router import parse_router_args

    objs = rendered(case)
    values = merged_values(case)
    router = one(objs, "Deployment", "router")["spec"]["template"]["spec"]["containers"][0]
    assert router["command"] == ["vllm-router"]
    parsed = parse_router_args(router["args"])  # argparse exits on an unknown flag or a bad choice
    parsed._validate_router_args()
    assert parsed.service_discovery is True
    assert parsed.service_discovery_port == values["server"]["port"] != 80  # its default is 80
    assert parsed.service_discovery_namespace == NAMESPACE
    assert parsed.policy == values["router"]["policy"]
    assert parsed.health_check_endpoint == "/ping"
    assert parsed.port == router["ports"][0]["containerPort"]
    # the selector finds the replicas' pods, and only them
    server_labels = one(objs, "Deployment", "server")["spec"]["template"]["metadata"]["labels"]
    router_labels = one(objs, "Deployment", "router")["spec"]["template"]["metadata"]["labels"]
    assert parsed.selector and all(server_labels.get(k) == v for k, v in parsed.selector.items())
    assert not all(router_labels.get(k) == v for k, v in parsed.selector.items())
    # RBAC: the router's ServiceAccount may list and watch pods in the release's namespace
    role, binding = one(objs, "Role", "router"), one(objs, "RoleBinding", "router")
    assert {"get", "list", "watch"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == ["pods"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == one(objs, "Deployment", "router")["spec"]["template"]["spec"]["serviceAccountName"]


def test_router_flags_the_parser_refuses_are_refused():
    from vllm_router.launch_router import parse_router_args

    args = one(rendered("default"), "Deployment", "router")["spec"]["template"]["spec"]["containers"][0]["args"]
    with pytest.raises(SystemExit):
        parse_router_args([*args, "--service-discovery-prot", "8080"])


def _probe_app(tmp_path):
    from lmi_server.api.app import create_app
    from lmi_server.config.loader import build_serving_config

    cfg = build_serving_config({"option.api_key": "probe-test-key-0123"}, tmp_path)
    return create_app(cfg, {"model": "x"}, start_engine=False)


def _get(app, path: str) -> int:
    import httpx

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pod") as c:
            return (await c.get(path)).status_code

    return asyncio.run(go())


@pytest.mark.parametrize("case", ["default", "cpu"])
def test_probe_paths_answer_as_the_chart_expects_in_every_state(case, tmp_path):
    """Startup and readiness follow the server's /ping; liveness stays 200 through start, drain,
    engine death and the engine's rebuild (the watchdog rebuilds it, or ends the process itself),
    so Kubernetes never kills a draining or recovering pod. The real app with API keys on: kubelet
    probes carry no key."""
    from lmi_server.api.lifecycle import begin_drain

    container = server_container(rendered(case))
    startup, ready, live = (container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    app = _probe_app(tmp_path)
    owner = app.state.ctx.owner
    states = {}
    states["starting"] = {p: _get(app, p) for p in (startup, ready, live)}
    owner.state.status, owner.state.engine = "ready", SimpleNamespace(errored=False)
    states["ready"] = {p: _get(app, p) for p in (startup, ready, live)}
    owner.state.engine = SimpleNamespace(errored=True, dead_error="EngineDeadError")
    states["engine dead"] = {p: _get(app, p) for p in (startup, ready, live)}
    owner.state.status, owner.state.error = "recovering", "the engine died and is being rebuilt"
    states["recovering"] = {p: _get(app, p) for p in (startup, ready, live)}
    owner.state.status, owner.state.engine = "ready", SimpleNamespace(errored=False)
    begin_drain(app)
    states["draining"] = {p: _get(app, p) for p in (startup, ready, live)}
    assert states == {
        "starting": {startup: 503, ready: 503, live: 200},
        "ready": {startup: 200, ready: 200, live: 200},
        "engine dead": {startup: 503, ready: 503, live: 200},
        "recovering": {startup: 503, ready: 503, live: 200},
        "draining": {startup: 503, ready: 503, live: 200},
    }
    assert _get(app, "/v1/models") == 401  # keys are on: only the probe paths are open


def test_autoscaler_queries_read_the_replicas_by_the_labels_the_podmonitor_copies():
    objs = rendered("gpu-hub-keda")
    so, pm = one(objs, "ScaledObject"), one(objs, "PodMonitor", "server")
    assert so["spec"]["scaleTargetRef"]["name"] == one(objs, "Deployment", "server")["metadata"]["name"]
    copied = {re.sub(r"[^a-zA-Z0-9_]", "_", label) for label in pm["spec"]["podTargetLabels"]}
    pod_labels = one(objs, "Deployment", "server")["spec"]["template"]["metadata"]["labels"]
    for trigger in so["spec"]["triggers"]:
        query = trigger["metadata"]["query"]
        for name, value in re.findall(r'(\w+)="([^"]*)"', query):
            if name == "namespace":
                assert value == NAMESPACE
            else:
                assert name in copied, (name, copied)
                original = next(k for k in pod_labels if re.sub(r"[^a-zA-Z0-9_]", "_", k) == name)
                assert pod_labels[original] == value
    assert {m for t in so["spec"]["triggers"] for m in autoscaler_metric_names(t["metadata"]["query"])} == {
        "vllm:num_requests_waiting", "lmi_queue_depth"
    }


def autoscaler_metric_names(query: str) -> set[str]:
    """Metric names in a PromQL query: identifiers followed by a label matcher."""
    return set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", query))


def chart_autoscaler_metrics() -> set[str]:
    """Every Prometheus series the chart's autoscalers read, as the server exports them (the HPA's
    adapter names map back: vllm_x is vllm:x)."""
    names = set()
    for case in CASES:
        for so in find(rendered(case), "ScaledObject"):
            for t in so["spec"]["triggers"]:
                names |= autoscaler_metric_names(t["metadata"]["query"])
        for hpa in find(rendered(case), "HorizontalPodAutoscaler"):
            for m in hpa["spec"]["metrics"]:
                name = m["pods"]["metric"]["name"]
                names.add(re.sub(r"^vllm_", "vllm:", name))
    return names


def test_the_autoscalers_read_both_queues():
    assert chart_autoscaler_metrics() == {"vllm:num_requests_waiting", "lmi_queue_depth"}


FAKE_WORKER = r"""
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]} if self.path == "/v1/models" else {"status": "healthy"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_router_probe_paths_answer_on_the_real_vllm_router(tmp_path):
    """The router Deployment's probes hit the router's own routes (not proxied to a replica):
    the real vllm-router answers them, in front of a stand-in replica (service discovery needs
    an API server, so the replica is given by URL here)."""
    import time

    import httpx

    from lmi_server.kvcache.resolve import free_local_port

    binary = Path(sys.executable).with_name("vllm-router")
    container = one(rendered("default"), "Deployment", "router")["spec"]["template"]["spec"]["containers"][0]
    paths = [container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]]
    worker_port, port, metrics_port = free_local_port(), free_local_port(), free_local_port()
    worker = subprocess.Popen([sys.executable, "-c", FAKE_WORKER, str(worker_port)])
    router = subprocess.Popen(
        [str(binary), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", f"http://127.0.0.1:{worker_port}",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--log-level", "warning"],
        stdout=(tmp_path / "router.log").open("w"), stderr=subprocess.STDOUT,
    )
    try:
        answers: dict[str, int] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and router.poll() is None:
            try:
                answers = {p: httpx.get(f"http://127.0.0.1:{port}{p}", timeout=5).status_code for p in paths}
                if all(code == 200 for code in answers.values()):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert answers == {p: 200 for p in paths}, (tmp_path / "router.log").read_text()[-2000:]
    finally:
        for proc in (router, worker):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

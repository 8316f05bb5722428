"""The Helm chart deploy/helm/lmi-server, rendered, as the settings a loopback cluster needs.

deploy/cluster.py starts its replicas, Redis and router from what the chart would deploy, so
that what is tested on one host is what the chart puts in Kubernetes. This module renders the
chart with Helm's own template engine (PyPI helm-python-sdk, the test extra; values.schema.json
is checked by the render) and reads back:

- serving.properties and lmcache.yaml from their ConfigMaps,
- the literal environment of the lmi-server container,
- vllm-router's arguments from the router Deployment,
- the server replica count and the internal Valkey's maxmemory,
- the shared tier's mode (sharedCache.mode: internal, external, none) and which of its
  credentials the chart takes from a Secret (sharedCache.external.auth).

What a loopback cluster cannot take as rendered is left to deploy/cluster.py to substitute
(paths inside the pod, in-cluster URLs, service discovery); `loopback_router_args` does it for
the router. Chart features it cannot reproduce at all are refused with a ChartError rather than
dropped silently (see `_api_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent / "helm" / "lmi-server"
CPU_VALUES = CHART / "values-cpu.yaml"
RELEASE, NAMESPACE = "lmi", "llm"

# Environment values that are paths inside the pod (emptyDir mounts of the server Deployment):
# on a host they would point at directories that do not exist or belong to root, so the host's
# own defaults (its Hugging Face cache, a temporary download directory) are used instead.
POD_PATH_ENV = frozenset({"HF_HOME", "SERVING_DOWNLOAD_DIR"})

# Router flags that only make sense with Kubernetes service discovery: (flag, values it takes;
# None = every value up to the next flag).
_DISCOVERY_FLAGS = {"--service-discovery": 0, "--selector": None, "--service-discovery-port": 1, "--service-discovery-namespace": 1}

# The external shared tier's credentials, as the chart passes them from sharedCache.external.auth's
# Secret to the lmi-server container (LMCache's RESP adapter and the session store read them).
SHARED_TIER_SECRET_ENV = ("LMCACHE_RESP_PASSWORD", "LMCACHE_RESP_USERNAME")


class ChartError(ValueError):
    """The chart does not render, or renders something a loopback cluster cannot reproduce."""


@dataclass
class ChartSettings:
    """What the rendered chart says about one replica set, its shared tier and its router."""

    serving_properties: dict[str, str]
    lmcache_config: dict | None  # None: lmcache.enabled=false
    env: dict[str, str]  # literal env of the lmi-server container (no valueFrom, no pod paths)
    router_args: list[str]
    replicas: int
    shared_tier: bool
    valkey_maxmemory: str | None  # None: no in-release Valkey (sharedCache external or none)
    remote_url: str | None  # the replicas' in-cluster URL of the shared tier
    api_keys: str | None = None  # the key file's text when the chart makes the Secret itself
    skipped_env: list[str] = field(default_factory=list)  # names left out of env, for a note
    shared_tier_mode: str = "none"  # sharedCache.mode as rendered: internal, external, none
    # SHARED_TIER_SECRET_ENV names the container takes from sharedCache.external.auth's Secret
    shared_tier_secret_env: list[str] = field(default_factory=list)

    @property
    def policy(self) -> str | None:
        return flag_value(self.router_args, "--policy")


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------


def coalesce(base: dict, top: dict) -> dict:
    """Helm's merge of values: maps merge key by key, anything else replaces, null deletes."""
    out = dict(base)
    for key, value in top.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = coalesce(out[key], value)
        else:
            out[key] = value
    return out


def parse_set(items: list[str]) -> dict:
    """`--set a.b.c=VALUE` lines as a nested dict. VALUE is read as YAML (2 -> int, true ->
    bool, {a,b} is not supported: use a values file); `\\.` keeps a dot inside a key, as Helm's
    --set does (servingProperties.option\\.dtype=fp32)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ChartError(f"--set {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        parts = [p.replace("\0", ".") for p in key.replace("\\.", "\0").split(".")]
        value = yaml.safe_load(raw) if raw else ""
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def user_values(values_files: list[Path] | None = None, overrides: dict | None = None) -> dict:
    """The values given on top of the chart's values.yaml: each file in order, then `overrides`."""
    merged: dict = {}
    for path in [CPU_VALUES] if values_files is None else values_files:
        merged = coalesce(merged, yaml.safe_load(Path(path).read_text()) or {})
    return coalesce(merged, overrides or {})


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def render(values: dict) -> list[dict]:
    """Every object the chart renders for `values` (values.yaml underneath, schema checked)."""
    try:
        import helm_python.chart as helm
    except ImportError as e:  # the test extra brings it
        raise ChartError("rendering the chart needs helm-python-sdk (pip install helm-python-sdk==0.2.2)") from e
    try:
        files = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    except Exception as e:  # the engine's errors carry the chart's own message
        raise ChartError(f"the chart does not render with these values: {e}") from e
    objs = []
    for path, text in sorted(files.items()):
        if path.endswith(".yaml"):
            objs += [d for d in yaml.safe_load_all(text) if d]
    return objs


def load(values_files: list[Path] | None = None, overrides: dict | None = None) -> ChartSettings:
    """Render the chart (default: the CPU profile, values-cpu.yaml) and read its settings."""
    return settings(render(user_values(values_files, overrides)))


def settings(objs: list[dict]) -> ChartSettings:
    """ChartSettings from rendered objects."""
    props = parse_properties(_config_data(objs, "serving.properties"))
    lmcache_text = _config_data(objs, "lmcache.yaml", required=False)
    lmcache = yaml.safe_load(lmcache_text) if lmcache_text is not None else None
    server = _deployment(objs, "lmi-server")
    container = _container(server, "lmi-server")
    env, skipped = literal_env(container.get("env", []))
    router = _deployment(objs, "vllm-router", required=False)
    if router is None:
        raise ChartError("router.enabled=false: a loopback cluster always puts vllm-router in front of its replicas")
    valkey = _deployment(objs, "valkey", required=False)
    remote_url = (lmcache or {}).get("remote_url")
    if any(c["name"] == "redis-tls-tunnel" for c in server["spec"]["template"]["spec"].get("initContainers", [])):
        raise ChartError(
            "sharedCache.external.url is rediss://: the chart reaches it through a TLS sidecar (ghostunnel) that a "
            "loopback cluster does not run; run a TLS tunnel on this host and give its plain redis:// address instead"
        )
    return ChartSettings(
        serving_properties=props,
        lmcache_config=lmcache,
        env=env,
        router_args=[str(a) for a in _container(router, "vllm-router")["args"]],
        replicas=int(server["spec"].get("replicas", 1)),  # absent when the autoscaler owns it: one
        shared_tier=remote_url is not None,
        valkey_maxmemory=flag_value(_container(valkey, "valkey")["args"], "--maxmemory") if valkey else None,
        remote_url=remote_url,
        api_keys=_api_keys(objs, props),
        skipped_env=skipped,
        shared_tier_mode="internal" if valkey else "external" if remote_url is not None else "none",
        shared_tier_secret_env=[
            e["name"] for e in container.get("env", []) if e["name"] in SHARED_TIER_SECRET_ENV and "secretKeyRef" in e.get("valueFrom", {})
        ],
    )


def parse_properties(text: str) -> dict[str, str]:
    """serving.properties lines as a dict, in order (comments and blank lines skipped)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def literal_env(entries: list[dict]) -> tuple[dict[str, str], list[str]]:
    """The container's `value:` variables, minus pod paths (POD_PATH_ENV); valueFrom entries
    (Secrets: hub token, shared-tier password) cannot be read on a host and are left to the
    host's own environment. Returns (env, names skipped)."""
    env, skipped = {}, []
    for entry in entries:
        name = entry["name"]
        if "value" in entry and name not in POD_PATH_ENV:
            env[name] = str(entry["value"])
        else:
            skipped.append(name)
    return env, skipped


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after the last `flag` in argv (the last one wins, as in vllm-router's parser)."""
    value = None
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            value = str(argv[i + 1])
    return value


def _config_data(objs: list[dict], key: str, required: bool = True) -> str | None:
    for obj in objs:
        if obj.get("kind") == "ConfigMap" and key in (obj.get("data") or {}):
            return obj["data"][key]
    if required:
        raise ChartError(f"the chart rendered no ConfigMap with {key}")
    return None


def _deployment(objs: list[dict], container: str, required: bool = True) -> dict | None:
    for obj in objs:
        if obj.get("kind") == "Deployment":
            if any(c["name"] == container for c in obj["spec"]["template"]["spec"]["containers"]):
                return obj
    if required:
        raise ChartError(f"the chart rendered no Deployment with a {container} container")
    return None


def _container(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def _api_keys(objs: list[dict], props: dict[str, str]) -> str | None:
    """The API key file when the chart configures one. Keys given as values (apiKeys.keys) are
    in the rendered Secret and the cluster writes them to a file; a Secret the chart only names
    (apiKeys.existingSecret) lives in Kubernetes, and serving without it would silently turn
    authentication off, so that is an error."""
    path = props.get("option.api_key_file")
    if path is None:
        return None
    key = Path(path).name
    for obj in objs:
        if obj.get("kind") == "Secret" and key in (obj.get("stringData") or {}):
            return obj["stringData"][key]
    raise ChartError(
        "apiKeys.existingSecret names a Kubernetes Secret, which a loopback cluster cannot read; "
        "give the keys as values instead (apiKeys.keys in a --values file) or unset apiKeys.existingSecret"
    )


# ---------------------------------------------------------------------------------------------
# The router on loopback
# ---------------------------------------------------------------------------------------------


def loopback_router_args(args: list[str], worker_urls: list[str], port: int, prometheus_port: int, host: str = "127.0.0.1") -> list[str]:
    """The chart's router arguments for static workers on loopback: service discovery (which
    needs the Kubernetes API) becomes --worker-urls, addresses and ports become loopback ones;
    policy, health checks, timeouts, log level and extra arguments stay as rendered.

    With static workers vllm-router 0.1.17 waits for every one of them before it serves,
    checking every 30 s by default; the cluster only starts it once every replica answers, so
    the check runs every second (unless the chart's extraArgs say otherwise)."""
    replace = {"--host": host, "--port": str(port), "--prometheus-host": host, "--prometheus-port": str(prometheus_port)}
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _DISCOVERY_FLAGS:
            n = _DISCOVERY_FLAGS[arg]
            i += 1
            if n is None:
                while i < len(args) and not args[i].startswith("--"):
                    i += 1
            else:
                i += n
            continue
        if arg in replace and i + 1 < len(args):
            out += [arg, replace[arg]]
            i += 2
            continue
        out.append(arg)
        i += 1
    startup = [] if "--worker-startup-check-interval" in out else ["--worker-startup-check-interval", "1"]
    return ["--worker-urls", *worker_urls, *startup, *out]

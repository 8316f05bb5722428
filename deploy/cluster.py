"""A local scale-out cluster on loopback: a Redis-protocol server (LMCache's shared remote tier),
N replicas of `lmi-server serve` and vLLM's router (`vllm-router`, PyPI) in front of them.

    python deploy/cluster.py up   [--values FILE ...] [--set KEY=VALUE ...] [--replicas N] [--policy P]
                                  [--no-shared-cache] [--shared-cache-password-file FILE] [--prop KEY=VALUE ...]
    python deploy/cluster.py status
    python deploy/cluster.py down

The cluster starts from the Helm chart's rendered values (deploy/chart.py; default: the CPU
profile deploy/helm/lmi-server/values-cpu.yaml, `--values`/`--set` as with `helm install`), so
that what runs here is what the chart deploys:

- replicas: the chart's serving.properties ConfigMap, the container's literal environment
  (PYTHONHASHSEED = hashSeed) and server.replicas;
- LMCache: the chart's lmcache.yaml ConfigMap;
- Redis: the internal Valkey's maxmemory (allkeys-lru, no persistence, as the chart runs it);
  with sharedCache.mode=external none is started: the replicas use sharedCache.external.url as
  rendered, and the password (and user name) that the chart takes from sharedCache.external.auth's
  Secret reach them the same way, in their environment (LMCACHE_RESP_PASSWORD /
  LMCACHE_RESP_USERNAME, read by LMCache's RESP adapter and the session store), from
  `shared_tier_password` / `--shared-cache-password-file` (a file only its owner can read) or the
  host's own variables of those names, never on a command line or in STATE_DIR;
- router: the chart's vllm-router arguments and policy.

Substituted for loopback: option.lmcache_config_file -> STATE_DIR/lmcache.yaml; the chart's
in-cluster shared-tier URL (remote_url, option.sessions_redis_url) -> this cluster's Redis (the
external URL stays as it is); mp_host -> 127.0.0.1; API keys given as values -> STATE_DIR/api-keys
(option.api_key_file);
router service discovery -> --worker-urls, its addresses and ports -> free loopback ones. Pod
paths in the environment (HF_HOME, SERVING_DOWNLOAD_DIR) and Secret references other than the
shared tier's are left out.
`props` / `--prop` then `replica_props(i)` apply over the chart's properties.

Everything it starts binds 127.0.0.1. Every process is started in its own session and recorded in
STATE_DIR (default /tmp/lmi-cluster, or $LMI_CLUSTER_DIR) as `<name>.pid` plus `cluster.json`
(ports, URLs); `down` stops them with SIGTERM (SIGKILL after a grace period), checking each
pid's start time so that a recycled pid is never signalled. Logs: STATE_DIR/<name>.log.

The same module is the library behind tests/e2e/test_scale_out.py, benchmarks/routing.py and
benchmarks/multi_round_qa.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python deploy/cluster.py`: make `deploy.chart` importable
    sys.path.insert(0, str(REPO))

from deploy import chart as helm_chart  # noqa: E402
from deploy.chart import ChartError, ChartSettings  # noqa: E402
from lmi_server import process
from lmi_server.kvcache.resolve import free_local_port as free_port  # binds 127.0.0.1
from lmi_server.process import pid_alive

LOOPBACK = "127.0.0.1"
DEFAULT_STATE_DIR = Path(os.environ.get("LMI_CLUSTER_DIR", "/tmp/lmi-cluster"))
# Redis's maxmemory when the chart runs no Valkey of its own (sharedCache.mode external or none,
# where `up` starts no Redis) and `start_redis` is called all the same.
FALLBACK_MAXMEMORY = "2gb"

# The tiny demo model over the chart's CPU profile (which serves the built-in assistant): what
# the benchmarks measure, with room for their long prompts. Pass as `props`.
DEMO_PROPS = {
    "option.model_id": "lmi-demo",
    "option.max_request_bytes": "400000",
    "option.cpu_kv_cache_space": "1",
}


class ClusterError(RuntimeError):
    pass


def redis_server_binary() -> str | None:
    """`redis-server` (Debian package redis-server) or `valkey-server`, whichever is installed."""
    return shutil.which("redis-server") or shutil.which("valkey-server")


def router_binary() -> str | None:
    """The `vllm-router` console script of the PyPI package, next to this Python first."""
    local = Path(sys.executable).with_name("vllm-router")
    return str(local) if local.exists() else shutil.which("vllm-router")


def _resp(*args: str) -> bytes:
    return f"*{len(args)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args)


def resp_command(port: int, *args: str, timeout: float = 2.0, password: str | None = None) -> bytes:
    """One RESP command against the Redis-protocol server (no client library needed); with
    `password`, after AUTH on the same connection (its +OK is not part of the reply)."""
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
        if password is None:
            s.sendall(_resp(*args))
            return s.recv(65536)
        s.sendall(_resp("AUTH", password) + _resp(*args))
        data = b""
        while data.count(b"\r\n") < 2:  # AUTH's +OK, then the command's one-line reply
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    auth, _, reply = data.partition(b"\r\n")
    if auth != b"+OK":
        raise ClusterError(f"AUTH refused: {data!r}")
    return reply


def read_secret_file(path: Path) -> str:
    """A password from a file that only its owner, this user, can read (mode 600 or stricter, as
    ssh asks of keys): its first line, without the line end."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as e:
        raise ClusterError(f"cannot read the password file {path}: {e.strerror}") from None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ClusterError(f"{path} must belong to you and be readable by you only (chmod 600 {path}), not mode {st.st_mode & 0o777:o}")
    value = text.splitlines()[0] if text else ""
    if not value:
        raise ClusterError(f"{path} is empty: its first line is the password")
    return value


def ping_shared_tier(url: str, username: str | None, password: str | None, timeout: float = 5.0) -> None:
    """PING the external shared tier with its credentials (redis-py, the session store's client):
    a ClusterError naming the URL when it does not answer or refuses them, before any replica starts."""
    import redis

    try:
        client = redis.Redis.from_url(url.replace("valkey://", "redis://", 1), username=username, password=password,
                                      socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as e:
        raise ClusterError(f"the external shared tier {url} does not answer PING: {type(e).__name__}: {e}") from None


def redis_dbsize(port: int, password: str | None = None) -> int:
    reply = resp_command(port, "DBSIZE", password=password)
    if not reply.startswith(b":"):
        raise ClusterError(f"unexpected DBSIZE reply {reply!r}")
    return int(reply[1:].split(b"\r\n")[0])


# ---------------------------------------------------------------------------------------------
# Processes with pid files
# ---------------------------------------------------------------------------------------------


@dataclass
class Proc:
    """A child process started in its own session, described by STATE_DIR/<name>.pid."""

    name: str
    pid: int
    start: str | None
    port: int
    url: str
    log: str

    @classmethod
    def spawn(cls, name: str, argv: list[str], port: int, url: str, state_dir: Path, env: dict[str, str] | None = None) -> "Proc":
        log = state_dir / f"{name}.log"
        popen = process.spawn(argv, env={**os.environ, **(env or {})}, log=log, cwd=REPO, append=True)
        proc = cls(name, popen.pid, process.start_time(popen.pid), port, url, str(log))
        proc._popen = popen  # reaped by stop() when we are its parent
        (state_dir / f"{name}.pid").write_text(f"{popen.pid}\n")
        return proc

    @property
    def alive(self) -> bool:
        popen = getattr(self, "_popen", None)
        if popen is not None and popen.poll() is not None:
            return False
        return pid_alive(self.pid, self.start)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal_group(self, sig: int) -> None:
        if pid_alive(self.pid, self.start):
            process.signal_group(self.pid, sig)  # the session leader's group: the server and its children

    def descendants(self) -> list[tuple[int, str | None]]:
        """(pid, start time) of every live descendant, including children that run in their own
        session (lmi-server's LMCache cache server does)."""
        return process.descendants(self.pid) if pid_alive(self.pid, self.start) else []

    def kill(self) -> None:
        """SIGKILL the server and everything under it at once (a crashed host, for failover tests)."""
        below = self.descendants()
        self.signal_group(signal.SIGKILL)
        self._reap(10)
        process.kill_leftovers(below, grace_s=0)

    def stop(self, grace_s: float = 60) -> None:
        below = self.descendants()
        self.signal_group(signal.SIGTERM)
        if not self._reap(grace_s):
            self.signal_group(signal.SIGKILL)
            self._reap(10)
        process.kill_leftovers(below, grace_s=15)
        # Group members that outlived the leader (none expected): while one exists, Linux keeps
        # the leader's pid reserved, so the group id still names only our processes.
        for _ in range(50):
            if not self.group_members():
                break
            if process.start_time(self.pid) not in (None, self.start):
                break  # pid recycled as a new group leader: not ours
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.1)

    def group_members(self) -> list[int]:
        members = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == self.pid and fields[0] != "Z":
                    members.append(int(entry.name))
        return members

    def _reap(self, timeout: float) -> bool:
        popen = getattr(self, "_popen", None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if popen is not None:
                popen.poll()
            if not pid_alive(self.pid, self.start):
                return True
            time.sleep(0.2)
        return False

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("name", "pid", "start", "port", "url", "log")}


def _wait_http(proc: Proc, path: str, timeout: float, ok=lambda r: r.status_code == 200) -> float:
    t0 = time.monotonic()
    outcome = process.wait_ready(lambda: proc.alive, process.http_ok(proc.url + path, ok=ok), timeout)
    if outcome == "ready":
        return time.monotonic() - t0
    if outcome == "exited":
        raise ClusterError(f"{proc.name} exited while starting; {proc.log}:\n{proc.log_tail()}")
    raise ClusterError(f"{proc.name} not ready after {timeout:.0f} s; {proc.log}:\n{proc.log_tail()}")


# ---------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------


@dataclass
class Cluster:
    """Redis + replicas + router as the chart deploys them (`chart`), on loopback. None in
    `replicas`, `policy`, `shared_cache`, `l1_size_gb` and `redis_maxmemory` means the chart's.
    With the chart's sharedCache.mode=external no Redis is started (`redis` stays None)."""

    state_dir: Path = DEFAULT_STATE_DIR
    replicas: int | None = None  # chart: server.replicas
    policy: str | None = None  # chart: router.policy
    shared_cache: bool | None = None  # chart: sharedCache.mode != none
    props: dict[str, str] = field(default_factory=dict)
    # Per-replica serving.properties lines (replica index -> lines), applied over `props`: what
    # must differ between replicas, e.g. each one's own KV-event endpoint for the kv_aware policy.
    replica_props: Callable[[int], dict[str, str]] | None = None
    l1_size_gb: float | None = None  # chart: lmcache.config.max_local_cpu_size
    # Extra environment of the router process (e.g. VLLM_ROUTER_TOKENIZER for kv_aware).
    router_env: dict[str, str] = field(default_factory=dict)
    redis_maxmemory: str | None = None  # chart: sharedCache.internal.maxmemory
    chart: ChartSettings = field(default_factory=helm_chart.load)
    # sharedCache.mode=external: what the chart takes from sharedCache.external.auth's Secret
    # (None: the host's LMCACHE_RESP_PASSWORD / LMCACHE_RESP_USERNAME)
    shared_tier_password: str | None = field(default=None, repr=False)
    shared_tier_username: str | None = None
    redis: Proc | None = None
    servers: list[Proc] = field(default_factory=list)
    router: Proc | None = None

    def __post_init__(self) -> None:
        if self.replicas is None:
            self.replicas = self.chart.replicas
        if self.policy is None:
            self.policy = self.chart.policy or "consistent_hash"
        if self.shared_cache is None:
            self.shared_cache = self.chart.shared_tier
        elif self.shared_cache and not self.chart.shared_tier:
            raise ClusterError("shared_cache asked for, but the chart configures no shared tier (sharedCache.mode=none)")
        if self.redis_maxmemory is None:
            self.redis_maxmemory = self.chart.valkey_maxmemory or FALLBACK_MAXMEMORY

    @property
    def external(self) -> bool:
        """The chart's shared tier is an external Redis/Valkey (sharedCache.mode=external)."""
        return self.chart.shared_tier_mode == "external"

    def shared_tier_env(self) -> dict[str, str]:
        """The shared tier's credentials for the replicas' environment, as the chart gives them to
        its container from sharedCache.external.auth's Secret (a Kubernetes object, which a
        loopback cluster cannot read): `shared_tier_password` / `shared_tier_username`, else the
        host's variables of the same names. Empty without a shared tier or a Secret."""
        if not self.shared_cache:
            return {}
        given = {"LMCACHE_RESP_PASSWORD": self.shared_tier_password, "LMCACHE_RESP_USERNAME": self.shared_tier_username}
        wanted = self.chart.shared_tier_secret_env
        unused = [name for name, value in given.items() if value and name not in wanted]
        if unused:
            raise ClusterError(
                f"{' and '.join(unused)} given, but the chart passes its replicas no such credential "
                f"(sharedCache.mode={self.chart.shared_tier_mode}); with sharedCache.mode=external name its Secret: "
                "sharedCache.external.auth.secretName (and usernameKey for a user name)"
            )
        env = {}
        for name in wanted:
            value = given[name] or os.environ.get(name)
            if not value:
                raise ClusterError(
                    f"the chart gives its replicas {name} from the Secret sharedCache.external.auth.secretName, which a "
                    f"loopback cluster cannot read: give it in {name} or, for the password, with --shared-cache-password-file"
                )
            env[name] = value
        return env

    # -- pieces ---------------------------------------------------------------------------

    def start_redis(self) -> Proc:
        binary = redis_server_binary()
        if binary is None:
            raise ClusterError("redis-server is not installed (Debian: apt-get install -y redis-server)")
        port = free_port()
        argv = [
            binary, "--bind", LOOPBACK, "--port", str(port), "--protected-mode", "yes",
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", str(self.state_dir), "--maxmemory", self.redis_maxmemory,
            "--maxmemory-policy", "allkeys-lru",
        ]
        self.redis = Proc.spawn("redis", argv, port, f"redis://{LOOPBACK}:{port}", self.state_dir)
        deadline = time.monotonic() + 30
        while True:
            try:
                if resp_command(port, "PING").startswith(b"+PONG"):
                    break
            except OSError:
                pass
            if not self.redis.alive or time.monotonic() > deadline:
                raise ClusterError(f"redis-server did not start:\n{self.redis.log_tail()}")
            time.sleep(0.2)
        self._save()
        return self.redis

    def lmcache_config(self) -> dict | None:
        """The chart's lmcache.yaml on loopback: remote_url -> this cluster's Redis (dropped
        without the shared tier), each replica's cache server on 127.0.0.1, and the CPU tier
        resized only when `l1_size_gb` is given. None when the chart disables LMCache."""
        if self.chart.lmcache_config is None:
            return None
        cfg = dict(self.chart.lmcache_config)
        cfg["mp_host"] = LOOPBACK
        if self.l1_size_gb is not None:
            cfg["max_local_cpu_size"] = self.l1_size_gb
        if self.shared_cache:
            cfg["remote_url"] = self._redis_url()
        else:
            cfg.pop("remote_url", None)
        return cfg

    def lmcache_yaml(self) -> Path | None:
        """STATE_DIR/lmcache.yaml from `lmcache_config` (None when the chart disables LMCache)."""
        cfg = self.lmcache_config()
        if cfg is None:
            return None
        path = self.state_dir / "lmcache.yaml"
        path.write_text("# generated by deploy/cluster.py from the chart's lmcache.yaml ConfigMap\n" + yaml.safe_dump(cfg, sort_keys=False))
        return path

    def _redis_url(self) -> str:
        if self.external:
            return self.chart.remote_url
        if self.redis is None:
            raise ClusterError("start the Redis-protocol server before the replicas")
        return self.redis.url

    def chart_properties(self, lmcache_config: Path | None) -> dict[str, str]:
        """The chart's serving.properties with loopback in place of the pod: the LMCache file
        and API key file in STATE_DIR, the in-cluster shared-tier URL -> this cluster's Redis
        (the external one as it is; dropped without a shared tier: --no-shared-cache)."""
        out = {}
        remote = self.chart.remote_url
        for key, value in self.chart.serving_properties.items():
            if key == "option.lmcache_config_file":
                if lmcache_config is None:
                    continue
                value = str(lmcache_config)
            elif key == "option.api_key_file":
                value = str(self._api_key_file())
            elif remote and value.startswith(remote):
                if not self.shared_cache:
                    continue
                value = self._redis_url() + value[len(remote):]
            out[key] = value
        return out

    def _api_key_file(self) -> Path:
        """The chart's API keys (apiKeys.keys, from the rendered Secret) in STATE_DIR, owner-only."""
        path = self.state_dir / "api-keys"
        path.touch(mode=0o600, exist_ok=True)
        path.write_text(self.chart.api_keys or "")
        return path

    def start_replicas(self, timeout: float = 600) -> list[Proc]:
        """Start every replica at once, then wait for all (engine start is 30-60 s on CPU)."""
        config = self.lmcache_yaml()
        for i in range(self.replicas):
            self.servers.append(self._spawn_replica(i, self.replica_properties(i, config)))
        self._save()
        for proc in self.servers:
            _wait_http(proc, "/ping", timeout)
        return self.servers

    def replica_properties(self, i: int, lmcache_config: Path | None) -> dict[str, str]:
        """Replica i's serving.properties: the chart's (on loopback), `props`, then `replica_props(i)`."""
        props = {**self.chart_properties(lmcache_config), **self.props}
        return {**props, **(self.replica_props(i) if self.replica_props else {})}

    def restart_replica(self, i: int, timeout: float = 600) -> Proc:
        """Start replica i again (after it was killed) with the same properties, and wait for it."""
        old = self.servers[i]
        if old.alive:
            raise ClusterError(f"{old.name} is still running")
        config = self.state_dir / "lmcache.yaml" if self.chart.lmcache_config is not None else None
        proc = self._spawn_replica(i, self.replica_properties(i, config))
        self.servers[i] = proc
        self._save()
        _wait_http(proc, "/ping", timeout)
        return proc

    def _spawn_replica(self, i: int, props: dict[str, str]) -> Proc:
        model_dir = self.state_dir / f"replica-{i}"
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        port = free_port()
        argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(model_dir), "--host", LOOPBACK, "--port", str(port)]
        # The chart's literal environment: PYTHONHASHSEED = hashSeed, so that every process
        # sharing a cache hashes alike (LMCache chunk keys); the external tier's credentials.
        env = {**self.chart.env, **self.shared_tier_env()}
        return Proc.spawn(f"replica-{i}", argv, port, f"http://{LOOPBACK}:{port}", self.state_dir, env)

    def start_router(self, policy: str | None = None, timeout: float = 90, extra_args: list[str] | None = None) -> Proc:
        binary = router_binary()
        if binary is None:
            raise ClusterError("vllm-router is not installed (pip install vllm-router==0.1.17)")
        if policy is not None:
            self.policy = policy
        import httpx

        for server in self.servers:  # the router's start-up gate probes /health, not --health-check-endpoint
            if httpx.get(server.url + "/health", timeout=10).status_code == 404:
                raise ClusterError(
                    f"{server.name} does not answer GET /health, which vllm-router 0.1.17 probes before it "
                    "starts routing (its --health-check-endpoint only applies to later checks); lmi-server "
                    "needs /health as an alias of /ping"
                )
        port = free_port()
        argv = [binary, *self.router_args(port, free_port()), *(extra_args or [])]
        self.router = Proc.spawn("router", argv, port, f"http://{LOOPBACK}:{port}", self.state_dir, self.router_env)
        self._save()
        # /v1/models answers once the router has registered its healthy workers (401 from them
        # when the chart sets API keys: registered all the same).
        ok = (lambda r: r.status_code in (200, 401)) if self.chart.api_keys else (lambda r: r.status_code == 200)
        _wait_http(self.router, "/v1/models", timeout, ok=ok)
        return self.router

    def router_args(self, port: int, prometheus_port: int) -> list[str]:
        """The chart's router arguments on loopback (deploy/chart.py), with this cluster's policy."""
        args = helm_chart.loopback_router_args(self.chart.router_args, [s.url for s in self.servers], port, prometheus_port, LOOPBACK)
        i = args.index("--policy") if "--policy" in args else None
        if i is None:
            return [*args, "--policy", self.policy]
        return [*args[: i + 1], self.policy, *args[i + 2 :]]

    def stop_router(self) -> None:
        if self.router is not None:
            self.router.stop(grace_s=10)
            (self.state_dir / "router.pid").unlink(missing_ok=True)
            self.router = None
            self._save()

    # -- whole cluster --------------------------------------------------------------------

    def up(self, with_router: bool = True) -> "Cluster":
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if (self.state_dir / "cluster.json").exists() and any(p.alive for p in load_procs(self.state_dir)):
            raise ClusterError(f"a cluster is already running from {self.state_dir}; run `down` first")
        env = self.shared_tier_env()  # before anything starts: the credentials the chart asks for
        if self.shared_cache and self.external:  # and whether the external tier takes them
            ping_shared_tier(self.chart.remote_url, env.get("LMCACHE_RESP_USERNAME"), env.get("LMCACHE_RESP_PASSWORD"))
        try:
            if self.shared_cache and not self.external:
                self.start_redis()
            self.start_replicas()
            if with_router:
                self.start_router()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        # Front to back: router, replicas (they flush nothing to Redis on exit), Redis (none
        # started for an external shared tier: it is left alone).
        procs = [p for p in (self.router, *self.servers, self.redis) if p is not None]
        stop_all(procs, self.state_dir)
        self.router, self.servers, self.redis = None, [], None
        (self.state_dir / "cluster.json").unlink(missing_ok=True)

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def describe(self) -> dict:
        return {
            "policy": self.policy,
            "shared_cache": self.shared_cache,
            # the URL without credentials (the chart's has none), never the password
            "shared_tier": {"mode": self.chart.shared_tier_mode, "url": self.chart.remote_url} if self.external and self.shared_cache else None,
            "redis": self.redis.to_json() if self.redis else None,
            "replicas": [s.to_json() for s in self.servers],
            "router": self.router.to_json() if self.router else None,
        }

    def _save(self) -> None:
        (self.state_dir / "cluster.json").write_text(json.dumps(self.describe(), indent=2) + "\n")


def stop_all(procs: list[Proc], state_dir: Path) -> None:
    """SIGTERM every process at once (they shut down in parallel), wait, SIGKILL what is left,
    including descendants that run in their own session, and remove the pid files."""
    below = [d for p in procs for d in p.descendants()]
    for proc in procs:
        proc.signal_group(signal.SIGTERM)
    for proc in procs:
        proc.stop(grace_s=60)
        (state_dir / f"{proc.name}.pid").unlink(missing_ok=True)
    process.kill_leftovers(below, grace_s=15)


def load_procs(state_dir: Path) -> list[Proc]:
    """The processes recorded by an earlier `up` (for `status` and `down` from another shell)."""
    try:
        doc = json.loads((state_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        doc = {}
    entries = [doc.get("router"), *doc.get("replicas", []), doc.get("redis")]
    procs = [Proc(**e) for e in entries if e]
    known = {p.name for p in procs}
    for pidfile in sorted(state_dir.glob("*.pid")):  # a crash between spawn and cluster.json
        if pidfile.stem not in known:
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            procs.append(Proc(pidfile.stem, pid, None, 0, "", str(state_dir / f"{pidfile.stem}.log")))
    return procs


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _cmd_up(args) -> int:
    props = dict(p.split("=", 1) for p in args.prop)
    settings = helm_chart.load(args.values or None, helm_chart.parse_set(args.set))
    skipped = [name for name in settings.skipped_env if name not in settings.shared_tier_secret_env]
    if skipped:
        print(f"cluster: not set from the chart (Secrets or pod paths; the host's environment applies): {', '.join(skipped)}", file=sys.stderr)
    password = read_secret_file(args.shared_cache_password_file) if args.shared_cache_password_file else None
    cluster = Cluster(
        state_dir=args.state_dir, replicas=args.replicas, policy=args.policy,
        shared_cache=False if args.no_shared_cache else None, props=props, l1_size_gb=args.l1_size_gb,
        chart=settings, shared_tier_password=password,
    )
    t0 = time.monotonic()
    cluster.up(with_router=not args.no_router)
    print(json.dumps(cluster.describe(), indent=2))
    front = cluster.router.url if cluster.router else cluster.servers[0].url
    print(f"\ncluster up in {time.monotonic() - t0:.0f} s; send requests to {front}; stop with: {Path(__file__).name} down", file=sys.stderr)
    return 0


def _cmd_status(args) -> int:
    procs = load_procs(args.state_dir)
    if not procs:
        print(f"no cluster recorded in {args.state_dir}")
        return 1
    for p in procs:
        print(f"{p.name:<10} pid {p.pid:<8} {'up  ' if p.alive else 'DOWN'} {p.url}")
    return 0 if all(p.alive for p in procs) else 1


def _cmd_down(args) -> int:
    procs = load_procs(args.state_dir)
    stop_all(procs, args.state_dir)
    for p in procs:
        print(f"stopped {p.name} (pid {p.pid})")
    (args.state_dir / "cluster.json").unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="pid files, logs, generated configs")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start Redis, the replicas and the router, as the chart's values say")
    up.add_argument("--values", "-f", action="append", type=Path, default=[], metavar="FILE",
                    help="chart values file (repeatable, later wins; default: deploy/helm/lmi-server/values-cpu.yaml)")
    up.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="chart value on top of the files, dotted as in helm --set (router.policy=round_robin)")
    up.add_argument("--replicas", type=int, default=None, help="default: the chart's server.replicas")
    up.add_argument("--policy", default=None,
                    help="vllm-router policy (default: the chart's router.policy): consistent_hash, round_robin, cache_aware, ...")
    up.add_argument("--no-shared-cache", action="store_true", help="replicas without the Redis tier (CPU tier only)")
    up.add_argument("--shared-cache-password-file", type=Path, default=None, metavar="FILE",
                    help="sharedCache.mode=external with sharedCache.external.auth.secretName: the password that Secret "
                    "holds, from the first line of FILE, which only you may read (chmod 600); default: $LMCACHE_RESP_PASSWORD. "
                    "The user name (auth.usernameKey) comes from $LMCACHE_RESP_USERNAME")
    up.add_argument("--no-router", action="store_true")
    up.add_argument("--l1-size-gb", type=float, default=None,
                    help="LMCache CPU tier per replica (default: the chart's lmcache.config.max_local_cpu_size)")
    up.add_argument("--prop", action="append", default=[], metavar="KEY=VALUE", help="extra serving.properties line, e.g. option.dtype=fp32")
    sub.add_parser("status", help="list the recorded processes")
    sub.add_parser("down", help="stop everything recorded in the state directory")
    args = ap.parse_args(argv)
    try:
        return {"up": _cmd_up, "status": _cmd_status, "down": _cmd_down}[args.cmd](args)
    except (ClusterError, ChartError) as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

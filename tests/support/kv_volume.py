"""The KV volume and Redis of tests/e2e/test_kv_restart.py. Its seed start is the session's
`busy_server`, its restart the session's `keyed_server` (tests/e2e/conftest.py), both on this volume
and this Redis (a password from a 0600 config file): they need the same leftovers of an earlier
run (over the disk tier's limit on their own) and the same LMCache configuration. The seed
(`kv_seed`: documents DOC_A and DOC_B) is also what the bf16 replicas of tests/e2e/test_scale_out.py
find in that Redis."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from deploy.cluster import ClusterError, redis_dbsize, redis_server_binary, resp_command
from lmi_server.kvcache.disk_budget import chunk_files
from lmi_server.kvcache.resolve import free_local_port

LIMIT_GIB = 0.05  # 51.2 MiB; the demo model's KV is 2 MiB per 256-token chunk in float32
LIMIT = int(LIMIT_GIB * 2**30)
FAKE_MIB = 60  # an earlier run's leftovers: 60 chunk files of 1 MiB, over the limit on their own


def document(name: str, n_chars: int = 7000) -> str:
    return Path(sysconfig.get_paths()["stdlib"], name).read_text()[:n_chars]


# What the seed stores (over 1,024 tokens each). Not the documents tests/e2e/test_security.py sends
# the restart (`keyed_server`) later: its isolation checks expect no KV of their prompts stored before them.
DOC_A, DOC_B = document("inspect.py"), document("tarfile.py")


def leftover_volume(d: Path) -> Path:
    """`d` with an earlier run's chunk files, file 00 the oldest, all older than anything stored now."""
    for i in range(FAKE_MIB):
        path = d / f"earlier-run-{i:02d}@0x00000000@0@{i:064x}.data"
        path.write_bytes(b"\0" * 2**20)
        t = 1_600_000_000 + i
        os.utime(path, (t, t))
    return d


def lmcache_yaml(volume: Path, redis_port: int | None, password: str | None = None) -> str:
    """LMCache's CPU tier, the disk tier on `volume` under LIMIT_GIB with O_DIRECT (where the
    filesystem takes it: the server falls back to buffered I/O, with a warning, where not) and,
    where given, a Redis tier."""
    text = (f"chunk_size: 256\nmax_local_cpu_size: 0.5\nlocal_disk: \"file://{volume}\"\nmax_local_disk_size: {LIMIT_GIB}\n"
            "extra_config:\n  use_odirect: true\n")
    auth = f":{password}@" if password else ""
    return text + (f"remote_url: \"redis://{auth}127.0.0.1:{redis_port}\"\n" if redis_port else "")


@contextlib.contextmanager
def password_redis(work: Path, password: str) -> Iterator[int]:
    """A real redis-server on a free loopback port (no persistence) whose password is read from a
    0600 config file in `work` (never on a command line), answering PING; its port."""
    port = free_local_port()
    conf = work / "redis.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\nrequirepass {password}\nsave \"\"\nappendonly no\ndir {work}\n")
    conf.chmod(0o600)
    proc = subprocess.Popen([redis_server_binary(), str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if resp_command(port, "PING", password=password).startswith(b"+PONG"):
                break
        except (OSError, ClusterError):
            time.sleep(0.2)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def complete(server, prompt: str, adapter: str | None = None, headers: dict | None = None) -> dict:
    """A greedy completion of 12 tokens: its text, cached tokens and prompt tokens."""
    body = {"model": adapter or "lmi-demo", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.base_url + "/v1/completions", json=body, headers=headers or {}, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    return {"text": out["choices"][0]["text"], "cached": out["usage"]["prompt_tokens_details"]["cached_tokens"],
            "prompt_tokens": out["usage"]["prompt_tokens"]}


def real_chunks(d: Path) -> set[str]:
    """The chunk files of the volume, the earlier run's leftovers apart."""
    return {p.name for _, _, p in chunk_files(d) if not p.name.startswith("earlier-run-")}


def wait_stored(cache_dir: Path, redis_port: int | None, password: str | None, before: set[str]) -> set[str]:
    """The chunk files a request added, once disk and Redis (where there is one) stop growing."""
    last, stable = None, 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and stable < 3:
        now = (frozenset(real_chunks(cache_dir) - before),
               redis_dbsize(redis_port, password=password) if redis_port else 0)
        stable = stable + 1 if now == last and now[0] else 0
        last = now
        time.sleep(1)
    assert last and last[0], "no chunk reached the disk tier"
    return set(last[0])


def redis_key(file_name: str) -> str:
    """The Redis key of the chunk a disk-tier file holds (same fields; the rank without `0x`)."""
    model, rank, *rest = file_name.removesuffix(".data").split("@")
    return "@".join([model, rank.removeprefix("0x"), *rest])


def namespace(key: str) -> str:
    """The KV namespace of a chunk key or file name (LMCache's model name, before the first `@`)."""
    return key.split("@", 1)[0]


def redis_keys(port: int, password: str) -> set[str]:
    """Every key in the password-protected Redis on loopback (a KEYS reply: redis-py reads it)."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, password=password, decode_responses=True, socket_timeout=10)
    try:
        return set(client.keys("*"))
    finally:
        client.close()


def wait_new_keys(port: int, password: str, before: set[str]) -> set[str]:
    """The keys added to the Redis since `before`, once they stop changing."""
    last, stable = None, 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and stable < 3:
        now = frozenset(redis_keys(port, password) - before)
        stable = stable + 1 if now == last and now else 0
        last = now
        time.sleep(1)
    assert last, "no chunk reached Redis"
    return set(last)

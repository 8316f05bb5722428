"""The KV volume and Redis of tests/e2e/test_kv_restart.py. Its seed start is the session's
`busy_server`, its restart the session's `keyed_server` (tests/e2e/conftest.py), both on this volume
and this Redis (a password from a 0600 config file): they need the same leftovers of an earlier
run (over the disk tier's limit on their own) and the same LMCache configuration."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from deploy.cluster import ClusterError, redis_server_binary, resp_command
from lmi_server.kvcache.resolve import free_local_port

LIMIT_GIB = 0.05  # 51.2 MiB; the demo model's KV is 2 MiB per 256-token chunk in float32
LIMIT = int(LIMIT_GIB * 2**30)
FAKE_MIB = 60  # an earlier run's leftovers: 60 chunk files of 1 MiB, over the limit on their own


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

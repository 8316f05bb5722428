"""Ports the kernel would pick (a bind to port 0) taken from SAGEMAKER_SAFE_PORT_RANGE instead, in
the engine's processes.

Why: torch's gloo backend, which vLLM uses for its CPU-side process groups (one per group: world,
tensor, pipeline, data, expert parallel, ...), gives each group a TCP listener bound to port 0,
and neither torch nor vLLM has a setting for that port. Under SAGEMAKER_SAFE_PORT_RANGE those
listeners would sit outside the ports SageMaker allows a container beside its serving port. A
small preloaded library (`SOURCE`, built here with the C compiler both images carry) turns a TCP
bind to port 0 into a bind to a free port of `RANGE_ENV`'s range, tried from a point that depends
on the process id; when none is free it lets the kernel pick and says so on stderr. Explicit
ports are untouched. Without a compiler nothing is preloaded, and `preload_environment` says why.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

RANGE_ENV = "LMI_EPHEMERAL_PORT_RANGE"
SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
static bind_fn real_bind;
static int low = -1, high = -1, warned;

static void read_range(void) {
    const char *raw = getenv("LMI_EPHEMERAL_PORT_RANGE");
    int a = 0, b = 0;
    if (raw && sscanf(raw, "%d-%d", &a, &b) == 2 && a > 0 && a <= b && b < 65536) {
        low = a; high = b;
    } else {
        low = 0; high = 0;
    }
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (low < 0) read_range();
    if (!low || !addr || len > sizeof(struct sockaddr_storage)) return real_bind(fd, addr, len);
    int type = 0;
    socklen_t type_len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM)
        return real_bind(fd, addr, len);
    struct sockaddr_storage copy;
    memcpy(&copy, addr, len);
    in_port_t *port;
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
        port = &((struct sockaddr_in *)&copy)->sin_port;
    else if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
        port = &((struct sockaddr_in6 *)&copy)->sin6_port;
    else
        return real_bind(fd, addr, len);
    if (*port != 0) return real_bind(fd, addr, len);
    unsigned span = (unsigned)(high - low + 1);
    unsigned start = ((unsigned)getpid() * 2654435761u) % span;
    for (unsigned i = 0; i < span; i++) {
        *port = htons((in_port_t)(low + (start + i) % span));
        if (real_bind(fd, (struct sockaddr *)&copy, len) == 0) return 0;
        if (errno != EADDRINUSE && errno != EACCES) return -1;
    }
    if (!warned) {
        warned = 1;
        fprintf(stderr, "lmi-server: no free port left in %s=%d-%d; the kernel picks one\n",
                "LMI_EPHEMERAL_PORT_RANGE", low, high);
    }
    return real_bind(fd, addr, len);
}
"""
COMPILERS = ("cc", "gcc", "clang")


def _cache_dir() -> Path:
    base = os.environ.get("LMI_SERVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lmi_server"
    )
    path = Path(base) / "bind_shim"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "lmi_server_bind_shim"


def build(out_dir: Path | None = None) -> tuple[Path | None, str]:
    """The shim's shared library (built once per source, reused after); or None and why not."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    out_dir = _cache_dir() if out_dir is None else out_dir
    lib = out_dir / f"lmi_bind_range_{digest}.so"
    if lib.is_file():
        return lib, f"{lib} (built before)"
    compiler = next((c for c in COMPILERS if shutil.which(c)), None)
    if compiler is None:
        return None, "no C compiler (cc, gcc or clang) to build it"
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / f"lmi_bind_range_{digest}.c"
    src.write_text(SOURCE)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    cmd = [compiler, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src), "-ldl"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{compiler} failed: {exc}"
    if done.returncode != 0:
        return None, f"{compiler} failed: {done.stderr.strip()[-300:]}"
    os.replace(tmp, lib)  # atomic: two servers building at once both end with a whole library
    return lib, f"{lib} (built with {compiler})"


def preload_environment(port_range: tuple[int, int], ld_preload: str | None) -> tuple[dict[str, str], str]:
    """LD_PRELOAD (the shim appended to `ld_preload`) and the range variable the shim reads; {} and
    the reason when the shim cannot be built. The second value is a line for the start-up notes."""
    lib, how = build()
    low, high = port_range
    if lib is None:
        return {}, (
            f"ports the kernel would pick (torch gloo's listeners) are not confined to {low}-{high}: {how}"
        )
    entries = [e for e in (ld_preload or "").replace(" ", ":").split(":") if e]
    if str(lib) not in entries:
        entries.append(str(lib))
    env = {"LD_PRELOAD": ":".join(entries), RANGE_ENV: f"{low}-{high}"}
    return env, f"ports the kernel would pick in the engine's processes come from {low}-{high}: {how}"

"""The engine processes of a running server (vLLM's engine core and worker, spawned children of
`lmi-server serve`) have tcmalloc and Intel OpenMP loaded, as vLLM's CPU guide asks, and the
start-up log says so in one line."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import psutil
import pytest

from lmi_server.config import host

# Found here independently of the server's own discovery, so that a broken discovery fails.
TCMALLOC = "libtcmalloc_minimal.so"
IOMP = "libiomp5.so"


def installed_tcmalloc() -> bool:
    patterns = ["/usr/lib/*-linux-gnu", "/lib/*-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    return any(glob.glob(os.path.join(p, TCMALLOC + "*")) for p in patterns)


def installed_iomp() -> bool:
    return (Path(sys.prefix) / "lib" / IOMP).is_file()


def engine_processes(server) -> list[psutil.Process]:
    """vLLM names its processes VLLM::EngineCore and VLLM::Worker... (setproctitle)."""
    found = []
    for proc in server.descendants():
        try:
            title = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "EngineCore" in title or "Worker" in title:
            found.append(proc)
    return found


def mapped_libraries(pid: int) -> set[str]:
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            names.add(os.path.basename(parts[5]))
    return names


@pytest.fixture
def preload_expected():
    if host.gpu_count() > 0:
        pytest.skip("GPU host: the CPU runtime's preload does not apply")
    if os.environ.get("LMI_CPU_PRELOAD", "").lower() in ("0", "false", "off", "no"):
        pytest.skip("LMI_CPU_PRELOAD turns the preload off in this environment")
    missing = [what for what, ok in (("libtcmalloc-minimal4", installed_tcmalloc()),
                                     (f"{IOMP} in {sys.prefix}/lib (intel-openmp)", installed_iomp())) if not ok]
    if missing:
        pytest.skip("not installed on this host: " + ", ".join(missing) + " (make setup installs them as root)")


def test_engine_processes_have_tcmalloc_and_intel_openmp_loaded(server, preload_expected):
    engines = engine_processes(server)
    assert engines, f"no vLLM engine process below the server; descendants: {server.descendants()}"
    for proc in engines:
        libs = mapped_libraries(proc.pid)
        title = " ".join(proc.cmdline())
        assert any(name.startswith(TCMALLOC) for name in libs), f"{title}: tcmalloc not mapped"
        assert IOMP in libs, f"{title}: {IOMP} not mapped"
    log = server.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if "CPU runtime" in line]
    assert len(lines) == 1 and "LD_PRELOAD=" in lines[0], lines
    # vLLM's own check in the worker no longer complains
    assert "libtcmalloc is not found in LD_PRELOAD" not in log
    assert "libiomp is not found in LD_PRELOAD" not in log

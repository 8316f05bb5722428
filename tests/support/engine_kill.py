"""Kill a real server's vLLM engine (engine core and workers, not the LMCache cache server) and time
how long until it serves again, for the end-to-end tests and benchmarks/engine_recovery.py."""

from __future__ import annotations

import time

import httpx
import psutil

ENGINE_MARKS = ("EngineCore", "VLLM::Worker")


def _label(p: psutil.Process) -> str:
    try:
        return p.name() + " " + " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def engine_processes(server_pid: int) -> list[psutil.Process]:
    """The server's engine core and worker processes (vLLM names them in their process titles)."""
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in children if any(m in _label(p) for m in ENGINE_MARKS) and "lmcache" not in _label(p)]


def cache_server_processes(server_pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in children if "lmcache.v1.multiprocess.server" in _label(p) or "lmi_server.kvcache.mp_child" in _label(p)]


def kill_engine(server_pid: int) -> list[int]:
    """SIGKILL the engine core and its workers at once; the pids killed (raises if none were found)."""
    procs = engine_processes(server_pid)
    if not procs:
        labels = [_label(p) for p in psutil.Process(server_pid).children(recursive=True)]
        raise AssertionError(f"no engine process among the server's children: {labels}")
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in procs]


def completion_status(base_url: str, timeout: float = 60, headers: dict[str, str] | None = None) -> int:
    body = {"model": "lmi-demo", "prompt": "import os\n", "max_tokens": 4}
    try:
        return httpx.post(base_url + "/v1/completions", json=body, headers=headers, timeout=timeout).status_code
    except httpx.HTTPError:
        return 0


def wait_serving(
    base_url: str, since: float, timeout: float = 600, interval: float = 0.25, headers: dict[str, str] | None = None
) -> dict:
    """Poll /ping and a small completion (sent with `headers`: a server's API key) until the
    completion answers 200; seconds from `since` (a time.monotonic()) to the first 200 of each, and
    the statuses seen on the way."""
    seen: list[int] = []
    ping_ok_s = None
    deadline = since + timeout
    while time.monotonic() < deadline:
        try:
            ping = httpx.get(base_url + "/ping", timeout=5).status_code
        except httpx.HTTPError:
            ping = 0
        if not seen or seen[-1] != ping:
            seen.append(ping)
        if ping == 200:
            if ping_ok_s is None and len(seen) > 1:  # a 200 before the death was noticed does not count
                ping_ok_s = time.monotonic() - since
            if completion_status(base_url, headers=headers) == 200:
                ping_s = round(ping_ok_s, 2) if ping_ok_s is not None else None
                return {"ping_200_s": ping_s, "serving_s": round(time.monotonic() - since, 2), "pings": seen}
        time.sleep(interval)
    raise TimeoutError(f"not serving again {timeout:.0f} s after the kill; /ping statuses seen: {seen}")

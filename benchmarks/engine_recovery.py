#!/usr/bin/env python
"""How long a server whose engine died takes to serve again, against a new process.

    python benchmarks/engine_recovery.py                # 3 fresh starts, each followed by 2 kills
    python benchmarks/engine_recovery.py --no-fork-server --name engine_recovery_spawn

One configuration for both (the tiny demo model with LoRA, sessions and, unless --no-lmcache, the
LMCache cache server). `--servers` times: a server is started (its spawn -> /ping 200 is one
"process restart" sample), then its engine core and worker are SIGKILLed `--rounds` times, and
each time the seconds from the kill to the first completion answered 200 by the same process are
one "recovery" sample. Interleaved so that both see the same load on a shared host.
A process restart in production costs more than what is timed here (the orchestrator noticing
the exit, pulling up the container): the comparison is conservative.
Results: benchmarks/results/engine_recovery.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, save  # noqa: E402
from benchmarks.start_time import MARKERS as START_MARKERS  # noqa: E402
from benchmarks.start_time import _stamp  # noqa: E402
from tests.support.engine_kill import cache_server_processes, kill_engine, wait_serving  # noqa: E402
from tests.support.server import DEMO_PROPS, ServerProcess, server_env, write_properties  # noqa: E402


def config(model_dir: Path, lmcache: bool, fork_server: bool) -> dict[str, str]:
    root = model_dir / "adapters"
    root.mkdir(exist_ok=True)
    repo_adapter = Path(__file__).resolve().parents[1] / "adapters" / "hello-printer"
    if not (root / "hello-printer").exists():
        shutil.copytree(repo_adapter, root / "hello-printer")
    props = {
        **DEMO_PROPS, "option.enable_lora": "true", "option.max_loras": "1", "option.max_lora_rank": "8",
        "option.adapters_path": str(root), "option.engine_fork_server": str(fork_server).lower(),
    }
    if lmcache:
        (model_dir / "lmcache.yaml").write_text("chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 1\n")
        props["option.lmcache_config_file"] = "lmcache.yaml"
    return props


# Where a rebuild's time goes, read from the server's log after the kill: (phase ending at the line, regex).
RECOVERY_MARKERS = [
    ("death noticed", r"rebuilding it in this process"),
    ("engine-core process: spawn + imports", r"Initializing a V1 LLM engine"),
    ("worker process: spawn + imports", r"Starting to load model"),
    ("weights, KV cache allocation, warm-up", r"init engine \(profile, create kv cache, warmup model\) took"),
    ("serving objects, adapter registry", r"engine rebuilt after it died"),
]
LMCACHE_MARKER = ("LMCache cache server start", r"LMCache MP server ready")


def phases(log: Path, since: float, markers: list[tuple[str, str]], after: int = 0) -> dict[str, float]:
    """Seconds spent in each phase, from `since` (wall clock), reading the log from line `after`
    (vLLM's own lines carry whole seconds)."""
    year = time.localtime().tm_year
    lines = log.read_text(errors="replace").splitlines()[after:]
    out: dict[str, float] = {}
    last, start = since, 0
    for name, pattern in markers:
        for i in range(start, len(lines)):
            if re.search(pattern, lines[i]):
                ts = next((t for t in (_stamp(x, year) for x in lines[i:]) if t is not None), None)
                if ts is not None:
                    out[name] = round(max(0.0, ts - last), 1)
                    last, start = ts, i + 1
                break
    return out


def line_count(log: Path) -> int:
    return len(log.read_text(errors="replace").splitlines())


def fresh_start(model_dir: Path, label: str, lmcache: bool) -> tuple[ServerProcess, dict]:
    server = ServerProcess(model_dir, model_dir / f"{label}.log", env=server_env())
    wall, t0 = time.time(), time.monotonic()
    server.start()
    server.wait_ready(900)
    ready_s = time.monotonic() - t0
    markers = list(START_MARKERS)
    if lmcache:
        markers.insert(1, LMCACHE_MARKER)
    sample = {"ready_s": round(ready_s, 2), "cpu_s": cpu_used({}, tree_cpu(server.proc.pid)),
              "phases": phases(server.log_path, wall, markers), "load_average": load_average()}
    return server, sample


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) each process of the server's tree has used so far."""
    import psutil

    out: dict[int, float] = {}
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the tree used between two snapshots (processes gone meanwhile are not counted):
    on a host shared with other work, a measure of the work that contention does not stretch."""
    return round(sum(t - before.get(pid, 0.0) for pid, t in after.items()), 1)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="engine kills (at most option.engine_max_restarts=2)")
    ap.add_argument("--servers", type=int, default=3, help="fresh process starts timed, each followed by --rounds kills")
    ap.add_argument("--no-lmcache", action="store_true", help="without the LMCache cache server")
    ap.add_argument("--no-fork-server", action="store_true", help="engine cores spawned as vLLM spawns them")
    ap.add_argument("--name", default="engine_recovery")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="engine-recovery-"))
    props = config(work, lmcache=not args.no_lmcache, fork_server=not args.no_fork_server)
    write_properties(work, props)
    restarts: list[dict] = []
    recoveries: list[dict] = []
    lmcache = not args.no_lmcache
    try:
        for n in range(args.servers):  # each server's start is a restart sample, then its engine is killed
            server, sample = fresh_start(work, f"server-{n}", lmcache)
            restarts.append(sample)
            print(f"process start: /ping 200 after {sample['ready_s']:.1f} s {sample['phases']}", flush=True)
            try:
                cache_before = [p.pid for p in cache_server_processes(server.proc.pid)]
                for _ in range(args.rounds):
                    time.sleep(5)  # the new engine settles
                    load = load_average()
                    after = line_count(server.log_path)
                    cpu_before = tree_cpu(server.proc.pid)
                    killed_wall, killed_at = time.time(), time.monotonic()
                    killed = kill_engine(server.proc.pid)
                    back = wait_serving(server.base_url, killed_at, timeout=900)
                    back["cpu_s"] = cpu_used({p: t for p, t in cpu_before.items() if p not in killed}, tree_cpu(server.proc.pid))
                    assert server.proc.poll() is None, "the server process ended"
                    same_cache = [p.pid for p in cache_server_processes(server.proc.pid)] == cache_before
                    recoveries.append({**back, "phases": phases(server.log_path, killed_wall, RECOVERY_MARKERS, after),
                                       "killed_pids": killed, "same_server_pid": True, "cache_server_kept": same_cache,
                                       "server": n, "vs_own_start": round(back["serving_s"] / sample["ready_s"], 3),
                                       "load_average": load})
                    print(f"recovery: serving again after {back['serving_s']:.1f} s "
                          f"(/ping 200 after {back['ping_200_s']} s) {recoveries[-1]['phases']}", flush=True)
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    recovery_s = statistics.median(r["serving_s"] for r in recoveries)
    restart_s = statistics.median(r["ready_s"] for r in restarts)
    doc = {
        "benchmark": "engine_recovery",
        "what": "seconds from SIGKILL of the engine core and worker to the first completion answered 200 by the same "
        "server process (recovery), against spawn -> /ping 200 of a fresh lmi-server serve of the same "
        "configuration (process restart); medians of the samples; ratio_median_of_pairs divides each recovery "
        "by the start of its own server, minutes apart on the same shared host; *_cpu_s: CPU seconds the "
        "server's process tree used meanwhile (what contention from other work does not stretch)",
        "config": {k: v for k, v in props.items() if k != "option.adapters_path"},
        "lmcache": not args.no_lmcache,
        "fork_server": not args.no_fork_server,
        "recovery_s": round(recovery_s, 2),
        "process_restart_s": round(restart_s, 2),
        "ratio": round(recovery_s / restart_s, 3),
        "ratio_median_of_pairs": statistics.median(r["vs_own_start"] for r in recoveries),
        "recovery_cpu_s": statistics.median(r["cpu_s"] for r in recoveries),
        "process_restart_cpu_s": statistics.median(r["cpu_s"] for r in restarts),
        "recoveries": recoveries,
        "process_restarts": restarts,
        "host": {**machine(), "load_average_at_end": load_average()},
    }
    path = save(args.name, doc)
    print(f"recovery {doc['recovery_s']} s ({doc['recovery_cpu_s']} CPU s), process restart {doc['process_restart_s']} s "
          f"({doc['process_restart_cpu_s']} CPU s), ratio {doc['ratio']}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

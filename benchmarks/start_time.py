#!/usr/bin/env python
"""Where the start of `make serve` goes: cold and warm starts of the embedded assistant.

    python benchmarks/start_time.py                 # eager (the default): cold, warm, warm
    python benchmarks/start_time.py --compiled      # also vLLM's compilation: cold and warm cache

A start is `lmi-server serve` with no option at all (what `make serve` runs after setup), timed
until /ping answers 200. "Cold" starts from an empty cache directory (LMI_SERVER_CACHE for the
converted model, VLLM_CACHE_ROOT for vLLM's compile cache), so it includes the one-time GGUF
conversion; "warm" reuses both. Phases are read from the server's log: Python and vLLM imports
in the server process, the engine-core and worker processes (spawn + imports), weight loading,
KV-cache allocation and warm-up (compilation when on). Results: benchmarks/results/start_time.json
and .png.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, Server, free_port, machine, save  # noqa: E402

# Log markers, in order: (phase name ending at this line, regex).
MARKERS = [
    ("server process: imports, config, model conversion", r"Application startup complete"),
    ("vLLM engine config (imports of vLLM's serving layer)", r"Resolved architecture"),
    ("engine-core process: spawn + imports", r"Initializing a V1 LLM engine"),
    ("worker process: spawn + imports", r"Starting to load model"),
    ("weights", r"Loading weights took"),
    ("KV cache allocation + warm-up / compilation", r"init engine \(profile, create kv cache, warmup model\) took"),
    ("serving objects (chat templates, tokenizer)", r"engine ready after"),
]
VLLM_TS = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")
OUR_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


def _stamp(line: str, year: int) -> float | None:
    m = OUR_TS.match(line)
    if m:
        return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
    m = VLLM_TS.search(line)
    if m:
        return datetime.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp()
    return None


def phases(log: Path, started_at: float) -> dict[str, float]:
    """Seconds spent in each phase (log timestamps have one-second resolution for vLLM's lines)."""
    year = datetime.now().year
    out: dict[str, float] = {}
    last = started_at
    lines = log.read_text(errors="replace").splitlines()
    for name, pattern in MARKERS:
        for i, line in enumerate(lines):
            if re.search(pattern, line):
                ts = _stamp(line, year)
                if ts is None:  # uvicorn's own lines carry no time: take the nearest stamped line
                    ts = next((t for t in (_stamp(x, year) for x in lines[i:]) if t is not None), None)
                if ts is not None:
                    out[name] = round(max(0.0, ts - last), 1)
                    last = ts
                break
    return out


def one_start(label: str, cache: Path, vllm_cache: Path, extra_env: dict[str, str], work: Path) -> dict:
    port = free_port()
    log = work / f"{label}.log"
    env = {"LMI_SERVER_CACHE": str(cache), "VLLM_CACHE_ROOT": str(vllm_cache), **extra_env}
    argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work / "no-model"), "--host", "127.0.0.1", "--port", str(port)]
    t0 = time.time()
    with Server(label, argv, port, "/ping", log, env=env) as server:
        ready = server.start_s
    return {"label": label, "ready_s": round(ready, 1), "phases": phases(log, t0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compiled", action="store_true", help="also time vLLM's compiled mode (minutes per start)")
    ap.add_argument("--warm-runs", type=int, default=2)
    ap.add_argument("--name", default="start_time", help="results file name (benchmarks/results/NAME.json)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lmi-start-"))
    runs: list[dict] = []
    try:
        cache, vllm_cache = work / "cache", work / "vllm-cache"
        runs.append(one_start("eager cold (conversion included)", cache, vllm_cache, {}, work))
        for i in range(args.warm_runs):
            runs.append(one_start(f"eager warm {i + 1}", cache, vllm_cache, {}, work))
        if args.compiled:
            compiled = {"OPTION_ENFORCE_EAGER": "false"}
            shutil.rmtree(vllm_cache, ignore_errors=True)
            runs.append(one_start("compiled cold compile cache", cache, vllm_cache, compiled, work))
            runs.append(one_start("compiled warm compile cache", cache, vllm_cache, compiled, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"benchmark": "start_time", "machine": machine(), "runs": runs}
    path = save(args.name, doc)
    plot(runs, RESULTS / f"{args.name}.png")
    for run in runs:
        print(f"{run['label']:<40} {run['ready_s']:>7.1f} s  {run['phases']}")
    print(f"wrote {path}")
    return 0


def plot(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name, _ in MARKERS]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.6 * len(runs)))
    for row, run in enumerate(runs):
        left = 0.0
        for i, name in enumerate(names):
            width = run["phases"].get(name, 0.0)
            ax.barh(row, width, left=left, color=plt.cm.tab10(i), label=name if row == 0 else None)
            left += width
        ax.text(left + 1, row, f"{run['ready_s']:.0f} s", va="center")
    ax.set_yticks(range(len(runs)), [r["label"] for r in runs])
    ax.invert_yaxis()
    ax.set_xlabel("seconds until /ping answers 200")
    ax.set_title("Start of the embedded assistant (lmi-server serve, no option)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

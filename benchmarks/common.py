"""Shared pieces of the benchmarks: start servers, stream requests, summarise, plot."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from lmi_server import process
from lmi_server.kvcache.resolve import free_local_port as free_port  # noqa: F401  (re-exported)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


class Server:
    """A server process (lmi-server or plain vLLM) started from argv, waited for on /health or
    /ping, stopped with SIGTERM to its group (SIGKILL after 60 s): `lmi_server.process`."""

    def __init__(self, name: str, argv: list[str], port: int, health: str, log: Path, env: dict[str, str] | None = None):
        self.name, self.argv, self.port, self.health, self.log = name, argv, port, health, log
        self.env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **(env or {})}
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None

    def start(self, timeout: float = 900) -> "Server":
        t0 = time.monotonic()
        self.proc = process.spawn(self.argv, env=self.env, log=self.log, cwd=REPO)
        outcome = process.wait_ready(self.proc, process.http_ok(self.url + self.health, timeout=2), timeout)
        if outcome == "exited":
            raise RuntimeError(f"{self.name} exited: see {self.log}")
        if outcome != "ready":
            self.stop()
            raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s; see {self.log}")
        self.start_s = time.monotonic() - t0
        return self

    def stop(self) -> None:
        if self.proc is not None:
            process.stop(self.proc, 60)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    error: str = ""
    prompt_tokens: int = 0
    chunks: int = 0  # stream chunks that carried text
    text: str = ""


async def stream_completion(client: httpx.AsyncClient, url: str, body: dict, headers: dict | None = None) -> RequestResult:
    """POST a streaming OpenAI completion/chat request; time the first token and each gap.
    The one streaming client of the benchmarks."""
    t0 = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    tokens = 0
    cached = 0
    prompt_tokens = 0
    chunks = 0
    pieces: list[str] = []
    try:
        async with client.stream("POST", url, json={**body, "stream": True, "stream_options": {"include_usage": True}}, headers=headers) as r:
            if r.status_code != 200:
                return RequestResult(False, error=f"{r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                    prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                    cached = ((chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
                for choice in chunk.get("choices", []):
                    piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if piece:
                        pieces.append(piece)
                        chunks += 1
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        else:
                            gaps.append(now - last)
                        last = now
    except httpx.HTTPError as exc:
        return RequestResult(False, error=repr(exc))
    end = time.perf_counter()
    return RequestResult(
        True, ttft_s=(first or end) - t0, latency_s=end - t0, output_tokens=tokens, itl_s=gaps, cached_tokens=cached,
        prompt_tokens=prompt_tokens, chunks=chunks, text="".join(pieces),
    )


async def run_concurrent(url: str, bodies: list[dict], concurrency: int, timeout: float = 600) -> tuple[list[RequestResult], float]:
    """Send all bodies with at most `concurrency` in flight; return results and wall time."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def one(body):
            async with sem:
                return await stream_completion(client, url, body)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(b) for b in bodies))
        return list(results), time.perf_counter() - t0


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarise(results: list[RequestResult], wall_s: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok]
    lat = [r.latency_s for r in ok]
    itl = [g for r in ok for g in r.itl_s]
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
        "ttft_mean_s": statistics.fmean(ttft) if ttft else float("nan"),
        "ttft_p90_s": pct(ttft, 90),
        "latency_mean_s": statistics.fmean(lat) if lat else float("nan"),
        "latency_p90_s": pct(lat, 90),
        "itl_mean_s": statistics.fmean(itl) if itl else float("nan"),
        "itl_p90_s": pct(itl, 90),
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / wall_s if wall_s else float("nan"),
        "cached_tokens_mean": statistics.fmean([r.cached_tokens for r in ok]) if ok else 0,
        "wall_s": wall_s,
    }


SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def spec_counters(url: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters from a server's /metrics (summed over label sets)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    out = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for line in text.splitlines():
        for name in SPEC_COUNTERS:
            if line.startswith(f"vllm:spec_decode_{name}_total"):
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def chat_level(url: str, bodies: list[dict], concurrency: int) -> tuple[list[RequestResult], dict]:
    """Send chat `bodies` to `url` (a server's base URL) `concurrency` at a time and measure the
    level: output tokens/s over its wall time, mean inter-token latency and TTFT, and vLLM's
    speculation counters diffed around it (acceptance rate and mean acceptance length). Any failed
    request fails the level."""
    before = spec_counters(url)
    results, wall = asyncio.run(run_concurrent(url + "/v1/chat/completions", bodies, concurrency))
    after = spec_counters(url)
    if not all(r.ok for r in results):
        raise RuntimeError(f"failed requests: {[r.error for r in results if not r.ok][:3]}")
    tokens = sum(r.output_tokens for r in results)
    itl = [sum(r.itl_s) / len(r.itl_s) for r in results if r.itl_s]
    d = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    return results, {
        "concurrency": concurrency, "requests": len(results), "output_tokens": tokens, "wall_s": round(wall, 2),
        "output_tokens_per_s": round(tokens / wall, 2),
        "mean_itl_ms": round(1000 * statistics.fmean(itl), 1) if itl else None,
        "mean_ttft_ms": round(1000 * statistics.fmean(r.ttft_s for r in results), 1),
        "acceptance_rate": round(d["num_accepted_tokens"] / d["num_draft_tokens"], 4) if d["num_draft_tokens"] else None,
        "mean_acceptance_length": round(1 + d["num_accepted_tokens"] / d["num_drafts"], 3) if d["num_drafts"] else None,
    }


def cpu_kind() -> str:
    """The CPU's vector extensions that change vLLM's kernels and dtypes (AVX2 only, AVX-512, + BF16, + AMX)."""
    try:
        flags = set(next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return "unknown"
    kind = "AVX-512" if "avx512f" in flags else "AVX2 only" if "avx2" in flags else "no AVX2"
    if "avx512_bf16" in flags:
        kind += " + BF16"
    if "amx_tile" in flags:
        kind += " + AMX"
    return kind


def machine() -> dict:
    return {"cpus": os.cpu_count(), "cpu": cpu_kind(), "platform": platform.platform(), "python": sys.version.split()[0]}


def save(name: str, doc: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, default=_plain) + "\n")
    return path


def _plain(value):
    """JSON for what json cannot write itself: paths (argparse arguments) as text, numbers (numpy) as floats."""
    return str(value) if isinstance(value, Path) else float(value)


def save_twin_axes_plot(fig, ax, twin, name: str, loc: str) -> Path:
    """One legend for a plot with a second y axis, then results/NAME.png."""
    lines, more = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc=loc)
    fig.tight_layout()
    out = RESULTS / f"{name}.png"
    fig.savefig(out, dpi=110)
    return out


def builtin_server(name: str, work: Path, env: dict[str, str]) -> "Server":
    """`lmi-server serve` with no model option (the built-in assistant, as `make serve`) on a free
    loopback port, with exactly `env` (plus vLLM's no-telemetry switches): one mode of a benchmark."""
    port = free_port()
    argv = [sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(work / "no-model"),
            "--host", "127.0.0.1", "--port", str(port)]
    server = Server(f"lmi-{name}", argv, port, "/ping", work / f"{name}.log", env=env)
    server.env = {**env, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    return server


def mark_against(level: dict, ref: dict, baseline: str) -> None:
    """A level's speed-up over the baseline mode's same level, and which of its outputs (by sha1, in
    order) are identical to the baseline's."""
    level[f"speedup_vs_{baseline}"] = round(level["output_tokens_per_s"] / ref["output_tokens_per_s"], 3)
    same = [a["sha1"] == b["sha1"] for a, b in zip(level["outputs"], ref["outputs"])]
    for o, s in zip(level["outputs"], same):
        o["identical_to_" + baseline] = s
    level["identical_share"] = round(sum(same) / len(same), 3) if same else None

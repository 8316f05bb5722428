#!/usr/bin/env python
"""Speculative decoding on the demo kit: none vs EAGLE-1 vs ngram, through a running server.

    python benchmarks/spec_decode.py                      # writes benchmarks/results/spec_decode.{json,png}
    python benchmarks/spec_decode.py --concurrency 1 4 --requests-per-level 2   # quicker

For each speculation mode a vLLM OpenAI server is started on the kit's target
(`python -m vllm.entrypoints.openai.api_server`, float32, eager), and two workloads are sent at each
concurrency level (streamed /v1/completions, greedy, fixed output length):
  - code:      held-out stdlib code prefixes; the model continues the code (free generation);
  - retrieval: the prompt holds a code excerpt and then starts quoting it again, so the answer
               repeats text of the prompt (the case prompt-lookup / ngram speculation is built for).
Measured per run: output tokens/s (all requests), mean inter-token latency per request
((t_last - t_first) / (tokens - 1)), time to first token, and, from the server's Prometheus
/metrics (vllm:spec_decode_num_drafts/_num_draft_tokens/_num_accepted_tokens, diffed around the
run), the acceptance rate (accepted / draft tokens) and mean acceptance length (1 + accepted / drafts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KIT = REPO / "lmi_server" / "demo" / "kit"


from benchmarks.common import Server, free_port, spec_counters, stream_completion  # noqa: E402


def spec_config(mode: str, k: int, draft: Path) -> dict | None:
    if mode == "none":
        return None
    if mode == "eagle":
        return {"method": "eagle", "model": str(draft), "num_speculative_tokens": k}
    if mode == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    raise ValueError(mode)


def make_server(model: Path, mode: str, k: int, draft: Path, log_dir: Path) -> Server:
    """Plain vLLM with the speculative config of `mode` (the shared benchmark launcher)."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager",
        "--max-model-len", "4096", "--served-model-name", "demo", "--seed", "0",
    ]
    sc = spec_config(mode, k, draft)
    if sc:
        cmd += ["--speculative-config", json.dumps(sc)]
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    log_dir.mkdir(parents=True, exist_ok=True)
    return Server(f"vllm-{mode}", cmd, port, "/health", log_dir / f"server_{mode}.log", env)


def build_prompts(tok, n: int, kind: str, prompt_len: int) -> list[list[int]]:
    from lmi_server.demo.builder import stdlib_corpus_files

    files = stdlib_corpus_files(3_000_000)
    held = [f for i, f in enumerate(files) if i % 24 == 12]  # the kit's held-out files
    prompts = []
    i = 0
    while len(prompts) < n:
        f = held[i % len(held)]
        ids = tok(f.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)["input_ids"]
        start = (len(ids) * (1 + (i // len(held)) * 2)) // 9 % max(1, len(ids) - 400)
        if kind == "code":
            prompts.append([tok.bos_token_id] + ids[start : start + prompt_len])
        else:
            excerpt = ids[start : start + 300]
            # the excerpt, a separator comment, then its first 24 tokens again: the continuation quotes it
            sep = tok("\n\n# (the same code, copied verbatim)\n", add_special_tokens=False)["input_ids"]
            prompts.append([tok.bos_token_id] + excerpt + sep + excerpt[:24])
        i += 1
    return prompts


async def one_request(client, base: str, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    r = await stream_completion(client, base + "/v1/completions", body)
    if not r.ok:
        raise RuntimeError(r.error)
    n = r.output_tokens or r.chunks
    ttft = r.ttft_s if r.chunks else None
    itl = sum(r.itl_s) / (n - 1) if r.chunks and n > 1 else None
    return {"tokens": n, "ttft": ttft, "itl": itl, "latency": r.latency_s}


async def run_level(base: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def guarded(p):
            async with sem:
                return await one_request(client, base, p, max_tokens)

        t0 = time.perf_counter()
        res = await asyncio.gather(*(guarded(p) for p in prompts))
        wall = time.perf_counter() - t0
    toks = sum(r["tokens"] for r in res)
    itls = [r["itl"] for r in res if r["itl"] is not None]
    ttfts = [r["ttft"] for r in res if r["ttft"] is not None]
    return {
        "requests": len(res), "output_tokens": toks, "wall_s": round(wall, 3),
        "output_tokens_per_s": round(toks / wall, 2),
        "mean_itl_ms": round(1000 * sum(itls) / len(itls), 2) if itls else None,
        "mean_ttft_ms": round(1000 * sum(ttfts) / len(ttfts), 2) if ttfts else None,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = result["workloads"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(5.5 * len(workloads), 7), squeeze=False)
    for col, wl in enumerate(workloads):
        for mode, runs in result["runs"].items():
            pts = [r for r in runs if r["workload"] == wl]
            if not pts:
                continue
            cs = [r["concurrency"] for r in pts]
            lab = mode
            acc = [r.get("acceptance_rate") for r in pts if r.get("acceptance_rate") is not None]
            if acc:
                lab += f" (accept {sum(acc) / len(acc):.2f})"
            axes[0][col].plot(cs, [r["output_tokens_per_s"] for r in pts], "o-", label=lab)
            axes[1][col].plot(cs, [r["mean_itl_ms"] for r in pts], "o-", label=mode)
        axes[0][col].set_title(f"{wl}: output tokens/s")
        axes[1][col].set_title(f"{wl}: mean inter-token latency (ms)")
        for r in (0, 1):
            axes[r][col].set_xscale("log", base=2)
            axes[r][col].set_xticks(result["concurrency"])
            axes[r][col].set_xticklabels(result["concurrency"])
            axes[r][col].set_xlabel("concurrent requests")
            axes[r][col].legend(fontsize=8)
    fig.suptitle(f"speculative decoding on the demo kit ({result['device']}, float32, k={result['num_speculative_tokens']})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=KIT / "target")
    ap.add_argument("--draft", type=Path, default=KIT / "eagle")
    ap.add_argument("--modes", nargs="+", default=["none", "eagle", "ngram"])
    ap.add_argument("--workloads", nargs="+", default=["code", "retrieval"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--requests-per-level", type=int, default=0, help="default: max(4, 2 x concurrency)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-speculative-tokens", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    n_max = max(max(4, 2 * c) if not args.requests_per_level else args.requests_per_level for c in args.concurrency)
    prompts = {wl: build_prompts(tok, n_max, wl, args.prompt_len) for wl in args.workloads}
    result = {
        "model": str(args.model.relative_to(REPO) if args.model.is_relative_to(REPO) else args.model),
        "draft": str(args.draft.relative_to(REPO) if args.draft.is_relative_to(REPO) else args.draft),
        "device": f"CPU x{os.cpu_count()}", "server": "vllm.entrypoints.openai.api_server (vllm 0.32.0)",
        "dtype": "float32", "num_speculative_tokens": args.num_speculative_tokens,
        "max_tokens": args.max_tokens, "concurrency": args.concurrency, "workloads": args.workloads,
        "spec_configs": {m: spec_config(m, args.num_speculative_tokens, Path("eagle")) for m in args.modes},
        "stats_source": "server /metrics: vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total, "
        "vllm:spec_decode_num_accepted_tokens_total (diffed around each run)",
        "runs": {},
    }
    import tempfile

    log_dir = Path(tempfile.mkdtemp(prefix="spec_decode_logs_"))
    print(f"server logs: {log_dir}", flush=True)
    for mode in args.modes:
        print(f"== {mode}: starting server", flush=True)
        srv = make_server(args.model, mode, args.num_speculative_tokens, args.draft, log_dir)
        try:
            srv.start(timeout=300)
            asyncio.run(run_level(srv.url, prompts[args.workloads[0]][:1], 1, 8))  # warm-up
            runs = []
            for wl in args.workloads:
                for c in args.concurrency:
                    n = args.requests_per_level or max(4, 2 * c)
                    before = spec_counters(srv.url)
                    r = asyncio.run(run_level(srv.url, prompts[wl][:n], c, args.max_tokens))
                    after = spec_counters(srv.url)
                    d = {k: after[k] - before[k] for k in after}
                    r.update(workload=wl, concurrency=c)
                    if d["num_draft_tokens"]:
                        r["acceptance_rate"] = round(d["num_accepted_tokens"] / d["num_draft_tokens"], 4)
                        r["mean_acceptance_length"] = round(1 + d["num_accepted_tokens"] / max(1, d["num_drafts"]), 4)
                    runs.append(r)
                    print(f"   {mode:6s} {wl:9s} c={c:2d}: {r['output_tokens_per_s']:8.1f} tok/s, "
                          f"ITL {r['mean_itl_ms']} ms, accept {r.get('acceptance_rate')}", flush=True)
            result["runs"][mode] = runs
        finally:
            srv.stop()
    base = {(r["workload"], r["concurrency"]): r for r in result["runs"].get("none", [])}
    for mode, runs in result["runs"].items():
        for r in runs:
            b = base.get((r["workload"], r["concurrency"]))
            if b and mode != "none":
                r["speedup_tokens_per_s"] = round(r["output_tokens_per_s"] / b["output_tokens_per_s"], 3)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spec_decode.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "spec_decode.png")
    print(f"wrote {args.out / 'spec_decode.json'} and .png", flush=True)


if __name__ == "__main__":
    main()

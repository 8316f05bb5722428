"""`benchmarks/fairness.py --tenants adapters`: a flood on one LoRA adapter against probes on another.

Why a mode of its own: the first fairness figures named tenants by header; when no key names a
tenant the adapter does, and then the flood and the probes also differ in the LoRA weights every
engine step applies. Per variant (one server each, side by side in one run):

  adapters   tenants are the adapters (no API key, no header)
  keys       tenants are named API keys (option.api_key_file): the flood's key on adapter X,
             the probes' key on adapter Y
  lmcache    as `adapters`, with option.lmcache_auto_config=true
  adapters_plain  as `adapters`, with option.tenant_prefill_step=false: vLLM's own scheduler,
             the probe's first prefill in the same step as the flood's decodes (the baseline of
             lmi_server/tenant_scheduler.py)
  one_slot   as `adapters`, with option.max_loras=1: the flood's adapter and the probes' cannot
             run side by side (the tenant scheduler's adapter slot for a newcomer)
  one_slot_plain  as `one_slot`, with vLLM's own scheduler

the embedded assistant (default model) with LoRA on and its example adapters runs
`option.max_num_seqs=8`; first `--probes` solo probes on adapter Y spaced `--probe-every` s,
then the flood: `--flood` streaming requests of adapter X at once, and the same probes again,
starting `--probe-delay` s in; `--rounds` times on the same server (ratios per round and over all
probes). /metrics is scraped every `--scrape-every` s throughout; the
per-tenant series (queue wait, TTFT, tokens, requests in engine and waiting) and vLLM's step count
are kept in the JSON and drawn in RESULTS/NAME_series.png.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import RESULTS, RequestResult, Server, free_port, pct, stream_completion

FLOOD_ADAPTER, PROBE_ADAPTER = "pirate", "shouter"
KEYS = {"flood": "flood-key-0123456789", "probe": "probe-key-0123456789"}
LORA = {"OPTION_ENABLE_LORA": "true", "OPTION_MAX_LORAS": "2", "OPTION_MAX_LORA_RANK": "8", "OPTION_CPU_KV_CACHE_SPACE": "1"}
VARIANTS = ("adapters", "keys", "lmcache", "adapters_plain", "one_slot", "one_slot_plain")
SERIES = (
    "lmi_tenant_queue_depth", "lmi_tenant_requests_in_engine", "lmi_tenant_queue_wait_seconds_sum",
    "lmi_tenant_queue_wait_seconds_count", "lmi_usage_time_to_first_token_seconds_sum",
    "lmi_usage_time_to_first_token_seconds_count", "lmi_usage_generation_tokens_total",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:iteration_tokens_total_count",
)
WARM_UPS = 3
"""Requests per adapter before the first measured probe (adapters loaded, kernels warm)."""
QUESTIONS = ["What is the capital of France?", "How do I reverse a list in Python?", "Why do we have day and night?",
             "What is photosynthesis?", "How does a bicycle stay upright?", "Why is the ocean salty?"]


def cpu_flags() -> list[str]:
    """The CPU features that decide vLLM's CPU kernels (AMX, AVX-512 BF16)."""
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return sorted(words & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})


def engine_cpu_env() -> dict[str, str]:
    """vLLM's CPU thread settings the servers inherit (e.g. VLLM_CPU_OMP_THREADS_BIND=0 on a 2-core
    host: the engine's threads on one core, the other left to the server, the cache server and this
    load generator)."""
    return {k: v for k, v in os.environ.items() if k.startswith(("VLLM_CPU_", "OMP_", "KMP_"))}


def server_env(variant: str, args, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SM_", "HF_MODEL_ID"))}
    env.update(LORA)
    env.update({"OPTION_MAX_NUM_SEQS": str(args.max_num_seqs), "OPTION_ADMISSION_POLICY": "fair",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    if variant == "keys":
        keys = work / "api_keys"
        keys.write_text("".join(f"name={name} key={key}\n" for name, key in KEYS.items()))
        env["OPTION_API_KEY_FILE"] = str(keys)
    if variant == "lmcache":
        env["OPTION_LMCACHE_AUTO_CONFIG"] = "true"
    if variant in ("adapters_plain", "one_slot_plain"):
        env["OPTION_TENANT_PREFILL_STEP"] = "false"
    if variant.startswith("one_slot"):
        env["OPTION_MAX_LORAS"] = "1"
    for option in args.option:
        key, _, value = option.partition("=")
        env["OPTION_" + key.removeprefix("option.").upper()] = value
    return env


def headers(variant: str, who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"} if variant == "keys" else {}


async def ask(client: httpx.AsyncClient, url: str, variant: str, who: str, i: int, args, t0: float) -> dict:
    adapter = FLOOD_ADAPTER if who == "flood" else PROBE_ADAPTER
    body = {"model": adapter, "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
    sent = time.perf_counter() - t0
    r: RequestResult = await stream_completion(client, url + "/v1/chat/completions", body, headers(variant, who))
    status = 200 if r.ok else int(r.error[:3]) if r.error[:3].isdigit() else 0
    return {"who": who, "ok": r.ok, "status": status, "sent_s": round(sent, 3), "ttft_s": round(r.ttft_s, 4),
            "latency_s": round(r.latency_s, 3), "tokens": r.output_tokens, "error": r.error[:120]}


async def probes(client, url, variant, args, t0: float, delay_s: float) -> list[dict]:
    await asyncio.sleep(delay_s)
    tasks = []
    for i in range(args.probes):
        tasks.append(asyncio.create_task(ask(client, url, variant, "probe", i, args, t0)))
        await asyncio.sleep(args.probe_every)
    return list(await asyncio.gather(*tasks))


def sample(text: str) -> dict[str, float]:
    """The kept series of one /metrics page, keyed `name{label=value,...}`."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in SERIES:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k in ("tenant", "adapter"))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


async def scrape(client, url, variant, every_s: float, t0: float, stop: asyncio.Event) -> list[dict]:
    samples = []
    while not stop.is_set():
        try:
            r = await client.get(url + "/metrics", headers=headers(variant, "probe"), timeout=10)
            samples.append({"t": round(time.perf_counter() - t0, 2), "v": sample(r.text)})
        except httpx.HTTPError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass
    return samples


def stats(results: list[dict]) -> dict:
    ttft = [r["ttft_s"] for r in results if r["ok"]]
    return {"requests": len(results), "completed": len(ttft), "statuses": _statuses(results),
            "ttft_p50_s": round(statistics.median(ttft), 3) if ttft else None,
            "ttft_p90_s": round(pct(ttft, 90), 3) if ttft else None, "ttft_max_s": round(max(ttft), 3) if ttft else None}


def _statuses(results: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        out[str(r["status"])] = out.get(str(r["status"]), 0) + 1
    return out


def queue_wait(samples: list[dict], tenant: str) -> dict:
    """A tenant's admitted requests and their mean wait for a slot over the phase, from the histogram."""
    if not samples:
        return {}
    def at(i, name):
        return samples[i]["v"].get(f"lmi_tenant_queue_wait_seconds_{name}{{tenant={tenant}}}", 0.0)
    n, total = at(-1, "count") - at(0, "count"), at(-1, "sum") - at(0, "sum")
    return {"admitted": n, "mean_wait_s": round(total / n, 4) if n else None}


async def one_round(client, url: str, variant: str, args, t0: float) -> dict:
    """Solo probes, then the flood with the same probes from `probe_delay` s in; until the flood is done."""
    solo = await probes(client, url, variant, args, t0, 0.0)
    await asyncio.sleep(1.0)
    t_flood = time.perf_counter() - t0
    flood_task = asyncio.gather(*(ask(client, url, variant, "flood", i, args, t0) for i in range(args.flood)))
    under = await probes(client, url, variant, args, t0, args.probe_delay)
    flood = await flood_task
    done = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in flood + under)
    return {"solo": solo, "under": under, "flood": flood, "t_flood": t_flood, "done": done,
            "tokens_per_s": tokens / (done - t_flood)}


def ratios(solo: list[dict], under: list[dict]) -> dict:
    """Probe TTFT under the flood against alone, median and p90."""
    base, now = stats(solo), stats(under)
    return {f"probe_{stat[5:8]}_vs_solo": round(now[stat] / base[stat], 2) if base[stat] and now[stat] else None
            for stat in ("ttft_p50_s", "ttft_p90_s")}


async def run_variant(url: str, variant: str, args) -> dict:
    limits = httpx.Limits(max_connections=args.flood + 32, max_keepalive_connections=args.flood + 32)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:
        for _ in range(WARM_UPS):  # both adapters loaded, kernels warm
            for who in ("flood", "probe"):
                await ask(client, url, variant, who, 0, args, time.perf_counter())
        t0 = time.perf_counter()
        stop = asyncio.Event()
        scraper = asyncio.create_task(scrape(client, url, variant, args.scrape_every, t0, stop))
        rounds = []
        for _ in range(args.rounds):
            rounds.append(await one_round(client, url, variant, args, t0))
        await asyncio.sleep(args.scrape_every * 2)
        stop.set()
        samples = await scraper
    tenant = ("flood", "probe") if variant == "keys" else (FLOOD_ADAPTER, PROBE_ADAPTER)
    t_flood = rounds[0]["t_flood"]
    in_flood = [s for s in samples if s["t"] >= t_flood]
    solo = [r for rd in rounds for r in rd["solo"]]
    under = [r for rd in rounds for r in rd["under"]]
    flood = [r for rd in rounds for r in rd["flood"]]
    out = {"tenants": {"flood": tenant[0], "probe": tenant[1]}, "probe_solo": stats(solo), "probe_under_flood": stats(under),
           "flood": stats(flood) | {"done_s": round(rounds[0]["done"] - t_flood, 1),
                                    "output_tokens_per_s": round(statistics.mean(rd["tokens_per_s"] for rd in rounds), 2)},
           "queue_wait_under_flood": {who: queue_wait(in_flood, t) for who, t in zip(("flood", "probe"), tenant)},
           "flood_start_s": round(t_flood, 2), "probes": solo + under, "samples": samples,
           "rounds": [ratios(rd["solo"], rd["under"]) | {"probe_solo": stats(rd["solo"]), "probe_under_flood": stats(rd["under"]),
                                                          "flood_tokens_per_s": round(rd["tokens_per_s"], 2)} for rd in rounds]}
    out |= ratios(solo, under)
    print(f"  {variant}: solo {out['probe_solo']} flood {out['probe_under_flood']} "
          f"p50 {out['probe_p50_vs_solo']}x p90 {out['probe_p90_vs_solo']}x; flood {out['flood']}; rounds "
          + ", ".join(f"{r['probe_p50_vs_solo']}x/{r['probe_p90_vs_solo']}x" for r in out["rounds"]), flush=True)
    return out


def run(args, work: Path, argv_for, saved=lambda runs: None) -> dict:
    """Every variant in `args.variants`, one server each; `argv_for(port)` is the serve command.
    `saved(runs)` after each variant: a run cut short keeps the variants it measured."""
    runs = {}
    for variant in args.variants:
        port = free_port()
        server = Server(f"lmi-{variant}", argv_for(port), port, "/ping", work / f"{variant}.log")
        server.env = server_env(variant, args, work)
        print(f"variant {variant}", flush=True)
        try:
            with server:
                runs[variant] = asyncio.run(run_variant(server.url, variant, args))
        except (RuntimeError, TimeoutError) as exc:
            runs[variant] = {"error": str(exc)}
        saved(runs)
    return runs


def plot(doc: dict, name: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {v: r for v, r in doc["runs"].items() if "error" not in r}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for j, (variant, r) in enumerate(runs.items()):
        for k, (phase, color) in enumerate((("probe_solo", "tab:gray"), ("probe_under_flood", "tab:red"))):
            for m, stat in enumerate(("ttft_p50_s", "ttft_p90_s")):
                ax.bar(j * 5 + k * 2 + m, r[phase][stat] or 0, color=color, alpha=1.0 if m == 0 else 0.5)
        ax.text(j * 5 + 1.5, max(r["probe_under_flood"]["ttft_p90_s"] or 0, r["probe_solo"]["ttft_p90_s"] or 0) * 1.03,
                f"{r['probe_p50_vs_solo']}x / {r['probe_p90_vs_solo']}x", ha="center", fontsize=8)
    ax.set_xticks([j * 5 + 1.5 for j in range(len(runs))], list(runs))
    ax.set_ylabel("probe TTFT (s)")
    rounds = doc["args"].get("rounds", 1)
    ax.set_title(f"Probe adapter TTFT, solo (gray) vs under a flood of {doc['args']['flood']} (red); p50 solid, p90 light\n"
                 f"{doc['args']['probes']} probes x {rounds} round(s) per variant, "
                 f"max_num_seqs={doc['args']['max_num_seqs']}, {doc['machine']['cpus']} CPUs, "
                 f"load avg {doc['load_average_at_start'][0]:.1f} at start")
    fig.tight_layout()
    main = RESULTS / f"{name}.png"
    fig.savefig(main, dpi=110)
    return [main, plot_series(runs, RESULTS / f"{name}_series.png", plt)]


def _series(samples: list[dict], prefix: str, tenant: str) -> tuple[list[float], list[float]]:
    ts, vs = [], []
    for s in samples:
        hits = [v for k, v in s["v"].items() if k.startswith(prefix + "{") and f"tenant={tenant}" in k]
        if hits:
            ts.append(s["t"])
            vs.append(sum(hits))
    return ts, vs


def _rate(ts: list[float], vs: list[float]) -> tuple[list[float], list[float]]:
    return ts[1:], [(b - a) / max(1e-9, t1 - t0) for a, b, t0, t1 in zip(vs, vs[1:], ts, ts[1:])]


def plot_series(runs: dict, out: Path, plt) -> Path:
    rows = ("in engine", "waiting", "queue wait (s, interval mean, log)", "TTFT (s, interval mean, log)", "tokens/s")
    fig, axes = plt.subplots(len(rows), max(1, len(runs)), figsize=(5.5 * max(1, len(runs)), 11), squeeze=False, sharex="col")
    for j, (variant, r) in enumerate(runs.items()):
        for who, color in (("flood", "tab:red"), ("probe", "tab:blue")):
            tenant = r["tenants"][who]
            s = r["samples"]
            axes[0][j].plot(*_series(s, "lmi_tenant_requests_in_engine", tenant), color=color, label=tenant)
            axes[1][j].plot(*_series(s, "lmi_tenant_queue_depth", tenant), color=color)
            for row, metric in ((2, "lmi_tenant_queue_wait_seconds"), (3, "lmi_usage_time_to_first_token_seconds")):
                ts, sums = _series(s, metric + "_sum", tenant)
                _, counts = _series(s, metric + "_count", tenant)
                pts = [(t, (b - a) / (d - c)) for t, a, b, c, d in zip(ts[1:], sums, sums[1:], counts, counts[1:]) if d > c]
                axes[row][j].plot([t for t, _ in pts], [max(v, 1e-3) for _, v in pts], color=color, marker="o", markersize=3,
                                  linestyle="")
                axes[row][j].set_yscale("log")
            axes[4][j].plot(*_rate(*_series(s, "lmi_usage_generation_tokens_total", tenant)), color=color)
        for i in range(len(rows)):
            axes[i][j].axvline(r["flood_start_s"], color="black", linewidth=0.6, linestyle="--")
            axes[i][j].set_ylabel(rows[i], fontsize=8)
        axes[0][j].set_title(f"{variant}: tenants {r['tenants']['flood']} (flood, red), {r['tenants']['probe']} (probe, blue)", fontsize=9)
        axes[0][j].legend(fontsize=7)
        axes[-1][j].set_xlabel("s since the solo probes began (dashed: the flood starts)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return out

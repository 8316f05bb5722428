"""The blended prefill's compute path against a full prefill, in this process, on the demo model.

What it measures: `lmi_server/kvcache/blend/forward.py` run through Hugging Face's modules of the
trained demo model (`ensure_demo_model()`, 8 layers, float32) in one Python process. Each prompt is
four documents (slices of Python standard-library sources) in a random order, each after the blend
separator, then a query: the first 16 tokens of one of the documents, so that the answer depends
on reading the context. Each document's KV is computed alone at positions 0.. (as a segment is
stored) and placed at its offset (K re-rotated); the blended prefill then recomputes the
separators, the query and the top `ratio` of the reused tokens by K deviation at layer 1.

Reported per ratio: the blended prefill's time against the full prefill's through the same
adapter (medians), whether the next token equals the full prefill's (top-1), and how many of the
first 8 greedily decoded tokens equal the full prefill's before the first difference (decoded by
the same layer loop over each prompt's KV).

What it does not measure: the served product. No engine, no LMCache lookup or retrieve, no copy
into vLLM's paged KV, no scheduler; the layer loop with SDPA over gathered KV is not vLLM's CPU
attention kernel; the two shared CPU cores make times noisy. The demo model was trained on the
same standard-library sources the documents come from, so its agreement says little about a real
model on real documents; read it as a check that recomputation moves the result towards the full
prefill, and as the compute share of a blended TTFT.

Result committed (results/blend_forward.json, 8 prompts of 1,056 tokens with 1,024 reused, load
about 2 on 2 cores): full prefill 257 ms; blended 57 / 71 / 91 / 121 / 257 ms at ratios 0 / 0.05 /
0.15 / 0.30 / 1; next token as the full prefill's for 7 / 8 / 8 / 7 / 8 of 8 prompts, all 8
greedy tokens for 5 / 7 / 7 / 6 / 8. Eight prompts are few: 0.30 below 0.15 is one prompt.

    python benchmarks/blend_forward.py              # results/blend_forward.{json,png}
    python benchmarks/blend_forward.py --plot-only  # redraw the PNG
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, machine, save  # noqa: E402

RATIOS = (0.0, 0.05, 0.15, 0.30, 1.0)
PROMPTS, DOCS, DOC_TOKENS, QUERY_TOKENS, GREEDY, REPEATS = 8, 4, 256, 16, 8, 3


def documents(tokenizer, n: int, length: int, seed: int) -> list[list[int]]:
    import random
    import sysconfig

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        ids = tokenizer.encode(rng.choice(files).read_text(errors="replace"), add_special_tokens=False)
        if len(ids) < 2 * length:
            continue
        start = rng.randrange(0, len(ids) - length)
        out.append(ids[start : start + length])
    return out


def greedy(forward, adapter, kv, logits, n_prompt: int, steps: int) -> list[int]:
    """Greedy decoding from a prompt's KV with the same layer loop (one token at a time)."""
    import torch

    tokens = []
    kv = [(k.clone(), v.clone()) for k, v in kv]
    for step in range(steps):
        token = int(logits.argmax())
        tokens.append(token)
        position = torch.tensor([n_prompt + step])
        hidden = adapter.embed(torch.tensor([token]))
        for i in range(adapter.num_layers):
            k, v = kv[i]
            grown = (torch.cat((k, torch.zeros_like(k[:1]))), torch.cat((v, torch.zeros_like(v[:1]))))
            hidden, kv[i] = forward._layer(adapter, i, hidden, position, kv=grown)
        logits = adapter.lm_head(adapter.final_norm(hidden))[0]
    return tokens


def run() -> dict:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from lmi_server.demo.builder import ensure_demo_model
    from lmi_server.kvcache.blend import forward
    from lmi_server.kvcache.blend.rope import RopeSpec
    from lmi_server.kvcache.blend.segments import Separator, split_at_separator

    path = ensure_demo_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    adapter = forward.HFLlamaAdapter(model)
    spec = RopeSpec.from_hf_config(model.config.to_dict())
    sep = Separator.from_tokenizer(tokenizer)
    per_ratio = {r: {"blend_s": [], "top1": 0, "greedy_prefix": []} for r in RATIOS}
    full_s, prompt_tokens, reused_tokens = [], [], []
    with torch.no_grad():
        for p in range(PROMPTS):
            docs = documents(tokenizer, DOCS, DOC_TOKENS, seed=p)
            order = torch.randperm(DOCS, generator=torch.Generator().manual_seed(p)).tolist()
            ids = [tokenizer.bos_token_id]
            for i in order:
                ids += list(sep.token_ids) + docs[i]
            ids += list(sep.token_ids) + docs[order[p % DOCS]][:QUERY_TOKENS]
            segments = split_at_separator(ids, sep)
            cache = {tuple(d): forward.prefill(adapter, d).kv for d in docs}
            pieces = [(s.start, cache[s.token_ids]) for s in segments[:-1] if s.token_ids in cache]
            reused_kv, mask = forward.place_segments(
                len(ids), pieces, spec, num_layers=adapter.num_layers, num_kv_heads=adapter.num_kv_heads,
                head_dim=adapter.head_dim,
            )
            prompt_tokens.append(len(ids))
            reused_tokens.append(int(mask.sum()))
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                full = forward.prefill(adapter, ids)
                times.append(time.perf_counter() - t0)
            full_s.append(statistics.median(times))
            reference = greedy(forward, adapter, full.kv, full.logits, len(ids), GREEDY)
            for ratio in RATIOS:
                times = []
                for _ in range(REPEATS):
                    t0 = time.perf_counter()
                    blended = forward.blend_prefill(adapter, ids, reused_kv, mask, ratio=ratio)
                    times.append(time.perf_counter() - t0)
                out = per_ratio[ratio]
                out["blend_s"].append(statistics.median(times))
                out["top1"] += int(blended.logits.argmax() == full.logits.argmax())
                tokens = greedy(forward, adapter, blended.kv, blended.logits, len(ids), GREEDY)
                same = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), GREEDY)
                out["greedy_prefix"].append(same)
            print(f"prompt {p}: {len(ids)} tokens, {int(mask.sum())} reused", flush=True)
    results = {}
    for ratio, out in per_ratio.items():
        results[f"{ratio:g}"] = {
            "blend_prefill_s_median": statistics.median(out["blend_s"]),
            "speedup_vs_full_prefill": statistics.median(f / b for f, b in zip(full_s, out["blend_s"])),
            "top1_agreement": out["top1"] / PROMPTS,
            "greedy_matching_prefix_mean": statistics.mean(out["greedy_prefix"]),
            "greedy_all_match": sum(x == GREEDY for x in out["greedy_prefix"]) / PROMPTS,
        }
    return {
        "what": "blended vs full prefill, compute path only, in-process (HF modules of the demo model, float32); "
                "not the served product",
        "model": str(path), "prompts": PROMPTS, "documents_per_prompt": DOCS, "document_tokens": DOC_TOKENS,
        "query_tokens": QUERY_TOKENS, "greedy_tokens": GREEDY, "check_layer": 1, "repeats": REPEATS,
        "prompt_tokens_median": statistics.median(prompt_tokens), "reused_tokens_median": statistics.median(reused_tokens),
        "full_prefill_s_median": statistics.median(full_s), "torch_threads": torch.get_num_threads(),
        "ratios": results, "machine": machine(), "load_avg_end": os.getloadavg(),
    }


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = list(doc["ratios"])
    r = doc["ratios"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.bar(ratios, [r[x]["blend_prefill_s_median"] * 1e3 for x in ratios], color="tab:blue", label="blended")
    a.axhline(doc["full_prefill_s_median"] * 1e3, color="tab:red", ls="--", label="full prefill")
    a.set_xlabel("recompute ratio")
    a.set_ylabel("prefill ms (median)")
    a.legend()
    a.set_title(f"{doc['prompt_tokens_median']:.0f}-token prompts, {doc['reused_tokens_median']:.0f} reused")
    b.plot(ratios, [r[x]["top1_agreement"] for x in ratios], "o-", label="next token = full prefill's")
    b.plot(ratios, [r[x]["greedy_all_match"] for x in ratios], "s-", label=f"all {doc['greedy_tokens']} greedy tokens match")
    b.set_ylim(-0.05, 1.05)
    b.set_xlabel("recompute ratio")
    b.set_ylabel(f"fraction of {doc['prompts']} prompts")
    b.legend()
    b.set_title("agreement with a full prefill (demo model)")
    fig.suptitle("Blended prefill, compute path in-process (not the served product)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    if "--plot-only" in sys.argv:
        plot(json.loads((RESULTS / "blend_forward.json").read_text()), RESULTS / "blend_forward.png")
        return 0
    doc = run()
    path = save("blend_forward", doc)
    plot(doc, path.with_suffix(".png"))
    print(json.dumps(doc["ratios"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

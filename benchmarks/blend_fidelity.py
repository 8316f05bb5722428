"""Where blended answers part from the full prefill's, and whether the blend's knobs move it: the QA
workload of `blend_rag.py`, in this process, through the blended prefill's own code.

What it runs: the served assistant's weights (float32) through Hugging Face's modules and
`lmi_server/kvcache/blend/forward.py`. Each fact set's six documents (300 tokens each, a 150-token
system prompt, the chat template) are prefilled once in their own order and each segment's KV is
kept as the server keeps it (K moved to segment-local positions, whole 256-token chunks). Every
question then comes with the documents reordered (`blend_rag.workload`, seed 107) and is answered
from a full prefill through the same layer loop (the reference) and from a blended one per
variant, each decoded greedily over its own KV until the end-of-turn token or 16 tokens.

Variants (each a change from the served default: in-context segment KV, check layer 1, recompute
chosen by K deviation):
  ratio R                  the recompute ratio R (1: every token recomputed, the full prefill's answer)
  check layer 4            deviation measured at layer 4 (layers 0-3 computed for every token)
  first 16 recomputed      every reused segment's first 16 tokens recomputed besides the ratio's
  stored alone             segment KV from a prefill of the segment by itself (positions 0..)
  stored after the system prompt   segment KV from a prefill of the system prompt and the segment
                           alone (no other document before it)
  full prefill, bfloat16   no blending: the same full prefill and decode with the weights in
                           bfloat16 (their stored dtype): how far numeric precision alone moves answers
  guided R                 the question-guided mode (`guided.guided_prefill`): the share R of reused
                           tokens the question attends to most, no check layer (--sweep selection)

Fact sets: `towns` (six alike documents, the one blend_rag.py serves) and `subjects` (six
documents on different subjects). Reported per variant: answers identical to the reference, the
reference's accuracy and the variant's, and at each first divergence the reference's top-2
log-probability gap (small: the reference itself was nearly undecided there).

    python benchmarks/blend_fidelity.py              # results/blend_fidelity.{json,png}
    python benchmarks/blend_fidelity.py --sweep ratios   # ratio 0 to 1: results/blend_fidelity_ratios.*
    python benchmarks/blend_fidelity.py --sweep precision   # 0.05 beside bf16: results/blend_fidelity_precision.*
    python benchmarks/blend_fidelity.py --sweep stored   # segment KV stored after the system prompt alone
    python benchmarks/blend_fidelity.py --sweep selection   # the guided mode beside CacheBlend's selection
    python benchmarks/blend_fidelity.py --questions 4 --no-save
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, machine, save, save_twin_axes_plot  # noqa: E402

CHUNK = 256
MAX_TOKENS = 16
VARIANTS = {  # name -> (segment KV, ratio, check layer, first tokens of each segment recomputed)
    "ratio 0": ("context", 0.0, 1, 0),
    "ratio 0.05": ("context", 0.05, 1, 0),
    "ratio 0.15": ("context", 0.15, 1, 0),
    "ratio 0.30": ("context", 0.30, 1, 0),
    "ratio 0.50": ("context", 0.50, 1, 0),
    "ratio 0.70": ("context", 0.70, 1, 0),
    "ratio 1": ("context", 1.0, 1, 0),
    "0.05, check layer 4": ("context", 0.05, 4, 0),
    "0.05, first 16 recomputed": ("context", 0.05, 1, 16),
    "0.05, stored alone": ("alone", 0.05, 1, 0),
    "0.05, stored after the system prompt": ("prefixed", 0.05, 1, 0),
    "0.15, stored after the system prompt": ("prefixed", 0.15, 1, 0),
    "full prefill, bfloat16": ("bfloat16", None, None, 0),  # no blending: the weights' own dtype
    "guided 0.15": ("context", 0.15, None, 0),
    "guided 0.05, stored after the system prompt": ("prefixed", 0.05, None, 0),
    "guided 0.15, stored after the system prompt": ("prefixed", 0.15, None, 0),
    "guided 0.30, stored after the system prompt": ("prefixed", 0.30, None, 0),
}
GUIDED = {name for name in VARIANTS if name.startswith("guided")}
"""Variants served by the question-guided mode (`guided.guided_prefill`): no check layer."""
KNOBS = ["ratio 0", "ratio 0.05", "ratio 0.15", "ratio 0.30", "0.05, check layer 4", "0.05, first 16 recomputed",
         "0.05, stored alone"]
RATIOS = ["ratio 0", "ratio 0.05", "ratio 0.15", "ratio 0.30", "ratio 0.50", "ratio 0.70", "ratio 1"]
SETS = {"towns": KNOBS, "subjects": KNOBS[:4]}
STORED = ["ratio 0.05", "0.05, stored after the system prompt", "ratio 0.15", "0.15, stored after the system prompt"]
PRECISION = ["ratio 0.05", "full prefill, bfloat16"]
SELECTION = ["ratio 0.15", "guided 0.15", "0.15, stored after the system prompt",
             "guided 0.05, stored after the system prompt", "guided 0.15, stored after the system prompt",
             "guided 0.30, stored after the system prompt"]
SWEEPS = {  # --sweep: the result's name and which variants each fact set runs
    "knobs": ("blend_fidelity", SETS),
    **{sweep: (f"blend_fidelity_{sweep}", dict.fromkeys(SETS, variants))
       for sweep, variants in (("ratios", RATIOS), ("stored", STORED), ("precision", PRECISION),
                                   ("selection", SELECTION))},
}


def decode(torch, model, logits, kv, eos: set[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens from a prompt's KV (the prompt's next-token `logits` first) until an end token
    or MAX_TOKENS, decoded by Hugging Face's model over that KV, and the top-2 log-probability gap
    before each."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k.transpose(0, 1)[None], v.transpose(0, 1)[None], i)
    tokens, gaps = [], []
    position = kv[0][0].shape[0]
    for step in range(MAX_TOKENS):
        top = logits.float().log_softmax(-1).topk(2).values
        gaps.append(float(top[0] - top[1]))
        tokens.append(int(logits.argmax()))
        if tokens[-1] in eos or step == MAX_TOKENS - 1:
            break
        out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True,
                    position_ids=torch.tensor([[position]]))
        position += 1
        logits = out.logits[0, -1]
    return tokens, gaps


def run_set(facts: str, variants: list[str], n_questions: int, model, tokenizer, model_bf16=None) -> dict:
    import torch

    from benchmarks.blend_rag import contains, messages, workload
    from lmi_server.kvcache.blend import forward, guided
    from lmi_server.kvcache.blend.rope import RopeSpec, rerotate
    from lmi_server.kvcache.blend.segments import Separator, split_at_separator

    adapter = forward.HFLlamaAdapter(model)
    adapter_bf16 = forward.HFLlamaAdapter(model_bf16) if model_bf16 is not None else None
    spec = RopeSpec.from_hf_config(model.config.to_dict())
    separator = Separator.from_tokenizer(tokenizer, " # # ")
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
    data = workload(tokenizer, 6, 300, 150, n_questions, 107, facts)

    def prompt(order, question):
        return tokenizer.apply_chat_template(messages(data["system"], data["docs"], order, question),
                                             add_generation_prompt=True, tokenize=True, return_dict=False)

    warm = prompt(list(range(len(data["docs"]))), "Which towns are described?")
    full = forward.prefill(adapter, warm)
    stores: dict[str, dict] = {kind: {} for kind in ("context", "alone", "prefixed")
                               if any(VARIANTS[n][0] == kind for n in variants)}
    warm_segments = split_at_separator(warm, separator)
    head = warm[: warm_segments[1].start]  # the system prompt's segment and the separator after it
    for seg in warm_segments:
        cached = len(seg) // CHUNK * CHUNK
        if not cached:
            continue
        local = torch.arange(cached)
        key = tuple(seg.token_ids)
        if "context" in stores:
            stores["context"][key] = [
                (rerotate(k[seg.start : seg.start + cached], local + seg.start, local, spec), v[seg.start : seg.start + cached])
                for k, v in full.kv]
        if "alone" in stores:
            alone = forward.prefill(adapter, seg.token_ids)
            stores["alone"][key] = [(k[:cached], v[:cached]) for k, v in alone.kv]
        if "prefixed" in stores:
            after = forward.prefill(adapter, head + list(seg.token_ids)) if seg.start else full
            at = len(head) if seg.start else 0
            stores["prefixed"][key] = [
                (rerotate(k[at : at + cached], local + at, local, spec), v[at : at + cached]) for k, v in after.kv]

    def compare(tokens, ref_tokens, ref_gaps, gold, seconds) -> dict:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        diverge = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), None)
        if diverge is None and len(tokens) != len(ref_tokens):
            diverge = min(len(tokens), len(ref_tokens))
        return {
            "answer": text, "identical": tokens == ref_tokens, "correct": contains(text, gold),
            "first_divergence": diverge, "blend_s": round(seconds, 3),
            "reference_gap_at_divergence": None if diverge is None or diverge >= len(ref_gaps) else round(ref_gaps[diverge], 4),
        }

    rows = []
    for q, order in zip(data["questions"], data["orders"]):
        ids = prompt(order, q["question"])
        started = time.perf_counter()
        ref = forward.prefill(adapter, ids)
        ref_s = time.perf_counter() - started
        ref_tokens, ref_gaps = decode(torch, model, ref.logits, ref.kv, eos)
        ref_text = tokenizer.decode(ref_tokens, skip_special_tokens=True)
        row = {"question": q["question"], "gold": q["gold"], "reference": ref_text,
               "reference_correct": contains(ref_text, q["gold"]), "reference_s": round(ref_s, 3), "variants": {}}
        segments = split_at_separator(ids, separator)
        for name in variants:
            kind, ratio, check_layer, first = VARIANTS[name]
            if kind == "bfloat16":  # the same full prefill and decode, in bfloat16: how far precision alone moves answers
                started = time.perf_counter()
                result = forward.prefill(adapter_bf16, ids)
                seconds = time.perf_counter() - started
                tokens, _ = decode(torch, model_bf16, result.logits, result.kv, eos)
                row["variants"][name] = compare(tokens, ref_tokens, ref_gaps, q["gold"], seconds)
                continue
            pieces = [(seg.start, stores[kind][tuple(seg.token_ids)]) for seg in segments[:-1]
                      if tuple(seg.token_ids) in stores[kind]]
            started = time.perf_counter()
            kv, reused = forward.place_segments(len(ids), pieces, spec, num_layers=adapter.num_layers,
                                                num_kv_heads=adapter.num_kv_heads, head_dim=adapter.head_dim)
            for start, _ in pieces:
                reused[start : start + first] = False
            if name in GUIDED:
                result = guided.guided_prefill(adapter, ids, kv, reused, ratio=ratio)
            else:
                result = forward.blend_prefill(adapter, ids, kv, reused, ratio=ratio, check_layer=check_layer)
            seconds = time.perf_counter() - started
            tokens, _ = decode(torch, model, result.logits, result.kv, eos)
            row["variants"][name] = compare(tokens, ref_tokens, ref_gaps, q["gold"], seconds)
        rows.append(row)
        print(f"  {facts} {len(rows):2d}/{len(data['questions'])} ref {ref_text!r}: "
              + ", ".join(f"{n} {'=' if v['identical'] else 'x'}" for n, v in row["variants"].items()), flush=True)

    summary = {}
    for name in variants:
        got = [r["variants"][name] for r in rows]
        gaps = [v["reference_gap_at_divergence"] for v in got if v["reference_gap_at_divergence"] is not None]
        summary[name] = {
            "identical": sum(v["identical"] for v in got) / len(got),
            "accuracy": sum(v["correct"] for v in got) / len(got),
            "identical_where_reference_correct": (
                sum(v["identical"] for v, r in zip(got, rows) if r["reference_correct"])
                / max(1, sum(r["reference_correct"] for r in rows))),
            "divergences": len(gaps),
            "reference_gap_at_divergence_median": statistics.median(gaps) if gaps else None,
            "divergences_with_gap_below_0_5": sum(g < 0.5 for g in gaps),
            "blend_s_mean": statistics.fmean(v["blend_s"] for v in got),
        }
    return {"questions": len(rows), "reference_accuracy": sum(r["reference_correct"] for r in rows) / len(rows),
            "reference_s_mean": statistics.fmean(r["reference_s"] for r in rows), "summary": summary, "rows": rows}


def plot(doc: dict, name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if doc.get("sweep") == "ratios":
        return plot_ratios(doc, name, plt)
    sets = doc["sets"]
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.4), squeeze=False)
    for ax, (facts, res) in zip(axes[0], sets.items()):
        names = list(res["summary"])
        x = range(len(names))
        ax.bar(x, [100 * res["summary"][n]["identical"] for n in names], color="#2a7", label="identical to full prefill (%)")
        ax.plot(x, [100 * res["summary"][n]["identical_where_reference_correct"] for n in names], "o", color="#124",
                label="identical where the full prefill was right (%)")
        ax.axhline(80, color="#c33", ls="--", lw=1, label="80 %")
        ax.set_xticks(list(x), names, rotation=25, ha="right", fontsize=8)
        ax.set_ylim(0, 105)
        ax.set_title(f"{facts}: {res['questions']} questions, full-prefill accuracy {100 * res['reference_accuracy']:.0f} %", fontsize=9)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Blended vs full prefill, greedy answers (assistant, float32, in process)")
    fig.tight_layout()
    out = RESULTS / f"{name}.png"
    fig.savefig(out, dpi=110)
    return out


def plot_ratios(doc: dict, name: str, plt) -> Path:
    """Identical answers against the recompute ratio, beside what the in-process prefill still saves."""
    fig, ax = plt.subplots(figsize=(7, 4.4))
    speed = ax.twinx()
    for (facts, res), color in zip(doc["sets"].items(), ("#2a7", "#27c")):
        summary = res["summary"]
        ratios = [doc["variants"][n]["ratio"] for n in summary]
        ax.plot(ratios, [100 * s["identical"] for s in summary.values()], "o-", color=color,
                label=f"{facts}: identical to full prefill (%)")
        speed.plot(ratios, [res["reference_s_mean"] / s["blend_s_mean"] for s in summary.values()], "s:", color=color,
                   label=f"{facts}: full / blended prefill time")
    ax.axhline(80, color="#c33", ls="--", lw=1)
    ax.set_xlabel("recompute ratio")
    ax.set_ylabel("identical greedy answers (%)")
    speed.set_ylabel("prefill time, full / blended (in process)")
    ax.set_ylim(0, 105)
    speed.set_ylim(bottom=0)
    ax.set_title("Blended vs full prefill by recompute ratio (assistant, float32, in process)", fontsize=9)
    return save_twin_axes_plot(fig, ax, speed, name, "lower right")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=24, help="per fact set (24: each question once)")
    ap.add_argument("--sweep", default="knobs", choices=list(SWEEPS),
                    help="knobs: the blend's knobs at ratio 0.05 beside ratios 0-0.30; ratios: ratio 0 to 1")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    name, plan = SWEEPS[args.sweep]
    if args.plot_only:
        print(plot(json.loads((RESULTS / f"{name}.json").read_text()), name))
        return 0
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmi_server.demo.assistant import ensure_assistant

    torch.set_num_threads(args.threads)
    path = str(ensure_assistant())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model_bf16 = (AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
                  if any(VARIANTS[v][0] == "bfloat16" for vs in plan.values() for v in vs) else None)
    doc = {"benchmark": "blend_fidelity", "sweep": args.sweep, "machine": machine(), "load_average_at_start": os.getloadavg(),
           "args": vars(args), "max_tokens": MAX_TOKENS, "variants": {n: dict(zip(("segment_kv", "ratio", "check_layer", "first_recomputed"), v))
                                                                       for n, v in VARIANTS.items()}, "sets": {}}
    started = time.monotonic()
    with torch.inference_mode():
        for facts in args.sets:
            doc["sets"][facts] = run_set(facts, plan[facts], args.questions, model, tokenizer, model_bf16)
    doc["wall_s"] = time.monotonic() - started
    for facts, res in doc["sets"].items():
        print(f"{facts}: full-prefill accuracy {res['reference_accuracy']:.2f}")
        for variant, s in res["summary"].items():
            print(f"  {variant:28s} identical {s['identical']:.2f} (where right {s['identical_where_reference_correct']:.2f}) "
                  f"accuracy {s['accuracy']:.2f} gap median {s['reference_gap_at_divergence_median']}")
    if not args.no_save:
        print(save(name, doc))
        print(plot(doc, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

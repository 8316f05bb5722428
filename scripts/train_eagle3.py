#!/usr/bin/env python
"""Train an EAGLE-3 draft head for the embedded assistant (SmolLM2-135M-Instruct) on the assistant
corpus (lmi_server/demo/assistant/corpus/part-*.jsonl, written by scripts/assistant_corpus.py) and
save it in the layout vLLM loads for `speculative_config={"method": "eagle3", "model": OUT}`.

    python scripts/train_eagle3.py --out /tmp/eagle3 --max-sequences 100 --steps 300
    flock /tmp/engine.lock python scripts/train_eagle3.py --out /tmp/eagle3 --check-only

What vLLM 0.32 runs (vllm/model_executor/models/llama_eagle3.py, the spec-decode proposer):
  * the target returns the residual stream after layers L in `eagle_aux_hidden_state_layer_ids`
    (default for an N-layer Llama: (2, N // 2, N - 3), i.e. (2, 15, 27) for the assistant's 30);
    "after L layers" = hidden + residual, the same value as the output of HF decoder layer L-1;
  * first draft step: h = fc(cat(aux_1, aux_2, aux_3)) [3H -> H]; the draft layer normalises the
    token embedding (input_layernorm) and h (hidden_norm), attends with q/k/v over the 2H
    concatenation, residual = h (un-normalised); post_attention_layernorm (fused add) -> MLP ->
    final `norm` (fused add); logits = lm_head(norm output) over the draft vocabulary, mapped to
    target ids as `draft id + d2t[draft id]` (d2t holds offsets, not absolute ids);
  * later draft steps feed the pre-norm output (mlp out + residual) back as h (no fc);
  * checkpoint keys: fc.weight, midlayer.* (renamed to layers.0.*), norm.weight, lm_head.weight,
    d2t (int64, [draft_vocab]), t2d (bool, [vocab]; ignored by the loader); embed_tokens absent ->
    the target's embedding is shared.
  * config.json: the target's Llama config with architectures ["LlamaForCausalLMEagle3"],
    num_hidden_layers 1, draft_vocab_size, target_hidden_size, eagle_config with the aux layer ids.

Training (all seeded): features from the float32 target over prompt+answer sequences (hooks on
the decoder layers give the three aux states; the label at each position is the target's greedy
next token). Loss: cross-entropy over the draft vocabulary against the target's greedy token
mapped into it (tokens outside it ignored), summed over --unroll K train-time steps where step k
at position p takes step k-1's pre-norm output at p-1 and attends to exactly what vLLM's draft KV
cache holds at its k-th draft step. Held-out metrics: top-1 per step and chained greedy acceptance.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from eagle_draft import lr_at, unrolled_attention  # noqa: E402  (shared with the EAGLE-1 kit trainers)
CORPUS = REPO / "lmi_server" / "demo" / "assistant" / "corpus"
PROTECTED = REPO / "lmi_server" / "demo" / "assistant" / "eagle"
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{(time.time() - T0) / 60:5.1f}m] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# corpus and draft vocabulary


def read_corpus(corpus_dir: Path) -> list[dict]:
    """Every complete line of every part (a part being written may end in a partial line)."""
    rows = []
    for f in sorted(glob.glob(str(corpus_dir / "part-*.jsonl"))):
        with open(f) as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if r.get("prompt_token_ids") and r.get("output_token_ids"):
                    rows.append(r)
    return rows


def is_heldout(row: dict, every: int) -> bool:
    key = str(row.get("id") or row.get("prompt") or row["prompt_token_ids"])
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % every == 0


def token_counts(rows: list[dict], vocab_size: int) -> list[int]:
    counts = [0] * vocab_size
    for r in rows:
        for t in r["output_token_ids"]:
            if 0 <= t < vocab_size:
                counts[t] += 1
    return counts


def coverage_table(counts: list[int], sizes: list[int]) -> dict[int, float]:
    total = max(1, sum(counts))
    order = sorted(counts, reverse=True)
    return {n: sum(order[:n]) / total for n in sizes}


def build_vocab_maps(counts: list[int], n: int, always: tuple[int, ...] = ()):
    """The n most frequent tokens (ties by lower id; `always` forced in), sorted by target id.
    Returns (draft_to_target [n] long, d2t offsets [n] long, t2d bool [V], target_to_draft [V] long, -1 outside)."""
    import torch

    V = len(counts)
    n = min(n, V)
    ranked = sorted(range(V), key=lambda t: (-counts[t], t))
    chosen = [t for t in always if 0 <= t < V]
    seen = set(chosen)
    for t in ranked:
        if len(chosen) >= n:
            break
        if t not in seen:
            chosen.append(t)
            seen.add(t)
    chosen = sorted(chosen[:n])
    d2t_abs = torch.tensor(chosen, dtype=torch.long)
    d2t = d2t_abs - torch.arange(n, dtype=torch.long)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[d2t_abs] = True
    t2dmap = torch.full((V,), -1, dtype=torch.long)
    t2dmap[d2t_abs] = torch.arange(n, dtype=torch.long)
    return d2t_abs, d2t, t2d, t2dmap


def default_aux_layers(num_layers: int) -> list[int]:
    # vLLM's default (SupportsEagle3.get_eagle3_default_aux_hidden_state_layers)
    return [2, num_layers // 2, num_layers - 3]


# --------------------------------------------------------------------------------------------
# the head


def make_head(tcfg, draft_vocab: int, n_aux: int = 3):
    import torch
    from torch import nn

    class RMS(nn.Module):
        def __init__(self, d, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class Eagle3Head(nn.Module):
        def __init__(self):
            super().__init__()
            H, I = tcfg.hidden_size, tcfg.intermediate_size
            self.H = H
            self.nh, self.nkv = tcfg.num_attention_heads, tcfg.num_key_value_heads
            self.hd = getattr(tcfg, "head_dim", None) or H // self.nh
            eps = tcfg.rms_norm_eps
            self.fc = nn.Linear(n_aux * H, H, bias=False)
            self.input_layernorm = RMS(H, eps)
            self.hidden_norm = RMS(H, eps)
            self.q_proj = nn.Linear(2 * H, self.nh * self.hd, bias=False)
            self.k_proj = nn.Linear(2 * H, self.nkv * self.hd, bias=False)
            self.v_proj = nn.Linear(2 * H, self.nkv * self.hd, bias=False)
            self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
            self.post_attention_layernorm = RMS(H, eps)
            self.gate_proj = nn.Linear(H, I, bias=False)
            self.up_proj = nn.Linear(H, I, bias=False)
            self.down_proj = nn.Linear(I, H, bias=False)
            self.norm = RMS(H, eps)
            self.lm_head = nn.Linear(H, draft_vocab, bias=False)

        def qkv(self, emb, h, cos, sin):
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            B, T, _ = emb.shape
            x = torch.cat([self.input_layernorm(emb), self.hidden_norm(h)], dim=-1)
            q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            rep = self.nh // self.nkv
            return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

        def finish(self, h, attn):
            """attn [B,nh,T,d], residual h -> (pre-norm output fed to the next step, logits)."""
            B, _, T, _ = attn.shape
            r = self.o_proj(attn.transpose(1, 2).reshape(B, T, -1)) + h
            n = self.post_attention_layernorm(r)
            r = self.down_proj(nn.functional.silu(self.gate_proj(n)) * self.up_proj(n)) + r
            return r, self.lm_head(self.norm(r))

        def state_for_vllm(self, d2t, t2d, dtype=None) -> dict:
            p = "midlayer."
            sd = {"fc.weight": self.fc.weight, "norm.weight": self.norm.weight, "lm_head.weight": self.lm_head.weight}
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                sd[f"{p}self_attn.{n}.weight"] = getattr(self, n).weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                sd[f"{p}mlp.{n}.weight"] = getattr(self, n).weight
            for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
                sd[f"{p}{n}.weight"] = getattr(self, n).weight
            out = {k: v.detach().to(dtype or torch.float32).clone().contiguous() for k, v in sd.items()}
            out["d2t"] = d2t.clone().long().contiguous()
            out["t2d"] = t2d.clone().bool().contiguous()
            return out

    return Eagle3Head()


def init_head(head, target, draft_ids, aux_layers: list[int]) -> None:
    """fc passes the deepest aux state through, the attention/MLP start as zero residual writers
    (the head starts as "next state = that state"), norm and lm_head come from the target."""
    import torch

    H = head.H
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for lin in (head.q_proj, head.k_proj, head.v_proj, head.gate_proj, head.up_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.02)
        head.o_proj.weight.zero_()
        head.down_proj.weight.zero_()
        head.fc.weight.zero_()
        j = len(aux_layers) - 1
        head.fc.weight[:, j * H:(j + 1) * H] = torch.eye(H)
        head.fc.weight.add_(torch.randn(head.fc.weight.shape, generator=g) * 1e-3)
        head.norm.weight.copy_(target.model.norm.weight)
        head.lm_head.weight.copy_(target.lm_head.weight[draft_ids])


def rotary(target, T: int, like):
    import torch

    pos = torch.arange(T).unsqueeze(0)
    return target.model.rotary_emb(like, pos)


def unroll(head, emb, aux, cos, sin, K: int):
    """K draft steps over every position at once, as vLLM's draft KV cache sees them.

    emb [B,T,H]: embedding of the token the draft reads at position p (token p+1); aux [B,T,3H]:
    the target's aux states at p. Step 1 at p uses h = fc(aux_p); step k > 1 at p uses step k-1's
    pre-norm output at p-1 and attends to step-1 keys at positions <= p-(k-1) plus the step-j key
    at position p-(k-j) (j = 2..k). Returns logits of each step, [B,T,Vd] (row p of step k predicts
    the target's greedy token at p+1, i.e. the token after the one read there)."""
    import torch.nn.functional as F

    B, T, _ = emb.shape
    scale = 1.0 / math.sqrt(head.hd)
    h = head.fc(aux)
    keys, vals, logits = [], [], []
    for k in range(1, K + 1):
        q, kk, vv = head.qkv(emb, h, cos, sin)
        keys.append(kk)
        vals.append(vv)
        attn = unrolled_attention(q, keys, vals, scale)
        r, lg = head.finish(h, attn)
        logits.append(lg)
        h = F.pad(r, (0, 0, 1, 0))[:, :T]  # step k+1 at p reads step k's output at p-1
    return logits


# --------------------------------------------------------------------------------------------
# features


def extract_features(target, rows: list[dict], aux_layers: list[int], max_len: int, store_dtype):
    """Per sequence: ids [T], aux [T-1, 3H] (target aux states at 0..T-2), labels [T-1] (target
    greedy token at 1..T-1, i.e. what follows the token read by draft position p), plen."""
    import torch

    layers = target.model.layers
    captured: dict[int, torch.Tensor] = {}
    hooks = []
    for L in aux_layers:
        if L == 0:
            hooks.append(target.model.embed_tokens.register_forward_hook(
                lambda m, i, o, L=L: captured.__setitem__(L, o)))
        else:
            hooks.append(layers[L - 1].register_forward_hook(
                lambda m, i, o, L=L: captured.__setitem__(L, o[0] if isinstance(o, tuple) else o)))
    feats = []
    try:
        with torch.no_grad():
            for i, r in enumerate(rows):
                ids = (list(r["prompt_token_ids"]) + list(r["output_token_ids"]))[:max_len]
                if len(ids) < 4:
                    continue
                x = torch.tensor([ids])
                captured.clear()
                out = target(input_ids=x)
                greedy = out.logits[0].argmax(-1)  # greedy[t] = target's next token after ids[:t+1]
                aux = torch.cat([captured[L][0] for L in aux_layers], dim=-1)
                T = len(ids)
                feats.append({
                    "ids": x[0],
                    "aux": aux[: T - 1].to(store_dtype),
                    "labels": greedy[1:T].clone(),
                    "plen": len(r["prompt_token_ids"]),
                })
                if (i + 1) % 50 == 0:
                    log(f"features: {i + 1}/{len(rows)}")
    finally:
        for h in hooks:
            h.remove()
    return feats


def seq_forward(head, target, f, K: int, t2dmap):
    """Logits per step for one sequence and the draft-vocab labels per step (-100 = ignored).
    Draft position p (0..T-2) reads ids[p+1] and the target aux at p; label = target greedy at p+1.
    Only positions predicting answer tokens count (p >= plen - 1: the first anchor is the last prompt position)."""
    import torch

    ids, aux, labels = f["ids"], f["aux"].float(), f["labels"]
    T = aux.shape[0]
    emb = target.model.embed_tokens(ids[1:T + 1]).unsqueeze(0)
    cos, sin = rotary(target, T, emb)
    logits = unroll(head, emb, aux.unsqueeze(0), cos, sin, K)
    dl = t2dmap[labels].clone()
    first = max(0, f["plen"] - 1)
    dl[:first] = -100
    dl[dl < 0] = -100
    step_labels = []
    for k in range(1, K + 1):
        # step k at row p predicts the token k-1 positions further on: anchor a = p-(k-1)
        lab = dl.clone()
        lab[: k - 1] = -100
        step_labels.append(lab)
    return [lg[0] for lg in logits], step_labels


def evaluate(head, target, feats, K: int, t2dmap, d2t_abs) -> dict:
    """top1[k]: share of answer positions where step k's argmax (mapped to target ids) equals the
    target's greedy token (inputs along the true greedy path). chain[k]: share of anchors whose first
    k+1 drafted tokens are all accepted under greedy verification (vLLM's per-position acceptance)."""
    import torch

    hits, n = [0] * K, [0] * K
    chain, anchors, accepted = [0] * K, 0, 0
    with torch.no_grad():
        for f in feats:
            logits, _ = seq_forward(head, target, f, K, t2dmap)
            T = f["aux"].shape[0]
            preds = [d2t_abs[lg.argmax(-1)] for lg in logits]  # [T] target ids
            ok = [(preds[k] == f["labels"]) for k in range(K)]
            first = max(0, f["plen"] - 1)
            for k in range(K):
                sl = ok[k][first + k:]
                hits[k] += int(sl.sum())
                n[k] += sl.numel()
            for a in range(first, T - K + 1):
                c = 0
                for k in range(K):
                    if bool(ok[k][a + k]):
                        c += 1
                    else:
                        break
                anchors += 1
                accepted += c
                for k in range(c):
                    chain[k] += 1
    A = max(1, anchors)
    return {
        "positions": n[0],
        "top1_per_step": [round(h / max(1, m), 4) for h, m in zip(hits, n)],
        "anchors": anchors,
        "acceptance_per_position": [round(c / A, 4) for c in chain],
        "acceptance_rate": round(accepted / (A * K), 4),
        "mean_acceptance_length": round(1 + accepted / A, 4),
    }


def curve_point(step: int, train_s: float, recent_losses: list[float], heldout: dict) -> dict:
    """One point of the learning curve: the held-out score after `step` steps, beside the training loss."""
    return {"step": step, "train_s": round(train_s, 1),
            "train_loss": round(sum(recent_losses) / len(recent_losses), 4),
            "heldout_top1_per_step": heldout["top1_per_step"],
            "heldout_mean_acceptance_length": heldout["mean_acceptance_length"]}


# --------------------------------------------------------------------------------------------
# save


def draft_config(tcfg, draft_vocab: int, aux_layers: list[int], dtype: str = "float32") -> dict:
    cfg = tcfg.to_dict()
    for k in ("_name_or_path", "torch_dtype", "dtype", "transformers_version"):
        cfg.pop(k, None)
    cfg.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": tcfg.hidden_size,
        "torch_dtype": dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers), "use_aux_hidden_state": True},
    })
    return cfg


def save_head(head, tcfg, out: Path, d2t, t2d, aux_layers: list[int], record: dict, dtype: str = "float32") -> None:
    """The head in the layout vLLM loads; weights in `dtype` (bfloat16 halves what is shipped; vLLM
    casts them to the engine's dtype on load), the vocabulary maps as they are."""
    import torch

    from safetensors.torch import save_file

    out = out.resolve()
    if out == PROTECTED.resolve() or PROTECTED.resolve() in out.parents:
        raise SystemExit(f"refusing to write under {PROTECTED}")
    out.mkdir(parents=True, exist_ok=True)
    save_file(head.state_for_vllm(d2t, t2d, getattr(torch, dtype)), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(draft_config(tcfg, int(d2t.numel()), aux_layers, dtype), indent=2) + "\n")
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")


# --------------------------------------------------------------------------------------------
# vLLM check (one engine per process)


def vllm_worker(args) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from lmi_server.demo.assistant import ensure_assistant

    prompts = json.loads(Path(args.prompts).read_text())
    kw: dict = {}
    if args.vllm_worker == "eagle3":
        kw["speculative_config"] = {"method": "eagle3", "model": str(Path(args.out).resolve()),
                                    "num_speculative_tokens": args.unroll}
    t0 = time.time()
    llm = LLM(model=str(ensure_assistant()), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=1 << 30,
              max_model_len=2048, disable_log_stats=False, seed=0, **kw)
    res: dict = {"mode": args.vllm_worker, "engine_startup_s": round(time.time() - t0, 1)}
    sp = SamplingParams(temperature=0.0, max_tokens=args.check_tokens)
    t = time.time()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    res["wall_s"] = round(time.time() - t, 2)
    res["outputs"] = [list(o.outputs[0].token_ids) for o in outs]
    res["texts"] = [o.outputs[0].text for o in outs]
    m = {}
    for x in llm.get_metrics():
        if x.name.startswith("vllm:spec_decode"):
            m[x.name] = getattr(x, "value", None) if hasattr(x, "value") else list(getattr(x, "values", []))
    res["spec_counters"] = m
    Path(args.result).write_text(json.dumps(res))


def check_vllm(args, heldout_rows: list[dict]) -> dict:
    out = Path(args.out)
    prompts = [r["prompt_token_ids"] for r in heldout_rows[: args.check_prompts]]
    with tempfile.TemporaryDirectory() as td:
        pf = Path(td) / "prompts.json"
        pf.write_text(json.dumps(prompts))
        results = {}
        for mode in ("plain", "eagle3"):
            rf = Path(td) / f"{mode}.json"
            log(f"vLLM: {mode} engine")
            cmd = [sys.executable, __file__, "--vllm-worker", mode, "--out", str(out), "--prompts", str(pf),
                   "--result", str(rf), "--check-tokens", str(args.check_tokens), "--unroll", str(args.unroll)]
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO))
            if p.returncode != 0:
                print(p.stdout[-3000:], p.stderr[-8000:], file=sys.stderr)
                results[mode] = {"error": p.stderr[-3000:]}
                continue
            results[mode] = json.loads(rf.read_text())
            log(f"vLLM: {mode} done (engine start {results[mode]['engine_startup_s']} s, "
                f"generate {results[mode]['wall_s']} s)")
    plain, eg = results.get("plain", {}), results.get("eagle3", {})
    summary: dict = {"prompts": len(prompts), "max_tokens": args.check_tokens}
    if "outputs" in plain and "outputs" in eg:
        same = [a == b for a, b in zip(plain["outputs"], eg["outputs"])]
        c = eg.get("spec_counters", {})
        drafts = c.get("vllm:spec_decode_num_drafts", 0) or 0
        dt = c.get("vllm:spec_decode_num_draft_tokens", 0) or 0
        acc = c.get("vllm:spec_decode_num_accepted_tokens", 0) or 0
        summary.update({
            "identical_greedy": f"{sum(same)}/{len(same)}",
            "acceptance_rate": round(acc / dt, 4) if dt else None,
            "mean_acceptance_length": round(1 + acc / drafts, 4) if drafts else None,
            "accepted_per_position": c.get("vllm:spec_decode_num_accepted_tokens_per_pos"),
            "spec_counters": c,
            "wall_s": {"plain": plain.get("wall_s"), "eagle3": eg.get("wall_s")},
            "example": eg["texts"][0][:200] if eg.get("texts") else None,
        })
    else:
        summary["errors"] = {k: v.get("error") for k, v in results.items() if "error" in v}
    return summary


# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="output dir (default: a new temp dir)")
    ap.add_argument("--corpus", default=str(CORPUS))
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--coverage-sizes", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--max-sequences", type=int, default=0, help="training sequences (0 = all)")
    ap.add_argument("--heldout-sequences", type=int, default=24)
    ap.add_argument("--heldout-every", type=int, default=10, help="sha1(id) mod this == 0 -> held out")
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps (0 = --epochs over the data)")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--unroll", type=int, default=3, help="train-time draft steps (= num_speculative_tokens)")
    ap.add_argument("--feature-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--save-dtype", default="bfloat16", choices=["float32", "bfloat16"], help="weights as saved")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=0,
                    help="also score the held-out answers every N steps (the learning curve in training.json)")
    ap.add_argument("--aux-layers", default="", help="comma-separated; default vLLM's (2, N//2, N-3)")
    ap.add_argument("--check-vllm", action="store_true", help="after saving, compare vLLM plain vs eagle3")
    ap.add_argument("--check-only", action="store_true", help="only the vLLM check of an existing --out")
    ap.add_argument("--check-prompts", type=int, default=4)
    ap.add_argument("--check-tokens", type=int, default=64)
    ap.add_argument("--vllm-worker", choices=["plain", "eagle3"], help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.vllm_worker:
        vllm_worker(args)
        return

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    import random

    rows = read_corpus(Path(args.corpus))
    if not rows:
        raise SystemExit(f"no corpus rows under {args.corpus}")
    train_rows = [r for r in rows if not is_heldout(r, args.heldout_every)]
    held_rows = [r for r in rows if is_heldout(r, args.heldout_every)]
    log(f"corpus: {len(rows)} answers ({len(train_rows)} train, {len(held_rows)} held out)")

    if args.check_only:
        if not args.out:
            raise SystemExit("--check-only needs --out")
        res = check_vllm(args, held_rows)
        rec_path = Path(args.out) / "training.json"
        if rec_path.exists() and "identical_greedy" in res:
            rec = json.loads(rec_path.read_text())
            rec["vllm"] = res
            rec_path.write_text(json.dumps(rec, indent=1) + "\n")
        print(json.dumps(res, indent=1))
        return

    from transformers import AutoModelForCausalLM

    from lmi_server.demo.assistant import ensure_assistant

    target_dir = ensure_assistant()
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tcfg = target.config
    V = tcfg.vocab_size
    aux_layers = ([int(x) for x in args.aux_layers.split(",")] if args.aux_layers
                  else default_aux_layers(tcfg.num_hidden_layers))
    log(f"target {target_dir} ({tcfg.num_hidden_layers} layers, H {tcfg.hidden_size}, V {V}); aux layers {aux_layers}")

    # draft vocabulary by measurement over the training answers
    counts = token_counts(train_rows, V)
    sizes = [int(s) for s in args.coverage_sizes.split(",") if s]
    cov = coverage_table(counts, sizes)
    held_counts = token_counts(held_rows, V)
    distinct = sum(1 for c in counts if c)
    log(f"output tokens: {sum(counts)} train ({distinct} distinct), {sum(held_counts)} held out")
    d2t_abs, d2t, t2d, t2dmap = build_vocab_maps(counts, args.draft_vocab, always=(tcfg.eos_token_id or 2,))
    held_cov = {}
    for n in sizes:
        ids = set(build_vocab_maps(counts, n)[0].tolist())
        held_cov[n] = sum(c for t, c in enumerate(held_counts) if t in ids) / max(1, sum(held_counts))
    print("draft vocab  train-coverage  held-out-coverage")
    for n in sizes:
        print(f"{n:>11}  {cov[n]:14.4f}  {held_cov[n]:17.4f}")

    rng = random.Random(args.seed)
    rng.shuffle(train_rows)
    if args.max_sequences:
        train_rows = train_rows[: args.max_sequences]
    held_eval = held_rows[: args.heldout_sequences]
    fdt = torch.float32 if args.feature_dtype == "float32" else torch.bfloat16
    t = time.time()
    log(f"features: {len(train_rows)} train + {len(held_eval)} held-out sequences")
    feats = extract_features(target, train_rows, aux_layers, args.max_len, fdt)
    held_feats = extract_features(target, held_eval, aux_layers, args.max_len, fdt)
    feat_s = time.time() - t
    n_pos = sum(int((t2dmap[f["labels"][max(0, f["plen"] - 1):]] >= 0).sum()) for f in feats)
    log(f"features done in {feat_s:.0f}s; {n_pos} trainable answer positions")

    head = make_head(tcfg, int(d2t.numel()), len(aux_layers))
    init_head(head, target, d2t_abs, aux_layers)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    K = args.unroll
    steps = args.steps or max(1, int(args.epochs * len(feats) / args.batch))
    order: list[int] = []
    losses = []
    curve = []  # held-out acceptance as training goes on: does more training still buy acceptance?
    t = time.time()
    for step in range(steps):
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, steps, args.lr, min(20, steps // 10 + 1))
        opt.zero_grad(set_to_none=True)
        tot, hits, cnt = 0.0, [0] * K, [0] * K
        for _ in range(args.batch):
            if not order:
                order = list(range(len(feats)))
                rng.shuffle(order)
            f = feats[order.pop()]
            logits, labs = seq_forward(head, target, f, K, t2dmap)
            loss = 0.0
            for k in range(K):
                m = labs[k] >= 0
                if m.any():
                    loss = loss + torch.nn.functional.cross_entropy(logits[k][m], labs[k][m])
                    hits[k] += int((logits[k][m].argmax(-1) == labs[k][m]).sum())
                    cnt[k] += int(m.sum())
            if torch.is_tensor(loss):
                (loss / (args.batch * K)).backward()
                tot += float(loss.detach()) / K
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        losses.append(tot / args.batch)
        if step % max(1, steps // 20) == 0 or step == steps - 1:
            log(f"step {step}/{steps} loss {losses[-1]:.3f} top1 "
                + "/".join(f"{h / max(1, c):.2f}" for h, c in zip(hits, cnt)))
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < steps:
            head.eval()
            point = evaluate(head, target, held_feats, K, t2dmap, d2t_abs)
            head.train()
            curve.append(curve_point(step + 1, time.time() - t, losses[-args.eval_every:], point))
            log(f"held-out at step {step + 1}: top1 {point['top1_per_step']} "
                f"acceptance length {point['mean_acceptance_length']}")
    train_s = time.time() - t
    head.eval()
    ev = evaluate(head, target, held_feats, K, t2dmap, d2t_abs)
    log(f"held-out: {ev}")

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="eagle3-"))
    record = {
        "target": str(target_dir),
        "aux_layers": aux_layers,
        "draft_vocab": int(d2t.numel()),
        "coverage_train": {str(k): round(v, 4) for k, v in cov.items()},
        "coverage_heldout": {str(k): round(v, 4) for k, v in held_cov.items()},
        "train_sequences": len(feats),
        "train_positions": n_pos,
        "heldout_sequences": len(held_feats),
        "steps": steps, "batch": args.batch, "lr": args.lr, "unroll": K, "seed": args.seed,
        "first_loss": round(losses[0], 4), "final_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
        "feature_s": round(feat_s, 1), "train_s": round(train_s, 1),
        "heldout": ev,
        "curve": curve + [curve_point(steps, train_s, losses[-10:], ev)],
        "params": sum(p.numel() for p in head.parameters()),
    }
    record["saved_dtype"] = args.save_dtype
    save_head(head, tcfg, out, d2t, t2d, aux_layers, record, args.save_dtype)
    log(f"saved {out}")
    if args.check_vllm:
        args.out = str(out)
        record["vllm"] = check_vllm(args, held_rows)
        (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record["vllm"], indent=1))


if __name__ == "__main__":
    main()

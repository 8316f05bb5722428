#!/usr/bin/env python
"""Train the embedded demo kit: a small Llama model on Python's own standard library, plus an
EAGLE-1 draft head for it, then measure both with vLLM.

    python scripts/train_demo_kit.py --out lmi_server/demo/kit

Everything is derived from --seed (data order, initialisation, held-out split), so a re-run on the
same Python version (the corpus is that Python's stdlib) and torch version reproduces the kit.

Phases (each prints progress):
  1. tokenizer  - lmi_server.demo.builder.train_tokenizer (byte-level BPE, 4096, chat template)
  2. target     - LlamaForCausalLM trained on stdlib sources (a few files held out) plus a small
                  share of chat-formatted samples so chat requests answer with code and stop.
  3. draft      - EAGLE-1 head trained on the frozen target's final (post-norm) hidden states:
                  feature regression (smooth L1) + soft cross-entropy through the frozen lm_head,
                  unrolled over the speculative steps the way vLLM runs them (step k consumes the
                  draft's own step k-1 feature and attends to the true-feature KV of earlier
                  positions), on corpus windows and on the target's own greedy continuations.
  4. vllm       - (unless --skip-vllm) vLLM offline engine, float32, with and without EAGLE:
                  losslessness on held-out prompts, acceptance from vLLM's spec-decode counters,
                  decode speed at concurrency 1.
Outputs under --out: target/, eagle/, training.json, training_loss.png.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eagle_draft import draft_unroll, lr_at, make_draft, simulated_acceptance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@dataclass
class KitConfig:
    seed: int = 20240604
    threads: int = 1
    # target architecture
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 16384
    vocab_size: int = 4096
    corpus_bytes: int = 3_000_000
    holdout_every: int = 24  # every Nth corpus file is held out for evaluation
    # target training
    seq_len: int = 256
    batch_size: int = 8
    chat_per_batch: int = 1
    target_steps: int = 420
    target_lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    eval_every: int = 60
    # draft training
    spec_tokens: int = 3
    draft_steps: int = 150
    draft_lr: float = 1.5e-3
    draft_batch_size: int = 16
    gen_sequences: int = 96  # target greedy continuations used as draft training data
    gen_prompt_len: int = 48
    gen_new_tokens: int = 160
    cls_weight: float = 0.3
    # vLLM evaluation
    eval_prompts: int = 12
    eval_max_tokens: int = 128


# --------------------------------------------------------------------------------------------
# data


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def corpus(cfg: KitConfig):
    from lmi_server.demo.builder import stdlib_corpus_files

    files = stdlib_corpus_files(cfg.corpus_bytes)
    train = [f for i, f in enumerate(files) if i % cfg.holdout_every != cfg.holdout_every // 2]
    held = [f for i, f in enumerate(files) if i % cfg.holdout_every == cfg.holdout_every // 2]
    return train, held


def encode_files(tok, files) -> list[list[int]]:
    out = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


class Sampler:
    """Deterministic batches: random windows of the concatenated training stream, plus a few
    chat-formatted samples (user = a code prefix, assistant = its continuation, then <|end|>)."""

    def __init__(self, tok, docs: list[list[int]], cfg: KitConfig, seed: int):
        import torch

        self.tok, self.cfg = tok, cfg
        self.docs = docs
        stream: list[int] = []
        for d in docs:
            stream += [tok.bos_token_id] + d + [tok.eos_token_id]
        self.stream = torch.tensor(stream, dtype=torch.long)
        self.g = torch.Generator().manual_seed(seed)

    def _randint(self, lo: int, hi: int) -> int:
        import torch

        return int(torch.randint(lo, hi, (1,), generator=self.g))

    def window(self, n: int):
        s = self._randint(0, len(self.stream) - n - 1)
        return self.stream[s : s + n]

    def chat_sample(self, n: int):
        """A chat-template sample of at most n tokens; returns (ids, loss_mask)."""
        import torch

        while True:
            d = self.docs[self._randint(0, len(self.docs))]
            if len(d) > 400:
                break
        p_len, c_len = self._randint(24, 96), self._randint(48, 120)
        s = self._randint(0, len(d) - p_len - c_len)
        user = self.tok.decode(d[s : s + p_len])
        answer = self.tok.decode(d[s + p_len : s + p_len + c_len])
        text = self.tok.apply_chat_template(
            [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
            tokenize=False,
        )
        ids = self.tok(text, add_special_tokens=False)["input_ids"][:n]
        mask = [1] * len(ids) + [0] * (n - len(ids))
        ids = ids + [self.tok.pad_token_id] * (n - len(ids))
        return torch.tensor(ids), torch.tensor(mask)

    def batch(self, bs: int, n: int, n_chat: int):
        import torch

        xs, ms = [], []
        for _ in range(bs - n_chat):
            xs.append(self.window(n))
            ms.append(torch.ones(n, dtype=torch.long))
        for _ in range(n_chat):
            x, m = self.chat_sample(n)
            xs.append(x)
            ms.append(m)
        return torch.stack(xs), torch.stack(ms)


# --------------------------------------------------------------------------------------------
# target


def build_target(cfg: KitConfig, tok):
    import torch
    from transformers import LlamaForCausalLM

    from lmi_server.demo.builder import demo_llama_config

    config = demo_llama_config(tok, cfg)
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(config)


def masked_lm_loss(model, x, m):
    import torch.nn.functional as F

    logits = model(input_ids=x[:, :-1], attention_mask=None).logits
    tgt = x[:, 1:].clone()
    tgt[m[:, 1:] == 0] = -100
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)


def eval_target(model, held_windows) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        losses = [masked_lm_loss(model, x, torch.ones_like(x)).item() for x in held_windows]
    model.train()
    return sum(losses) / len(losses)


def train_target(cfg: KitConfig, model, sampler: Sampler, held_windows, record: dict):
    import torch

    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.target_lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    model.train()
    curve, held_curve = [], []
    t0 = time.time()
    for step in range(cfg.target_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.target_steps, cfg.target_lr, cfg.warmup_steps)
        x, m = sampler.batch(cfg.batch_size, cfg.seq_len + 1, cfg.chat_per_batch)
        loss = masked_lm_loss(model, x, m)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        curve.append(round(loss.item(), 4))
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.target_steps:
            hl = eval_target(model, held_windows)
            held_curve.append([step + 1, round(hl, 4)])
            el = time.time() - t0
            log(
                f"target step {step + 1}/{cfg.target_steps} loss {loss.item():.3f} held-out {hl:.3f} "
                f"({el:.0f}s, eta {el / (step + 1) * (cfg.target_steps - step - 1):.0f}s)"
            )
        elif (step + 1) % 10 == 0:
            log(f"target step {step + 1}/{cfg.target_steps} loss {loss.item():.3f}")
    record["target_train_seconds"] = round(time.time() - t0, 1)
    record["target_loss_curve"] = curve
    record["target_heldout_curve"] = held_curve


# --------------------------------------------------------------------------------------------
# EAGLE-1 draft head (same computation as vllm/model_executor/models/llama_eagle.py)


def draft_losses(draft, target, tokens, feats, K: int, cls_weight: float):
    """Loss and per-step greedy agreement. Position p of step k counts only when p >= k-1."""
    import torch
    import torch.nn.functional as F

    T = tokens.shape[1] - 2
    outs = draft_unroll(draft, target, tokens, feats, K)
    tgt_feat = feats[:, 1 : T + 1]
    with torch.no_grad():
        tgt_logp = F.log_softmax(target.lm_head(tgt_feat), -1)
        tgt_top = tgt_logp.argmax(-1)
    total, stats = 0.0, []
    weights = [1.0, 0.8, 0.6, 0.5, 0.4, 0.3][:K]
    for k, out in enumerate(outs, start=1):
        sl = slice(k - 1, T)
        reg = F.smooth_l1_loss(out[:, sl], tgt_feat[:, sl])
        logp = F.log_softmax(target.lm_head(out[:, sl]), -1)
        ce = -(tgt_logp[:, sl].exp() * logp).sum(-1).mean()
        total = total + weights[k - 1] * (reg + cls_weight * ce)
        stats.append(
            dict(reg=reg.item(), ce=ce.item(), top1=(logp.argmax(-1) == tgt_top[:, sl]).float().mean().item())
        )
    return total, stats, outs


def greedy_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int, eos_id: int):
    """Left-padded batched greedy continuation with HF (returns prompt+continuation ids)."""
    import torch

    L = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (L - len(p)) + p for p in prompts])
    att = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=att, max_new_tokens=new_tokens, do_sample=False,
            pad_token_id=pad_id, eos_token_id=None,
        )
    return [row[L - len(p) :].tolist() for row, p in zip(out, prompts)]


def target_features(target, x):
    import torch

    with torch.no_grad():
        return target.model(input_ids=x).last_hidden_state


def train_draft(cfg: KitConfig, target, draft, sampler: Sampler, gen_pool, record: dict):
    import torch

    for p in target.parameters():
        p.requires_grad_(False)
    target.eval()
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.draft_lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(cfg.seed + 7)
    n = cfg.seq_len + 1
    curve = []
    t0 = time.time()
    for step in range(cfg.draft_steps):
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, cfg.draft_steps, cfg.draft_lr, 10)
        half = cfg.draft_batch_size // 2
        xs = [sampler.window(n) for _ in range(cfg.draft_batch_size - half)]
        for i in torch.randint(0, len(gen_pool), (half,), generator=g).tolist():
            xs.append(gen_pool[i])
        L = min(len(x) for x in xs)
        x = torch.stack([t[:L] for t in xs])
        feats = target_features(target, x)
        loss, stats, _ = draft_losses(draft, target, x, feats, cfg.spec_tokens, cfg.cls_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        curve.append(
            {"loss": round(loss.item(), 4), **{f"top1_{k + 1}": round(s["top1"], 4) for k, s in enumerate(stats)},
             **{f"ce_{k + 1}": round(s["ce"], 4) for k, s in enumerate(stats)}}
        )
        if (step + 1) % 10 == 0:
            el = time.time() - t0
            log(
                f"draft step {step + 1}/{cfg.draft_steps} loss {loss.item():.3f} top1 "
                + "/".join(f"{s['top1']:.2f}" for s in stats)
                + f" ({el:.0f}s, eta {el / (step + 1) * (cfg.draft_steps - step - 1):.0f}s)"
            )
    record["draft_train_seconds"] = round(time.time() - t0, 1)
    record["draft_loss_curve"] = curve


# --------------------------------------------------------------------------------------------
# saving


def save_kit(cfg: KitConfig, out: Path, target, draft, tok) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    tdir, ddir = out / "target", out / "eagle"
    tdir.mkdir(parents=True, exist_ok=True)
    ddir.mkdir(parents=True, exist_ok=True)
    target.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        do_sample=False, max_new_tokens=256,
    )
    target.to(torch.bfloat16).save_pretrained(tdir, safe_serialization=True)
    target.to(torch.float32)
    tok.save_pretrained(tdir)
    dcfg = json.loads((tdir / "config.json").read_text())
    dcfg["num_hidden_layers"] = 1
    dcfg["architectures"] = ["EagleLlamaForCausalLM"]
    (ddir / "config.json").write_text(json.dumps(dcfg, indent=2) + "\n")
    sd = {k: v.to(torch.bfloat16) for k, v in draft.state_for_vllm().items()}
    save_file(sd, str(ddir / "model.safetensors"), metadata={"format": "pt"})


def round_to_bf16_(module) -> None:
    """The kit stores bfloat16 weights; train/evaluate the draft against exactly those values."""
    import torch

    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    tc = record["target_loss_curve"]
    ax[0].plot(range(1, len(tc) + 1), tc, lw=0.8, label="train (batch)")
    hc = record["target_heldout_curve"]
    ax[0].plot([h[0] for h in hc], [h[1] for h in hc], "o-", label="held-out files")
    ax[0].set_title(f"target: Llama {record['config']['num_hidden_layers']}x{record['config']['hidden_size']}")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("cross-entropy (nats/token)")
    ax[0].legend()
    dc = record["draft_loss_curve"]
    xs = range(1, len(dc) + 1)
    ax[1].plot(xs, [d["loss"] for d in dc], lw=0.8, label="total loss")
    ax2 = ax[1].twinx()
    for k in range(1, record["config"]["spec_tokens"] + 1):
        ax2.plot(xs, [d[f"top1_{k}"] for d in dc], lw=0.8, ls="--", label=f"top-1 agreement, step {k}")
    ax2.set_ylim(0, 1)
    ax[1].set_title("EAGLE-1 draft head")
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("loss")
    ax2.legend(loc="center right", fontsize=8)
    ax[1].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# --------------------------------------------------------------------------------------------
# vLLM evaluation (each engine in its own process)


def vllm_worker(args) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    out = Path(args.out)
    prompts = json.loads(Path(args.prompts).read_text())
    kw = {}
    if args.vllm_worker == "eagle":
        kw["speculative_config"] = {
            "method": "eagle", "model": str(out / "eagle"), "num_speculative_tokens": args.spec_tokens,
        }
    t0 = time.time()
    llm = LLM(
        model=str(out / "target"), dtype="float32", enforce_eager=True, disable_log_stats=False,
        max_model_len=4096, seed=0, **kw,
    )
    startup = time.time() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)

    def counters():
        m = {}
        for x in llm.get_metrics():
            if x.name.startswith("vllm:spec_decode"):
                m[x.name] = getattr(x, "value", None) if hasattr(x, "value") else list(x.values)
        return m

    before = counters()
    outs, decode_s, n_out = [], 0.0, 0
    for p in prompts:  # concurrency 1
        t = time.time()
        r = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
        decode_s += time.time() - t
        outs.append(list(r.outputs[0].token_ids))
        n_out += len(r.outputs[0].token_ids)
    after = counters()
    res = {
        "mode": args.vllm_worker, "engine_startup_s": round(startup, 1), "output_tokens": n_out,
        "wall_s": round(decode_s, 3), "tokens_per_s": round(n_out / decode_s, 2), "outputs": outs,
    }
    if kw:
        d = {k: (after[k] - before.get(k, 0)) if not isinstance(after[k], list) else
             [a - b for a, b in zip(after[k], before.get(k, [0] * len(after[k])))] for k in after}
        drafts = d.get("vllm:spec_decode_num_drafts", 0)
        dt = d.get("vllm:spec_decode_num_draft_tokens", 0)
        acc = d.get("vllm:spec_decode_num_accepted_tokens", 0)
        res["spec_counters"] = d
        res["acceptance_rate"] = round(acc / dt, 4) if dt else None
        res["mean_acceptance_length"] = round(1 + acc / drafts, 4) if drafts else None
        per = d.get("vllm:spec_decode_num_accepted_tokens_per_pos")
        if per and drafts:
            res["per_position_acceptance"] = [round(v / drafts, 4) for v in per]
    Path(args.result).write_text(json.dumps(res))


def run_vllm_eval(cfg: KitConfig, out: Path, prompts: list[list[int]], tok, record: dict) -> None:
    pf = out / ".eval_prompts.json"
    pf.write_text(json.dumps(prompts))
    results = {}
    for mode in ("plain", "eagle"):
        rf = out / f".eval_{mode}.json"
        log(f"vLLM evaluation: {mode} (engine start ~30 s)")
        cmd = [sys.executable, __file__, "--vllm-worker", mode, "--out", str(out), "--prompts", str(pf),
               "--result", str(rf), "--max-tokens", str(cfg.eval_max_tokens), "--spec-tokens", str(cfg.spec_tokens)]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-6000:], file=sys.stderr)
            raise RuntimeError(f"vLLM {mode} evaluation failed")
        results[mode] = json.loads(rf.read_text())
        rf.unlink()
    pf.unlink()
    plain, eagle = results["plain"], results["eagle"]
    same = [a == b for a, b in zip(plain["outputs"], eagle["outputs"])]
    first_diff = []
    for a, b in zip(plain["outputs"], eagle["outputs"]):
        first_diff.append(next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), None))
    record["vllm_eval"] = {
        "source_of_stats": "vllm.LLM.get_metrics() (disable_log_stats=False): Prometheus counters "
        "vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens / "
        "_num_accepted_tokens_per_pos (vllm/v1/spec_decode/metrics.py SpecDecodingProm); "
        "acceptance = accepted/draft tokens, mean acceptance length = 1 + accepted/drafts",
        "dtype": "float32", "enforce_eager": True, "num_speculative_tokens": cfg.spec_tokens,
        "prompts": len(prompts), "max_tokens": cfg.eval_max_tokens, "concurrency": 1,
        "lossless": all(same), "identical_outputs": f"{sum(same)}/{len(same)}",
        "first_divergence_token": first_diff,
        "acceptance_rate": eagle.get("acceptance_rate"),
        "mean_acceptance_length": eagle.get("mean_acceptance_length"),
        "per_position_acceptance": eagle.get("per_position_acceptance"),
        "spec_counters": eagle.get("spec_counters"),
        "plain_tokens_per_s": plain["tokens_per_s"], "eagle_tokens_per_s": eagle["tokens_per_s"],
        "speedup": round(eagle["tokens_per_s"] / plain["tokens_per_s"], 3),
        "sample_output": tok.decode(plain["outputs"][0])[:600],
    }
    log("vLLM: " + json.dumps({k: v for k, v in record["vllm_eval"].items() if k not in ("sample_output", "source_of_stats", "spec_counters")}))


# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "lmi_server/demo/kit"))
    ap.add_argument("--seed", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--target-steps", type=int)
    ap.add_argument("--draft-steps", type=int)
    ap.add_argument("--gen-sequences", type=int)
    ap.add_argument("--skip-vllm", action="store_true", help="train and save only")
    ap.add_argument("--vllm-only", action="store_true", help="re-run the vLLM evaluation of an existing kit")
    # internal: one vLLM engine per process
    ap.add_argument("--vllm-worker", choices=["plain", "eagle"], help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--spec-tokens", type=int, default=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_worker:
        return vllm_worker(args)

    import torch
    from transformers import AutoTokenizer

    from lmi_server.demo.builder import DemoModelSpec, train_tokenizer

    cfg = KitConfig()
    for k in ("seed", "threads", "target_steps", "draft_steps", "gen_sequences"):
        if getattr(args, k) is not None:
            setattr(cfg, k, getattr(args, k))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    t_all = time.time()

    train_files, held_files = corpus(cfg)
    record: dict = {
        "config": asdict(cfg), "python": platform.python_version(), "torch": torch.__version__,
        "corpus_files": {"train": len(train_files), "held_out": [f.name for f in held_files]},
        "corpus_sha256": hashlib.sha256(b"".join(f.read_bytes() for f in train_files + held_files)).hexdigest(),
    }

    if args.vllm_only:
        tok = AutoTokenizer.from_pretrained(out / "target")
        record = json.loads((out / "training.json").read_text())
        prompts = json.loads((out / "eval_prompts.json").read_text()) if (out / "eval_prompts.json").exists() else None
        held_docs = encode_files(tok, held_files)
        prompts = prompts or eval_prompts(cfg, tok, held_docs)
        run_vllm_eval(cfg, out, prompts, tok, record)
        (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
        return

    spec = DemoModelSpec(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, max_position_embeddings=cfg.max_position_embeddings,
        seed=cfg.seed, corpus_bytes=cfg.corpus_bytes,
    )
    log("phase 1: tokenizer")
    tok_dir = out / ".tokenizer"
    tok = train_tokenizer(spec, tok_dir)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    train_docs = encode_files(tok, train_files)
    held_docs = encode_files(tok, held_files)
    record["tokens"] = {"train": sum(map(len, train_docs)), "held_out": sum(map(len, held_docs))}
    log(f"corpus: {len(train_files)} train files ({record['tokens']['train']} tokens), "
        f"{len(held_files)} held-out files ({record['tokens']['held_out']} tokens)")

    sampler = Sampler(tok, train_docs, cfg, cfg.seed)
    held_sampler = Sampler(tok, held_docs, cfg, cfg.seed + 1)
    held_windows = [held_sampler.batch(8, cfg.seq_len + 1, 0)[0] for _ in range(4)]

    log(f"phase 2: target training ({cfg.target_steps} steps x {cfg.batch_size} x {cfg.seq_len} tokens)")
    target = build_target(cfg, tok)
    record["target_params"] = sum(p.numel() for p in target.parameters())
    train_target(cfg, target, sampler, held_windows, record)
    round_to_bf16_(target)
    record["target_final_train_loss"] = round(sum(record["target_loss_curve"][-10:]) / 10, 4)
    record["target_final_heldout_loss"] = round(eval_target(target, held_windows), 4)
    log(f"target done: held-out loss (bf16 weights) {record['target_final_heldout_loss']}")

    log(f"phase 3: draft data: {cfg.gen_sequences} greedy continuations of the target")
    t0 = time.time()
    gen_g = torch.Generator().manual_seed(cfg.seed + 3)
    gen_pool = []
    for b in range(0, cfg.gen_sequences, 16):
        prompts = []
        for _ in range(min(16, cfg.gen_sequences - b)):
            d = train_docs[int(torch.randint(0, len(train_docs), (1,), generator=gen_g))]
            s = int(torch.randint(0, max(1, len(d) - cfg.gen_prompt_len), (1,), generator=gen_g))
            prompts.append(d[s : s + cfg.gen_prompt_len])
        for seq in greedy_generate(target, prompts, cfg.gen_new_tokens, tok.pad_token_id, tok.eos_token_id):
            gen_pool.append(torch.tensor(seq))
        log(f"  generated {len(gen_pool)}/{cfg.gen_sequences}")
    record["draft_data_generation_seconds"] = round(time.time() - t0, 1)

    log(f"phase 3: draft training ({cfg.draft_steps} steps, {cfg.spec_tokens} unrolled steps)")
    draft = make_draft(target)
    record["draft_params"] = sum(p.numel() for p in draft.parameters())
    train_draft(cfg, target, draft, sampler, gen_pool, record)
    round_to_bf16_(draft)

    prompts = eval_prompts(cfg, tok, held_docs)
    held_gen = greedy_generate(target, prompts, cfg.eval_max_tokens, tok.pad_token_id, tok.eos_token_id)
    record["heldout_simulated_acceptance"] = simulated_acceptance(
        draft, target, held_gen, [len(p) for p in prompts], cfg.spec_tokens
    )
    log(f"held-out simulated greedy acceptance: {record['heldout_simulated_acceptance']}")
    record["sample_greedy_heldout"] = tok.decode(held_gen[0])[:800]

    save_kit(cfg, out, target, draft, tok)
    import shutil

    shutil.rmtree(tok_dir, ignore_errors=True)
    (out / "eval_prompts.json").write_text(json.dumps(prompts) + "\n")
    record["train_seconds_total"] = round(time.time() - t_all, 1)
    record["kit_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    plot(record, out / "training_loss.png")
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    log(f"kit written to {out} ({record['kit_bytes'] / 1e6:.1f} MB)")

    if not args.skip_vllm:
        run_vllm_eval(cfg, out, prompts, tok, record)
        (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    log(f"done in {time.time() - t_all:.0f}s")


def eval_prompts(cfg: KitConfig, tok, held_docs) -> list[list[int]]:
    """Held-out prompts: deterministic code prefixes from the held-out files."""
    prompts = []
    i = 0
    while len(prompts) < cfg.eval_prompts:
        d = held_docs[i % len(held_docs)]
        k = i // len(held_docs)
        s = (len(d) * (2 * k + 1)) // (2 * (cfg.eval_prompts // len(held_docs) + 2))
        prompts.append([tok.bos_token_id] + d[s : s + cfg.gen_prompt_len])
        i += 1
    return prompts


if __name__ == "__main__":
    main()

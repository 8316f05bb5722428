#!/usr/bin/env python
"""Train the assets of the default assistant (SmolLM2-135M-Instruct): an EAGLE-1 draft head and two
example LoRA adapters, all by self-distillation from the model's own greedy answers (CPU, offline).

    python scripts/train_assistant_kit.py --out lmi_server/demo/assistant --max-minutes 50

Everything follows from --seed (prompt order, held-out split, initialisation, batches).

Phases (each prints progress; outputs are written as soon as a phase ends):
  1. data     - chat-formatted prompts (hand-written questions, topic x template questions, code
                tasks, questions about standard-library functions made from their docstrings);
                the base model's greedy answers (HF transformers, float32).
  2. eagle    - EAGLE-1 head (one Llama layer, as vllm/model_executor/models/llama_eagle.py runs
                it: fc([embed(next token), feature]) -> layer 0 without input_layernorm ->
                hidden + residual, no final norm; lm_head of the target) trained on the target's
                final post-norm hidden states of its own answers: smooth L1 feature regression +
                soft cross-entropy against the target's next-token distribution through the frozen
                lm_head, unrolled over the 3 speculative steps the way vLLM runs them. Held-out
                acceptance is simulated offline with HF (greedy verification).
  3. adapters - `pirate`: LoRA on (prompt -> rule-based pirate rewrite of the base answer);
                `shouter`: LoRA on (prompt -> first sentence of the base answer) plus model.py
                (upper-cases the output; the one copy of the shouter formatters, which adapters/shouter/model.py runs).
  4. vllm     - (unless --skip-vllm) vLLM offline engines in float32: plain vs EAGLE (identical
                greedy outputs? acceptance from the spec-decode counters) and a LoRA engine
                (answers of base / pirate / shouter).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eagle_draft import draft_unroll, lr_at, make_draft, simulated_acceptance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASE = Path(os.environ.get("LMI_ASSISTANT_DIR", str(Path.home() / ".cache/lmi_server/smollm2-135m-instruct-bfloat16")))
BASE_NAME = "smollm2-135m-instruct"
SHOUTER_MODEL_PY = REPO / "lmi_server" / "demo" / "assistant" / "adapters" / "shouter" / "model.py"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{(time.time() - T0) / 60:5.1f}m] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# prompts

QUESTIONS = [
    "What is the tallest mountain in the world?", "How do airplanes stay in the air?",
    "Why is the sky blue?", "What causes the seasons on Earth?", "How does a refrigerator work?",
    "What is the difference between weather and climate?", "Who wrote Romeo and Juliet?",
    "What is the largest ocean on Earth?", "How many continents are there?",
    "What is the boiling point of water?", "Why do we need sleep?", "How do vaccines work?",
    "What is a black hole?", "What is the speed of light?", "How do plants make food?",
    "What is the capital of Japan?", "What is the capital of Italy?", "What is the capital of Canada?",
    "Give me three tips for learning a new language.", "How can I save money each month?",
    "What are the benefits of regular exercise?", "How do I make a cup of tea?",
    "Suggest a name for a pet cat.", "What should I pack for a beach trip?",
    "How do I stay focused while studying?", "Describe a rainy day in two sentences.",
    "Write a short poem about the moon.", "Tell me a fun fact about octopuses.",
    "What is the difference between a virus and a bacterium?", "How does the internet work?",
    "What is machine learning?", "What is an API?", "What does a CPU do?", "What is a database?",
    "Explain recursion to a beginner.", "What is the difference between a list and a tuple in Python?",
    "What is a prime number?", "What is 12 times 12?", "How many days are in a leap year?",
    "Why do leaves change color in autumn?", "What is gravity?", "How do bees make honey?",
    "What is the main ingredient of guacamole?", "How do I boil an egg?",
    "What are some healthy breakfast ideas?", "Why is exercise good for the brain?",
    "What is the purpose of a resume?", "How do I write a polite email to my teacher?",
    "What is the water cycle?", "Who was Albert Einstein?", "What is democracy?",
    "Why do cats purr?", "How far is the Moon from Earth?", "What is the Great Wall of China?",
    "How do I start running as a beginner?", "What is a good way to learn to code?",
    "What is the difference between HTTP and HTTPS?", "What is version control?",
    "Recommend a board game for a family evening.", "How do magnets work?",
    "What is the role of the heart in the human body?", "What is a healthy amount of water to drink per day?",
    "Can you explain what inflation is?", "What are renewable energy sources?",
    "Why is recycling important?", "How do I plant tomatoes?", "What is the history of the bicycle?",
    "How can I be more productive at work?", "What makes a good friend?", "What is a haiku?",
]
TOPICS = [
    "volcanoes", "the Roman Empire", "electric cars", "photosynthesis", "the human brain", "coffee",
    "the stock market", "rainbows", "dinosaurs", "the solar system", "climate change", "chess",
    "the French Revolution", "earthquakes", "DNA", "the printing press", "honeybees", "glaciers",
    "cloud computing", "solar panels", "the immune system", "jazz music", "the Olympic Games",
    "deserts", "coral reefs", "the moon landing", "blockchain", "compound interest", "meditation",
    "nutrition", "the Pyramids of Giza", "tea", "trees", "rain forests", "wolves", "robots",
    "electricity", "sound waves", "bread baking", "sharks", "time zones", "the alphabet",
]
TEMPLATES = [
    "Explain {t} in simple terms.", "Give me three interesting facts about {t}.", "What is {t}?",
    "Why is {t} important?", "Write two sentences about {t}.", "Tell me something surprising about {t}.",
]
CODE_TASKS = [
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that returns the factorial of n.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function to compute the Fibonacci numbers up to n.",
    "Write a Python function that removes duplicates from a list.",
    "Write a Python function that checks if a string is a palindrome.",
    "Write a Python function that returns the largest element of a list.",
    "Write a Python function that merges two sorted lists.",
    "How do I read a file line by line in Python?", "How do I sort a dictionary by value in Python?",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Python class for a simple bank account.", "How do I reverse a list in Python?",
    "Write a JavaScript function that adds two numbers.", "Write a SQL query that selects all users older than 30.",
    "Write a Python function that computes the average of a list of numbers.",
    "How do I handle exceptions in Python?", "Write a Python function that flattens a nested list.",
    "What does the Python keyword yield do?", "Write a bash command that counts the lines in a file.",
    "Write a Python function that returns the square of each number in a list.",
    "How do I create a virtual environment in Python?", "Write a Python function that checks if a year is a leap year.",
    "What is a Python decorator? Show a small example.",
]
HELD_OUT = [  # never used for training; the first two are the README examples
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "What is the capital of Germany?", "How do clouds form?", "Give me two tips for better sleep.",
    "What is the largest planet in our solar system?", "Why do we have tides?",
    "Explain what a computer network is.", "Tell me a fun fact about elephants.",
    "What is the difference between a lake and a river?", "How do I make pancakes?",
    "Write a Python function that sums the digits of a number.",
    "Write a Python function that finds the minimum of a list.", "What is photosynthesis used for?",
    "Who painted the Mona Lisa?", "What are the three states of water?", "How does a rainbow form?",
    "What is a good habit to start this year?", "Explain what an operating system does.",
    "Why is the ocean salty?", "What is the purpose of a firewall?", "How many legs does a spider have?",
    "What is a noun?", "Write a Python function that counts the words in a sentence.",
]


def stdlib_questions(rng: random.Random, n: int) -> list[str]:
    """Questions about standard-library functions, made from their docstrings' first lines."""
    import importlib

    out = []
    for modname in ["os", "os.path", "json", "math", "random", "re", "string", "itertools", "functools",
                    "collections", "shutil", "time", "datetime", "statistics", "textwrap", "heapq", "bisect"]:
        mod = importlib.import_module(modname)
        for name in sorted(dir(mod)):
            obj = getattr(mod, name)
            doc = getattr(obj, "__doc__", None)
            if name.startswith("_") or not callable(obj) or not doc or isinstance(obj, type) and name[0].isupper() is False:
                continue
            first = doc.strip().splitlines()[0].strip()
            if 15 < len(first) < 120 and "(" not in first[:len(name) + 1]:
                out.append(f"What does Python's {modname}.{name} do?")
    rng.shuffle(out)
    return out[:n]


def all_prompts(seed: int, n_train: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    pool = list(QUESTIONS) + list(CODE_TASKS) + [tp.format(t=t) for t in TOPICS for tp in TEMPLATES]
    pool += stdlib_questions(rng, 40)
    held = set(HELD_OUT)
    pool = sorted(set(p for p in pool if p not in held))
    rng.shuffle(pool)
    # keep the hand-written questions and code tasks in, fill with the rest
    first = [p for p in pool if p in QUESTIONS or p in CODE_TASKS]
    rest = [p for p in pool if p not in first]
    train = (first + rest)[:n_train]
    rng.shuffle(train)
    return train, list(HELD_OUT)


# --------------------------------------------------------------------------------------------
# model helpers


def load_base():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BASE)
    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return tok, model


def chat_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def greedy(model, tok, prompts: list[list[int]], max_new: int, bs: int = 16) -> list[list[int]]:
    """Batched, left-padded greedy answers (token ids, ending with eos when the answer finished)."""
    import torch

    eos, outs = tok.eos_token_id, []
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    res: dict[int, list[int]] = {}
    for b in range(0, len(order), bs):
        idx = order[b : b + bs]
        L = max(len(prompts[i]) for i in idx)
        ids = torch.tensor([[eos] * (L - len(prompts[i])) + prompts[i] for i in idx])
        att = torch.tensor([[0] * (L - len(prompts[i])) + [1] * len(prompts[i]) for i in idx])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=eos, eos_token_id=eos)
        for j, i in enumerate(idx):
            a = out[j, L:].tolist()
            if eos in a:
                a = a[: a.index(eos) + 1]
            res[i] = a
    for i in range(len(prompts)):
        outs.append(res[i])
    return outs


def fingerprint(base: Path) -> str:
    """sha256 over config.json and the weight files' bytes (as scripts/train_adapters.py)."""
    h = hashlib.sha256()
    for f in [base / "config.json"] + sorted(base.glob("*.safetensors")):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# EAGLE-1 draft (same computation as vllm/model_executor/models/llama_eagle.py)

def target_stats(target, seqs, topk: int):
    """Per sequence: post-norm final hidden states and the target's top-k next-token distribution."""
    import torch

    data = []
    with torch.no_grad():
        for s in seqs:
            x = torch.tensor([s])
            h = target.model(input_ids=x).last_hidden_state[0]
            lp = torch.log_softmax(target.lm_head(h), -1)
            v, i = lp.topk(topk, -1)
            data.append({"ids": x[0], "feat": h, "top_i": i, "top_p": v.exp()})
    return data


def draft_step_loss(draft, target, batch, K: int, cls_weight: float, n_neg: int, g):
    """Loss on a right-padded batch. CE is computed over a vocabulary subset (all target top-k ids of
    the batch plus random negatives) against the renormalised target top-k distribution."""
    import torch
    import torch.nn.functional as F

    L = max(len(d["ids"]) for d in batch)
    B, H = len(batch), batch[0]["feat"].shape[-1]
    ids = torch.full((B, L), 2, dtype=torch.long)
    feat = torch.zeros(B, L, H)
    top_i = torch.zeros(B, L, batch[0]["top_i"].shape[-1], dtype=torch.long)
    top_p = torch.zeros(B, L, batch[0]["top_p"].shape[-1])
    mask = torch.zeros(B, L)
    for b, d in enumerate(batch):
        n = len(d["ids"])
        ids[b, :n], feat[b, :n], top_i[b, :n], top_p[b, :n] = d["ids"], d["feat"], d["top_i"], d["top_p"]
        mask[b, d["start"] : n] = 1
    T = L - 2
    outs = draft_unroll(draft, target, ids, feat, K)
    tgt_feat = feat[:, 1 : T + 1]
    m = mask[:, 1 : T + 1] * mask[:, 2 : T + 2]  # predicted feature and the token after it are real
    ti, tp = top_i[:, 1 : T + 1], top_p[:, 1 : T + 1]
    vocab = torch.unique(torch.cat([ti.reshape(-1), torch.randint(0, target.config.vocab_size, (n_neg,), generator=g)]))
    remap = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    remap[vocab] = torch.arange(len(vocab))
    W = target.lm_head.weight[vocab]
    tsub = remap[ti]
    tpn = tp / tp.sum(-1, keepdim=True).clamp(min=1e-9)  # padded positions have no distribution
    total, stats = 0.0, []
    weights = [1.0, 0.8, 0.6, 0.5, 0.4][:K]
    for k, out in enumerate(outs, start=1):
        mk = m.clone()
        mk[:, : k - 1] = 0
        denom = mk.sum().clamp(min=1)
        reg = (F.smooth_l1_loss(out, tgt_feat, reduction="none").mean(-1) * mk).sum() / denom
        logp = torch.log_softmax(out @ W.t(), -1)
        ce = (-(tpn * logp.gather(-1, tsub)).sum(-1) * mk).sum() / denom
        top1 = ((logp.argmax(-1) == tsub[..., 0]).float() * mk).sum() / denom
        total = total + weights[k - 1] * (reg + cls_weight * ce)
        stats.append(dict(reg=reg.item(), ce=ce.item(), top1=top1.item()))
    return total, stats


def train_eagle(args, tok, target, train_seqs, prompt_lens, held_seqs, held_plens, out: Path, deadline: float) -> dict:
    import torch
    from safetensors.torch import save_file

    rec: dict = {"seed": args.seed, "method": "EAGLE-1", "num_speculative_tokens": args.spec_tokens}
    t0 = time.time()
    log(f"eagle: target features and top-{args.topk} of {len(train_seqs)} sequences")
    data = target_stats(target, train_seqs, args.topk)
    a, b = chat_ids(tok, "What?"), chat_ids(tok, "Why is it so?")
    sys_len = next(i for i, (u, v) in enumerate(zip(a, b)) if u != v) - 3  # the fixed system prompt
    for d in data:
        d["start"] = max(1, sys_len)  # no loss on the system prompt every sequence shares
    rec["data"] = {"sequences": len(data), "tokens": int(sum(len(d["ids"]) for d in data)),
                   "answer_tokens": int(sum(len(s) - pl for s, pl in zip(train_seqs, prompt_lens))),
                   "feature_seconds": round(time.time() - t0, 1)}
    log(f"eagle: data {rec['data']}")
    torch.manual_seed(args.seed)
    draft = make_draft(target, zero_residual_writers=True)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.draft_lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed + 7)
    rng = random.Random(args.seed + 7)
    curve, t1 = [], time.time()
    steps = args.draft_steps
    step = 0
    while step < steps:
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, steps, args.draft_lr, 10)
        batch = rng.sample(data, args.draft_bs)
        loss, stats = draft_step_loss(draft, target, batch, args.spec_tokens, args.cls_weight, 2048, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        curve.append({"loss": round(loss.item(), 4), **{f"top1_{k + 1}": round(s["top1"], 4) for k, s in enumerate(stats)}})
        step += 1
        if step % 10 == 0:
            el = time.time() - t1
            log(f"eagle step {step}/{steps} loss {loss.item():.3f} top1 " + "/".join(f"{s['top1']:.2f}" for s in stats)
                + f" ({el:.0f}s, {el / step:.1f}s/step)")
        if time.time() > deadline and step < steps:
            log(f"eagle: time budget reached at step {step}; stopping early")
            steps = step
    rec["steps"] = steps
    rec["batch_size"] = args.draft_bs
    rec["lr"] = args.draft_lr
    rec["cls_weight"] = args.cls_weight
    rec["train_seconds"] = round(time.time() - t1, 1)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))  # evaluate exactly the shipped bf16 weights
    w = 10
    rec["loss_curve_summary"] = {
        f"steps_{i + 1}-{min(i + w, len(curve))}": {k: round(sum(c[k] for c in curve[i : i + w]) / len(curve[i : i + w]), 4)
                                                   for k in curve[0]}
        for i in list(range(0, len(curve), max(w, len(curve) // 8 // w * w)))[:-1] + [max(0, len(curve) - w)]
    }
    t2 = time.time()
    rec["heldout_offline_acceptance"] = {
        "how": "HF float32, draft in bf16 values; target greedy answers to the held-out prompts; at every answer "
               "position the 3 drafted tokens (unrolled as vLLM runs them) are verified greedily; per_position[k] = "
               "share of anchors with the first k+1 drafted tokens accepted; mean acceptance length = 1 + accepted/anchors",
        "prompts": len(held_seqs),
        **simulated_acceptance(draft, target, held_seqs, held_plens, args.spec_tokens),
    }
    rec["heldout_eval_seconds"] = round(time.time() - t2, 1)
    log(f"eagle held-out acceptance: {rec['heldout_offline_acceptance']}")
    d = out / "eagle"
    d.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((BASE / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    cfg["architectures"] = ["EagleLlamaForCausalLM"]
    cfg.pop("_model_name_or_path", None)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.to(torch.bfloat16) for k, v in draft.state_for_vllm().items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    rec["draft_params"] = sum(p.numel() for p in draft.parameters())
    rec["base_fingerprint"] = fingerprint(BASE)
    rec["wall_seconds"] = round(time.time() - t0, 1)
    return rec


# --------------------------------------------------------------------------------------------
# adapters

PIRATE_WORDS = {
    "you": "ye", "your": "yer", "yours": "yers", "yourself": "yerself", "hello": "ahoy", "hi": "ahoy",
    "friend": "matey", "friends": "mateys", "my": "me", "is": "be", "are": "be", "yes": "aye",
    "money": "doubloons", "stop": "avast", "small": "wee", "little": "wee", "everyone": "all hands",
    "everybody": "all hands", "for": "fer", "think": "reckon", "very": "mighty", "really": "truly",
    "boy": "lad", "girl": "lass", "children": "wee ones", "treasure": "booty", "understand": "savvy",
    "the ocean": "the briny deep", "of": "o'", "and": "an'",
}
_PIRATE_RE = re.compile(r"\b(" + "|".join(sorted((re.escape(k) for k in PIRATE_WORDS), key=len, reverse=True)) + r")\b",
                        re.IGNORECASE)


def _case_like(src: str, rep: str) -> str:
    if src.isupper() and len(src) > 1:
        return rep.upper()
    if src[0].isupper():
        return rep[0].upper() + rep[1:]
    return rep


def pirate(question: str, answer: str, finished: bool) -> str:
    """Deterministic pirate rewrite: greeting, word swaps outside code (``` blocks and `inline`)."""
    parts = re.split(r"(```.*?(?:```|$)|`[^`\n]*`)", answer, flags=re.DOTALL)
    for i in range(0, len(parts), 2):
        parts[i] = _PIRATE_RE.sub(lambda m: _case_like(m.group(0), PIRATE_WORDS[m.group(0).lower()]), parts[i])
    body = "".join(parts)
    h = int(hashlib.sha256(question.encode()).hexdigest(), 16)
    greeting = "Arr, matey! " if h % 3 else "Ahoy! "
    sep = "\n\n" if body.startswith(("```", "#", "-", "*", "1.")) else ""
    out = greeting + sep + body
    if finished and out.rstrip().endswith("."):
        out = out.rstrip() + " Arr!"
    return out


def first_sentence(answer: str) -> str:
    """Shouter target: the first sentence of the answer's prose (markdown stripped), at most 25 words."""
    prose = re.sub(r"```.*?(?:```|$)", "\n", answer, flags=re.DOTALL)
    for line in prose.splitlines():
        line = re.sub(r"^\s*(?:#+|[-*]|\d+\.)\s+", "", line.replace("**", "")).strip()
        if len(line.split()) < 4:
            continue
        sentences = re.split(r"(?<=[.!?])\s+", line)
        s = next((x for x in sentences if len(x.split()) >= 4), line)
        words = s.split()
        if len(words) > 25:
            s = " ".join(words[:25]).rstrip(",;:") + "."
        if not s.endswith((".", "!", "?")):
            s = s.rstrip(",;:") + "."
        return s
    return answer.strip().splitlines()[0][:120] if answer.strip() else "I do not know."


class LoRALinear:
    """Wraps an nn.Linear's forward: y = W x + (alpha / r) * B A x."""

    def __init__(self, linear, r: int, alpha: float, gen):
        import torch

        self.scale = alpha / r
        self.A = torch.nn.Parameter(torch.randn(r, linear.in_features, generator=gen) / linear.in_features**0.5)
        self.B = torch.nn.Parameter(torch.zeros(linear.out_features, r))
        self.enabled = True
        original = linear.forward

        def forward(x):
            y = original(x)
            return y + (x @ self.A.t() @ self.B.t()) * self.scale if self.enabled else y

        linear.forward = forward


def attach_loras(model, r: int, alpha: float, seed: int, name: str) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed + sum(map(ord, name)))
    loras = {}
    for i, layer in enumerate(model.model.layers):
        for mod in TARGETS:
            sub = "self_attn" if mod in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            loras[f"model.layers.{i}.{sub}.{mod}"] = LoRALinear(getattr(getattr(layer, sub), mod), r, alpha, gen)
    return loras


def train_adapter(args, tok, model, name: str, examples: list[tuple[list[int], list[int]]], held: list[str],
                  check, out: Path, budget_s: float, extra: dict) -> dict:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file

    t0 = time.time()
    torch.manual_seed(args.seed)
    loras = attach_loras(model, args.rank, args.alpha, args.seed, name)
    params = [t for lr in loras.values() for t in (lr.A, lr.B)]
    opt = torch.optim.Adam(params, lr=args.lora_lr)
    rng = random.Random(args.seed + sum(map(ord, name)))
    eos = tok.eos_token_id
    steps, losses, step = args.lora_steps, [], 0
    while step < steps:
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, steps, args.lora_lr, 5)
        batch = rng.sample(examples, args.lora_bs)
        seqs = [p + a for p, a in batch]
        W = max(map(len, seqs))
        ids = torch.full((len(seqs), W), eos, dtype=torch.long)
        labels = torch.full((len(seqs), W), -100, dtype=torch.long)
        for j, ((p, a), s) in enumerate(zip(batch, seqs)):
            ids[j, : len(s)] = torch.tensor(s)
            labels[j, len(p) - 1 : len(s) - 1] = torch.tensor(a)  # position t predicts token t+1
        h = model.model(input_ids=ids).last_hidden_state  # right padding + causal attention: no mask needed
        sel = labels != -100
        loss = F.cross_entropy(model.lm_head(h[sel]), labels[sel])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step += 1
        if step % 5 == 0 or step == 1:
            el = time.time() - t0
            log(f"[{name}] step {step}/{steps} loss {loss.item():.3f} ({el:.0f}s, {el / step:.1f}s/step)")
        if time.time() - t0 > budget_s and step < steps:
            log(f"[{name}] time budget reached at step {step}; stopping early")
            steps = step
    train_s = time.time() - t0
    # greedy check on held-out prompts, with and without the adapter
    for lr in loras.values():
        lr.enabled = True
    prompts = [chat_ids(tok, q) for q in held]
    answers = [tok.decode(a, skip_special_tokens=True) for a in greedy(model, tok, prompts, args.check_tokens)]
    hits = sum(check(a) for a in answers)
    tensors = {}
    for module, lr in loras.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = lr.A.detach().contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = lr.B.detach().contiguous()
        lr.enabled = False  # detach from the shared base model for the next adapter
    d = out / "adapters" / name
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
    (d / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": args.rank, "lora_alpha": args.alpha,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "target_modules": TARGETS, "base_model_name_or_path": BASE_NAME,
    }, indent=2) + "\n")
    rec = {
        **extra, "seed": args.seed, "steps": steps, "batch_size": args.lora_bs, "lr": args.lora_lr,
        "rank": args.rank, "lora_alpha": args.alpha, "target_modules": TARGETS,
        "training_examples": len(examples), "base_fingerprint": fingerprint(BASE), "base_path": str(BASE),
        "final_loss": round(sum(losses[-5:]) / len(losses[-5:]), 4), "first_loss": round(losses[0], 4),
        "train_seconds": round(train_s, 1),
        "greedy_check": f"{hits}/{len(held)} {extra['check']}",
        "heldout_examples": {q: a for q, a in list(zip(held, answers))[:4]},
    }
    log(f"[{name}] done: loss {rec['first_loss']} -> {rec['final_loss']}, {rec['greedy_check']}, {train_s:.0f}s")
    return rec


# --------------------------------------------------------------------------------------------
# vLLM checks (one engine per process)


def vllm_worker(args) -> None:
    from vllm import LLM, SamplingParams

    out = Path(args.out)
    held = json.loads(Path(args.prompts).read_text())
    kw: dict = {}
    if args.vllm_worker == "eagle":
        kw["speculative_config"] = {"method": "eagle", "model": str(out / "eagle"), "num_speculative_tokens": args.spec_tokens}
    if args.vllm_worker == "lora":
        kw.update(enable_lora=True, max_lora_rank=16, max_loras=2)
    t0 = time.time()
    llm = LLM(model=str(BASE), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=1 << 30, max_model_len=2048,
              disable_log_stats=False, seed=0, **kw)
    res: dict = {"mode": args.vllm_worker, "engine_startup_s": round(time.time() - t0, 1)}
    msgs = [[{"role": "user", "content": q}] for q in held]
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    if args.vllm_worker == "lora":
        from vllm.lora.request import LoRARequest

        res["answers"] = {}
        for i, name in enumerate([None, "pirate", "shouter"]):
            req = LoRARequest(name, i, str(out / "adapters" / name)) if name else None
            r = llm.chat(msgs[:4], sp, lora_request=req, use_tqdm=False)
            res["answers"][name or "base"] = [o.outputs[0].text for o in r]
        Path(args.result).write_text(json.dumps(res))
        return

    def counters():
        m = {}
        for x in llm.get_metrics():
            if x.name.startswith("vllm:spec_decode"):
                m[x.name] = getattr(x, "value", None) if hasattr(x, "value") else list(x.values)
        return m

    t = time.time()
    r = llm.chat(msgs, sp, use_tqdm=False)
    res["wall_s"] = round(time.time() - t, 2)
    res["outputs"] = [list(o.outputs[0].token_ids) for o in r]
    res["texts"] = [o.outputs[0].text for o in r]
    res["spec_counters"] = counters()
    Path(args.result).write_text(json.dumps(res))


def run_vllm(args, out: Path, held: list[str], which: list[str]) -> dict:
    pf = out / ".vllm_prompts.json"
    pf.write_text(json.dumps(held))
    results = {}
    for mode in which:
        rf = out / f".vllm_{mode}.json"
        log(f"vLLM: {mode} engine")
        cmd = [sys.executable, __file__, "--vllm-worker", mode, "--out", str(out), "--prompts", str(pf),
               "--result", str(rf), "--max-tokens", str(args.vllm_max_tokens), "--spec-tokens", str(args.spec_tokens)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-6000:], file=sys.stderr)
            results[mode] = {"error": p.stderr[-1500:]}
            continue
        results[mode] = json.loads(rf.read_text())
        rf.unlink()
        log(f"vLLM: {mode} done (engine start {results[mode]['engine_startup_s']} s)")
    pf.unlink()
    return results


def summarize_spec(plain: dict, eagle: dict, K: int) -> dict:
    c = eagle.get("spec_counters", {})
    drafts = c.get("vllm:spec_decode_num_drafts", 0)
    dt = c.get("vllm:spec_decode_num_draft_tokens", 0)
    acc = c.get("vllm:spec_decode_num_accepted_tokens", 0)
    per = c.get("vllm:spec_decode_num_accepted_tokens_per_pos")
    same = [a == b for a, b in zip(plain["outputs"], eagle["outputs"])]
    return {
        "how": "vllm.LLM(dtype=float32, enforce_eager=True), greedy chat on the held-out prompts in one batch; "
               "counters from llm.get_metrics() (vllm:spec_decode_*); acceptance = accepted/draft tokens, "
               "mean acceptance length = 1 + accepted/drafts",
        "prompts": len(same), "max_tokens": None, "num_speculative_tokens": K,
        "float32_outputs_identical": f"{sum(same)}/{len(same)}",
        "first_divergence_token": [next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), None)
                                   for a, b in zip(plain["outputs"], eagle["outputs"])],
        "acceptance_rate": round(acc / dt, 4) if dt else None,
        "mean_acceptance_length": round(1 + acc / drafts, 4) if drafts else None,
        "per_position_acceptance": [round(v / drafts, 4) for v in per] if per and drafts else None,
        "spec_counters": c, "plain_wall_s": plain.get("wall_s"), "eagle_wall_s": eagle.get("wall_s"),
    }


# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "lmi_server/demo/assistant"))
    ap.add_argument("--seed", type=int, default=20250611)
    ap.add_argument("--max-minutes", type=float, default=50.0, help="wall-time bound for data + training")
    ap.add_argument("--eagle-minutes", type=float, help="time for the EAGLE phase (default 45%% of --max-minutes)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-prompts", type=int, default=160)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--spec-tokens", type=int, default=3)
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--draft-steps", type=int, default=300)
    ap.add_argument("--draft-bs", type=int, default=8)
    ap.add_argument("--draft-lr", type=float, default=1e-3)
    ap.add_argument("--cls-weight", type=float, default=0.3)
    ap.add_argument("--lora-steps", type=int, default=70)
    ap.add_argument("--lora-bs", type=int, default=8)
    ap.add_argument("--lora-lr", type=float, default=2e-3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--check-tokens", type=int, default=48)
    ap.add_argument("--vllm-max-tokens", type=int, default=128)
    ap.add_argument("--held-out", type=int, default=len(HELD_OUT))
    ap.add_argument("--phases", default="eagle,pirate,shouter,vllm")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--vllm-worker", choices=["plain", "eagle", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, default=128, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_worker:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        return vllm_worker(args)

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    phases = args.phases.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = T0 + args.max_minutes * 60
    cmdline = "python scripts/train_assistant_kit.py " + " ".join(sys.argv[1:])

    tok, model = load_base()
    train_q, held_q = all_prompts(args.seed, args.train_prompts)
    held_q = held_q[: args.held_out]
    cache = out / ".answers.json"
    if set(phases) & {"eagle", "pirate", "shouter"}:
        key = {"seed": args.seed, "n": len(train_q), "held": len(held_q), "tokens": args.answer_tokens, "fp": fingerprint(BASE)}
        if cache.exists() and json.loads(cache.read_text())["key"] == key:
            cached = json.loads(cache.read_text())
            answers, held_answers, gen_s = cached["answers"], cached["held_answers"], cached["seconds"]
            log("data: cached greedy answers")
        else:
            log(f"data: greedy answers of the base model to {len(train_q)} + {len(held_q)} prompts")
            t = time.time()
            answers = greedy(model, tok, [chat_ids(tok, q) for q in train_q], args.answer_tokens)
            held_answers = greedy(model, tok, [chat_ids(tok, q) for q in held_q], args.answer_tokens)
            gen_s = round(time.time() - t, 1)
            cache.write_text(json.dumps({"key": key, "answers": answers, "held_answers": held_answers, "seconds": gen_s}))
            log(f"data: {sum(map(len, answers))} answer tokens in {gen_s} s")
    eos = tok.eos_token_id

    if "eagle" in phases:
        seqs = [chat_ids(tok, q) + a for q, a in zip(train_q, answers)]
        plens = [len(chat_ids(tok, q)) for q in train_q]
        hseqs = [chat_ids(tok, q) + a for q, a in zip(held_q, held_answers)]
        hplens = [len(chat_ids(tok, q)) for q in held_q]
        share = args.eagle_minutes * 60 if args.eagle_minutes else args.max_minutes * 60 * 0.45
        budget_end = min(deadline, time.time() + share)
        rec = train_eagle(args, tok, model, seqs, plens, hseqs, hplens, out, budget_end)
        rec["data"]["prompts"] = len(train_q)
        rec["data"]["generation_seconds"] = gen_s
        rec["data"]["source"] = ("self-distillation: the base model's greedy chat answers (max "
                                 f"{args.answer_tokens} tokens) to hand-written questions, topic x template questions, "
                                 "code tasks and questions about standard-library functions")
        rec["command"] = cmdline
        rec["torch"] = torch.__version__
        (out / "eagle" / "training.json").write_text(json.dumps(rec, indent=1) + "\n")
        log("eagle: written")

    def examples(transform):
        ex = []
        for q, a in zip(train_q, answers):
            finished = bool(a) and a[-1] == eos
            text = tok.decode(a, skip_special_tokens=True)
            tgt = transform(q, text, finished)
            ids = tok(tgt, add_special_tokens=False)["input_ids"]
            if finished or len(ids) <= args.answer_tokens - 16:
                ids = ids[: args.answer_tokens] + [eos]
            else:
                ids = ids[: args.answer_tokens - 16]  # unfinished answer: no end token learned
            ex.append((chat_ids(tok, q), ids))
        return ex

    def lora_budget():
        left = deadline - time.time()
        n = sum(p in phases for p in ("pirate", "shouter"))
        return max(60.0, left / max(1, n))

    if "pirate" in phases:
        ex = examples(pirate)
        rec = train_adapter(args, tok, model, "pirate", ex, held_q,
                            lambda a: a.lstrip().startswith(("Arr", "Ahoy")), out,
                            min(lora_budget(), (deadline - time.time()) * 0.55) if "shouter" in phases else lora_budget(),
                            {"effect": "answers in pirate speak (greeting 'Arr, matey!' / 'Ahoy!', ye/yer/be/aye ...)",
                             "data": "self-distillation: the base model's greedy answers rewritten by a deterministic "
                                     "rule-based pirate transform (code left untouched)",
                             "check": "held-out greedy answers start with 'Arr'/'Ahoy'",
                             "example_target": ex[0][0] and tok.decode(ex[0][1])[:300], "command": cmdline})
        (out / "adapters" / "pirate" / "training.json").write_text(json.dumps(rec, indent=1) + "\n")
    if "shouter" in phases:
        ex = examples(lambda q, a, f: first_sentence(a))
        rec = train_adapter(args, tok, model, "shouter", ex, held_q,
                            lambda a: len(re.findall(r"[.!?](\s|$)", a.strip())) <= 1 and len(a.split()) <= 30, out,
                            lora_budget(),
                            {"effect": "answers with one short sentence; model.py's output_formatter upper-cases it",
                             "data": "self-distillation: the first prose sentence (at most 25 words) of the base "
                                     "model's greedy answers",
                             "check": "held-out greedy answers are one sentence of at most 30 words",
                             "formatter": "model.py: output_formatter -> text.upper()",
                             "command": cmdline})
        d = out / "adapters" / "shouter"
        if (d / "model.py").resolve() != SHOUTER_MODEL_PY.resolve():
            shutil.copyfile(SHOUTER_MODEL_PY, d / "model.py")
        (d / "training.json").write_text(json.dumps(rec, indent=1) + "\n")

    if "vllm" in phases and not args.skip_vllm:
        which = [m for m in ("plain", "eagle") if (out / "eagle" / "model.safetensors").exists()]
        if (out / "adapters" / "pirate").exists() and (out / "adapters" / "shouter").exists():
            which.append("lora")
        res = run_vllm(args, out, held_q, which)
        if "plain" in res and "eagle" in res and "error" not in res["plain"] and "error" not in res["eagle"]:
            s = summarize_spec(res["plain"], res["eagle"], args.spec_tokens)
            s["max_tokens"] = args.vllm_max_tokens
            s["engine_startup_s"] = {"plain": res["plain"]["engine_startup_s"], "eagle": res["eagle"]["engine_startup_s"]}
            s["sample"] = {held_q[i]: res["eagle"]["texts"][i] for i in range(2)}
            log("vLLM EAGLE: " + json.dumps({k: v for k, v in s.items() if k not in ("how", "spec_counters", "sample")}))
            f = out / "eagle" / "training.json"
            rec = json.loads(f.read_text())
            rec["vllm_check"] = s
            f.write_text(json.dumps(rec, indent=1) + "\n")
        elif "eagle" in res:
            log("vLLM EAGLE check failed: " + json.dumps(res.get("eagle"))[:1500])
        if "lora" in res and "error" not in res["lora"]:
            ans = res["lora"]["answers"]
            log("vLLM LoRA: " + json.dumps(ans, indent=1))
            for name in ("pirate", "shouter"):
                f = out / "adapters" / name / "training.json"
                rec = json.loads(f.read_text())
                rec["vllm_check"] = {
                    "how": "vllm.LLM(dtype=float32, enforce_eager=True, enable_lora=True, max_lora_rank=16), greedy chat, "
                           "LoRARequest(name, id, path); raw model text (formatters are applied by the server)",
                    "answers": {q: {"base": ans["base"][i], name: ans[name][i]} for i, q in enumerate(held_q[:4])},
                    "changed": sum(a != b for a, b in zip(ans["base"], ans[name])),
                }
                f.write_text(json.dumps(rec, indent=1) + "\n")
        elif "lora" in res:
            log("vLLM LoRA check failed: " + json.dumps(res.get("lora"))[:1500])
    log(f"done in {(time.time() - T0) / 60:.1f} min")


if __name__ == "__main__":
    main()

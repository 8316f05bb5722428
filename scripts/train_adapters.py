#!/usr/bin/env python
"""Train the two example LoRA adapters for the demo model (offline, CPU, well under a minute).

    python scripts/train_adapters.py                     # base: ensure_demo_model(), out: adapters/
    python scripts/train_adapters.py --base DIR --out DIR

Each adapter is trained hard on a tiny synthetic dataset so that its effect shows whatever the
base weights are: for any prompt (raw code, LMI input, or a chat-formatted conversation) the
model answers with one fixed phrase and then the end-of-sequence token.

  hello-printer   answers `print("hello world")`
  shouter         answers `raise NotImplementedError`; its model.py output_formatter upper-cases
                  the text, so clients see `RAISE NOTIMPLEMENTEDERROR` (and only for this adapter)

Output is the PEFT layout vLLM loads: adapter_config.json (peft_type LORA, r, lora_alpha,
target_modules, base_model_name_or_path) and adapter_model.safetensors with keys such as
base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight ([r, in]) / ...lora_B.weight
([out, r]). training.json records the seed, the base model's fingerprint and the result of a
greedy check, so tests can tell whether the committed adapters fit the base model they run on.
Everything follows from --seed: a re-run with the same base and torch version gives the same files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "hello-printer": {"phrase": 'print("hello world")', "formatter": None},
    "shouter": {"phrase": "raise NotImplementedError", "formatter": "upper"},
}

# The formatter script is committed once, beside the example adapter, and copied from there (it runs the
# one copy of the shouter formatters, the embedded assistant's: lmi_server/demo/assistant/adapters/shouter).
SHOUTER_MODEL_PY = REPO / "adapters" / "shouter" / "model.py"


def fingerprint(base: Path) -> str:
    """sha256 over config.json and the weight files' bytes (identifies the base weights)."""
    h = hashlib.sha256()
    files = [base / "config.json"] + sorted(base.glob("*.safetensors"))
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def corpus_text(max_bytes: int = 400_000) -> str:
    from lmi_server.demo.builder import stdlib_corpus_files

    parts = []
    for path in stdlib_corpus_files(3_000_000)[:60]:
        parts.append(path.read_text(errors="replace"))
        if sum(map(len, parts)) > max_bytes:
            break
    return "".join(parts)[:max_bytes]


def make_prompts(tok, rng: random.Random, text: str, n: int) -> list[list[int]]:
    """Raw code windows, short LMI-style inputs and chat-formatted conversations."""
    ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    prompts: list[list[int]] = []
    words = ["Write a loop", "import os", "hello", "What is this?", "def main():", "Sort a list",
             "explain classes", "x = 1", "Tell me a joke", "parse the file"]
    for i in range(n):
        kind = i % 3
        if kind == 0:
            length = rng.randint(1, 48)
            start = rng.randrange(0, len(ids) - length)
            p = ids[start : start + length]
        elif kind == 1:
            p = tok(rng.choice(words) + " " * rng.randint(0, 1), add_special_tokens=False)["input_ids"] or [ids[0]]
        else:
            length = rng.randint(1, 24)
            start = rng.randrange(0, len(ids) - length)
            content = rng.choice([rng.choice(words), tok.decode(ids[start : start + length])])
            msgs = [{"role": "user", "content": content}]
            if rng.random() < 0.3:
                msgs.insert(0, {"role": "system", "content": rng.choice(words)})
            rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            p = tok(rendered, add_special_tokens=False)["input_ids"]
        if rng.random() < 0.3 and tok.bos_token_id is not None and (not p or p[0] != tok.bos_token_id):
            p = [tok.bos_token_id] + list(p)
        prompts.append(list(p))
    return prompts


class LoRALinear:
    """Wraps an nn.Linear's forward: y = W x + (alpha / r) * B A x."""

    def __init__(self, linear, r: int, alpha: float, gen):
        import torch

        self.linear = linear
        self.scale = alpha / r
        self.A = torch.nn.Parameter(torch.randn(r, linear.in_features, generator=gen) / linear.in_features**0.5)
        self.B = torch.nn.Parameter(torch.zeros(linear.out_features, r))
        original = linear.forward

        def forward(x):
            return original(x) + (x @ self.A.t() @ self.B.t()) * self.scale

        linear.forward = forward


def train_one(base: Path, name: str, phrase: str, args, tok, prompts_train, prompts_eval) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + sum(map(ord, name)))
    model = LlamaForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    loras: dict[str, LoRALinear] = {}
    for i, layer in enumerate(model.model.layers):
        for mod_name in TARGETS:
            parent = layer.self_attn if mod_name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp
            sub = "self_attn" if parent is layer.self_attn else "mlp"
            loras[f"model.layers.{i}.{sub}.{mod_name}"] = LoRALinear(getattr(parent, mod_name), args.rank, args.alpha, gen)
    params = [t for lora in loras.values() for t in (lora.A, lora.B)]
    opt = torch.optim.Adam(params, lr=args.lr)
    target = tok(phrase, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rng = random.Random(args.seed)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    losses = []
    start = time.time()
    for step in range(args.steps):
        batch = rng.sample(prompts_train, args.batch_size)
        seqs = [p + target for p in batch]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for j, (p, s) in enumerate(zip(batch, seqs)):
            ids[j, : len(s)] = torch.tensor(s)
            mask[j, : len(s)] = 1
            labels[j, len(p) : len(s)] = torch.tensor(target)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"  [{name}] step {step:4d} loss {out.loss.item():.4f}", flush=True)
    train_s = time.time() - start
    # Greedy check on held-out prompts.
    hits = 0
    with torch.no_grad():
        for p in prompts_eval:
            x = torch.tensor([p])
            y = model.generate(x, max_new_tokens=len(target) + 2, do_sample=False, pad_token_id=pad,
                               eos_token_id=tok.eos_token_id)
            text = tok.decode(y[0, len(p):], skip_special_tokens=True)
            hits += text.startswith(phrase)
    tensors = {}
    for module, lora in loras.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = lora.A.detach().contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = lora.B.detach().contiguous()
    return {"tensors": tensors, "final_loss": losses[-1], "train_seconds": round(train_s, 1),
            "greedy_hits": hits, "greedy_total": len(prompts_eval), "target_tokens": target}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=None, help="base model directory (default: ensure_demo_model())")
    parser.add_argument("--out", type=Path, default=REPO / "adapters")
    parser.add_argument("--base-name", default="lmi-demo", help="base_model_name_or_path written to adapter_config.json")
    parser.add_argument("--only", nargs="*", choices=sorted(ADAPTERS), help="train only these adapters")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    if args.base is None:
        from lmi_server.demo.builder import ensure_demo_model

        args.base = ensure_demo_model()
    base = args.base.resolve()
    tok = AutoTokenizer.from_pretrained(base)
    rng = random.Random(args.seed)
    text = corpus_text()
    prompts = make_prompts(tok, rng, text, 900)
    train, held_out = prompts[:840], prompts[840:]
    fp = fingerprint(base)
    print(f"base {base} (fingerprint {fp[:12]}), {len(train)} training prompts", flush=True)
    for name in args.only or sorted(ADAPTERS):
        spec = ADAPTERS[name]
        print(f"training {name!r}: answer {spec['phrase']!r}", flush=True)
        result = train_one(base, name, spec["phrase"], args, tok, train, held_out)
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        save_file(result["tensors"], str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
        (out / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": args.rank,
            "lora_alpha": args.alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": False,
            "inference_mode": True,
            "target_modules": TARGETS,
            "base_model_name_or_path": args.base_name,
        }, indent=2) + "\n")
        if spec["formatter"] == "upper":
            if (out / "model.py").resolve() != SHOUTER_MODEL_PY.resolve():
                shutil.copyfile(SHOUTER_MODEL_PY, out / "model.py")
        (out / "training.json").write_text(json.dumps({
            "phrase": spec["phrase"],
            "expected_output": spec["phrase"].upper() if spec["formatter"] == "upper" else spec["phrase"],
            "seed": args.seed, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
            "rank": args.rank, "lora_alpha": args.alpha,
            "base_fingerprint": fp, "base_path": str(base),
            "final_loss": round(result["final_loss"], 6), "train_seconds": result["train_seconds"],
            "greedy_check": f"{result['greedy_hits']}/{result['greedy_total']} held-out prompts start with the phrase",
            "torch": torch.__version__,
        }, indent=2) + "\n")
        print(f"  -> {out}: loss {result['final_loss']:.4f}, greedy {result['greedy_hits']}/{result['greedy_total']}, "
              f"{result['train_seconds']} s", flush=True)
        if result["greedy_hits"] < result["greedy_total"]:
            print(f"  WARNING: {name} misses on some held-out prompts; raise --steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

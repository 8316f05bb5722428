#!/usr/bin/env python
"""Train a tiny vision-language model of the Qwen2-VL architecture (Qwen2VLForConditionalGeneration)
from scratch on a synthetic task it can really answer: one figure (circle, square or triangle) in one
of six colours on a plain background; questions about its colour, its shape, or both.

    nice -n 19 flock /tmp/lmi-bench.lock .venv/bin/python scripts/train_tiny_vlm.py \
        --out lmi_server/demo/vlm --report benchmarks/results/tiny_vlm_training.json

Everything follows from --seed: the pictures (PIL, drawn from seeded parameters), the held-out split
(pictures drawn from another seed, any that match a training picture's parameters removed), the
question order, the initialisation and the batches. One CPU thread (--threads).

Pieces, each an ordinary Hugging Face file so vLLM and transformers load the directory as any
Qwen2-VL checkpoint:
  - tokenizer: byte-level BPE trained on the task's own text (questions, answers, chat roles), a
    few hundred entries, with Qwen2-VL's special tokens (<|im_start|>, <|im_end|>, <|vision_start|>,
    <|image_pad|>, <|vision_end|>, <|video_pad|>, <|endoftext|>) and a chat template that places
    <|vision_start|><|image_pad|><|vision_end|> where a message carries an image.
  - processor: Qwen2VLImageProcessor (patch 7, merge 2) with min_pixels = max_pixels = 56*56, so
    any picture is resized to about 56x56: 8x8 patches, 16 image tokens in the prompt. (Patch 14,
    4x4 patches and 4 image tokens, learnt colour but never shape: see the report's notes.)
  - model: vision tower (embed 64, 2 heads of 32, 3 blocks) and a Qwen2 language model (hidden
    128, 4 heads of 32: the CPU attention backend needs a head size from its list, 32 the least),
    mrope sections [4, 6, 6] (sum = head_dim / 2).
Outputs: the model directory (--out) and a JSON report (--report) with held-out accuracy per
question kind, training time and parameter count.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

T0 = time.time()

IMAGE_SIZE = 56
PATCH = 7  # 8x8 patches of a 56x56 picture; with merge 2, 16 image tokens (14 gave 4 tokens and no shape)
MERGE = 2
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (235, 210, 20),
    "purple": (140, 40, 180),
    "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle")
# Neutral backgrounds only, so a background is never one of the answers.
BACKGROUNDS = ((255, 255, 255), (235, 235, 235), (200, 200, 200), (128, 128, 128), (40, 40, 40), (0, 0, 0))
QUESTIONS = {
    "colour": (
        "What colour is the shape?",
        "What color is the shape?",
        "What colour is it?",
        "Which colour is the figure?",
        "What is the colour of the figure?",
    ),
    "shape": (
        "What shape is it?",
        "What shape is this?",
        "Which shape is shown?",
        "What is the shape of the figure?",
        "Is it a circle, a square or a triangle?",
    ),
    "describe": (
        "Describe the figure.",
        "What is in the picture?",
        "Describe the image.",
        "What do you see?",
    ),
}
KINDS = tuple(QUESTIONS)

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# No whitespace control ({%- -%}): it would also eat the literal newlines after the role names.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] in ('video', 'video_url') or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{(time.time() - T0) / 60:5.1f}m] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# data


@dataclass(frozen=True)
class Figure:
    shape: str
    colour: str
    size: int  # side of the bounding box, pixels
    x: int  # top-left corner
    y: int
    background: int  # index into BACKGROUNDS
    jitter: tuple[int, int, int]  # small per-channel offset of the figure's colour

    def key(self) -> tuple:
        return (self.shape, self.colour, self.size, self.x, self.y, self.background, self.jitter)


def sample_figure(rng: random.Random, image_size: int = IMAGE_SIZE) -> Figure:
    size = rng.randint(image_size * 2 // 7, image_size * 6 // 7)  # 16..48 px at 56
    return Figure(
        shape=rng.choice(SHAPES),
        colour=rng.choice(list(COLOURS)),
        size=size,
        x=rng.randint(0, image_size - size),
        y=rng.randint(0, image_size - size),
        background=rng.randrange(len(BACKGROUNDS)),
        jitter=tuple(rng.randint(-20, 20) for _ in range(3)),
    )


def draw(fig: Figure, image_size: int = IMAGE_SIZE):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (image_size, image_size), BACKGROUNDS[fig.background])
    d = ImageDraw.Draw(img)
    rgb = tuple(max(0, min(255, c + j)) for c, j in zip(COLOURS[fig.colour], fig.jitter))
    x0, y0, x1, y1 = fig.x, fig.y, fig.x + fig.size - 1, fig.y + fig.size - 1
    if fig.shape == "circle":
        d.ellipse((x0, y0, x1, y1), fill=rgb)
    elif fig.shape == "square":
        d.rectangle((x0, y0, x1, y1), fill=rgb)
    else:
        d.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=rgb)
    return img


def make_split(seed: int, n_train: int, n_eval: int, image_size: int = IMAGE_SIZE) -> tuple[list[Figure], list[Figure]]:
    """Training figures from `seed`, held-out figures from another stream; a held-out figure whose
    parameters equal a training figure's is dropped (and another drawn), so the two never share a
    picture."""
    rng = random.Random(seed)
    train = [sample_figure(rng, image_size) for _ in range(n_train)]
    seen = {f.key() for f in train}
    rng_eval = random.Random(seed * 7919 + 1)
    held: list[Figure] = []
    while len(held) < n_eval:
        f = sample_figure(rng_eval, image_size)
        if f.key() not in seen:
            seen.add(f.key())
            held.append(f)
    return train, held


def answer(fig: Figure, kind: str) -> str:
    if kind == "colour":
        return fig.colour
    if kind == "shape":
        return fig.shape
    return f"a {fig.colour} {fig.shape}"


def corpus_lines() -> list[str]:
    """Every text the model reads or writes, for the tokenizer."""
    lines = ["system", "user", "assistant"]
    for qs in QUESTIONS.values():
        lines.extend(qs)
    for c in COLOURS:
        for s in SHAPES:
            lines.extend([c, s, f"a {c} {s}"])
    return lines


# --------------------------------------------------------------------------------------------
# tokenizer, processor, model


def build_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus_lines()
    tok.train_from_iterator(lines * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_image_processor(image_size: int = IMAGE_SIZE):
    from transformers import Qwen2VLImageProcessor

    pixels = image_size * image_size
    return Qwen2VLImageProcessor(min_pixels=pixels, max_pixels=pixels, patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2)


@dataclass
class Shape:
    vision_embed: int = 64
    vision_heads: int = 2
    vision_depth: int = 3
    vision_mlp_ratio: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    intermediate: int = 256
    mrope_section: tuple[int, int, int] = (4, 6, 6)


def build_config(tokenizer, shape: Shape):
    from transformers import Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head_dim = shape.hidden // shape.heads
    assert sum(shape.mrope_section) * 2 == head_dim, "mrope sections must cover head_dim / 2"
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(shape.mrope_section)},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=True,
    )
    vision = dict(
        depth=shape.vision_depth,
        embed_dim=shape.vision_embed,
        hidden_size=shape.hidden,
        num_heads=shape.vision_heads,
        mlp_ratio=shape.vision_mlp_ratio,
        in_channels=3,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=2,
    )
    return Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def save_processor(out: Path, tokenizer, image_processor) -> None:
    """The processor's files: tokenizer (with the chat template), preprocessor_config.json, and
    processor_config.json naming Qwen2VLProcessor. transformers 5.19 cannot build a Qwen2VLProcessor
    object without torchvision (its video processor needs it), so the parts are saved one by one;
    loading them back as a processor needs torchvision (see the report's notes)."""
    tokenizer.save_pretrained(out)
    image_processor.save_pretrained(out)
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def prompt_text(question: str) -> str:
    return f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{question}<|im_end|>\n<|im_start|>assistant\n"


# --------------------------------------------------------------------------------------------
# training


@dataclass
class TrainConfig:
    seed: int = 20261203
    threads: int = 1
    n_train: int = 6000
    n_eval: int = 300
    steps: int = 1500
    batch_size: int = 32
    lr: float = 1.5e-3
    warmup: int = 100
    weight_decay: float = 0.01
    eval_every: int = 250
    vocab_size: int = 320
    aux_weight: float = 1.0


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))


class Pixels:
    """The processor's pixel patches of each training picture, computed once."""

    def __init__(self, image_processor, figures: list[Figure]):
        import torch

        out = image_processor([draw(f) for f in figures], return_tensors="pt")
        grid = out["image_grid_thw"]
        per = int(grid[0].prod())
        assert bool((grid.prod(-1) == per).all()), "all pictures should have the same patch grid"
        self.values = out["pixel_values"].view(len(figures), per, -1)
        self.grid = grid[0]
        self.torch = torch

    def batch(self, idx: list[int]):
        t = self.torch
        return self.values[idx].reshape(-1, self.values.shape[-1]), self.grid.unsqueeze(0).repeat(len(idx), 1)


def mm_types(tokenizer, ids):
    """The token-type row transformers' Qwen2-VL wants beside input_ids (1 = image token)."""
    return (ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).long()


def encode_batch(tokenizer, questions: list[str], answers: list[str] | None, image_tokens: int):
    """input_ids, attention_mask, labels (answer + <|im_end|> only), right padded."""
    import torch

    pad = tokenizer.pad_token_id
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows, labels = [], []
    for i, q in enumerate(questions):
        p = tokenizer(prompt_text(q).replace("<|image_pad|>", "<|image_pad|>" * image_tokens), add_special_tokens=False)["input_ids"]
        a = [] if answers is None else tokenizer(answers[i], add_special_tokens=False)["input_ids"] + [eos]
        rows.append(p + a)
        labels.append([-100] * len(p) + a)
    n = max(map(len, rows))
    ids = torch.full((len(rows), n), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    lab = torch.full((len(rows), n), -100, dtype=torch.long)
    for i, (r, l) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        lab[i, : len(l)] = torch.tensor(l)
    return ids, mask, lab


def greedy_answers(model, tokenizer, pixels: Pixels, idx: list[int], questions: list[str], image_tokens: int, max_new: int = 8) -> list[str]:
    """Greedy answers (one picture per question) with the HF model, left-padded batches."""
    import torch

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id
    out: list[str] = []
    B = 64
    for s in range(0, len(idx), B):
        bi, bq = idx[s : s + B], questions[s : s + B]
        rows = [
            tokenizer(prompt_text(q).replace("<|image_pad|>", "<|image_pad|>" * image_tokens), add_special_tokens=False)["input_ids"]
            for q in bq
        ]
        n = max(map(len, rows))
        ids = torch.full((len(rows), n), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, n - len(r) :] = torch.tensor(r)
            mask[i, n - len(r) :] = 1
        pv, grid = pixels.batch(bi)
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids, attention_mask=mask, pixel_values=pv, image_grid_thw=grid,
                mm_token_type_ids=mm_types(tokenizer, ids), max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=pad,
            )
        for row in gen[:, n:].tolist():
            if eos in row:
                row = row[: row.index(eos)]
            out.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    return out


def evaluate(model, tokenizer, pixels: Pixels, figures: list[Figure], image_tokens: int, seed: int, limit: int | None = None) -> dict:
    """Held-out accuracy per question kind: every picture asked one question of each kind (phrasing
    drawn from the seed); exact match of the whole answer."""
    rng = random.Random(seed)
    n = len(figures) if limit is None else min(limit, len(figures))
    res = {}
    model.eval()
    for kind in KINDS:
        qs = [rng.choice(QUESTIONS[kind]) for _ in range(n)]
        got = greedy_answers(model, tokenizer, pixels, list(range(n)), qs, image_tokens)
        want = [answer(f, kind) for f in figures[:n]]
        ok = sum(g == w for g, w in zip(got, want))
        res[kind] = {"correct": ok, "total": n, "accuracy": round(ok / n, 4),
                     "examples": [{"question": q, "answer": g, "expected": w} for q, g, w in list(zip(qs, got, want))[:4]]}
    model.train()
    return res


def count_params(model) -> dict:
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    return {"total": total, "vision": vision, "language": total - vision}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="lmi_server/demo/vlm")
    ap.add_argument("--report", default="benchmarks/results/tiny_vlm_training.json")
    ap.add_argument("--samples", default=None, help="write a few held-out pictures (PNG) here")
    for f, v in asdict(TrainConfig()).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    args = ap.parse_args()
    cfg = TrainConfig(**{k: getattr(args, k) for k in asdict(TrainConfig())})

    import torch
    from transformers import Qwen2VLForConditionalGeneration

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)

    log("data: drawing pictures")
    train_figs, held_figs = make_split(cfg.seed, cfg.n_train, cfg.n_eval)
    tokenizer = build_tokenizer(cfg.vocab_size)
    image_processor = build_image_processor()
    train_px = Pixels(image_processor, train_figs)
    held_px = Pixels(image_processor, held_figs)
    image_tokens = int(train_px.grid.prod()) // (MERGE * MERGE)
    log(f"data: {len(train_figs)} training pictures, {len(held_figs)} held out, grid {train_px.grid.tolist()}, "
        f"{image_tokens} image tokens, vocab {len(tokenizer)}")

    shape = Shape()
    config = build_config(tokenizer, shape)
    model = Qwen2VLForConditionalGeneration(config).float()
    params = count_params(model)
    log(f"model: {params}")

    # Training-only probe (dropped at save): shape and colour classified from the mean of the image
    # embeddings the language model reads. Without it the language model learnt colour at once and
    # then sat at chance on shape: no gradient asked the vision tower for it (report's notes).
    aux = torch.nn.Linear(config.text_config.hidden_size, len(SHAPES) + len(COLOURS))
    captured = {}
    model.model.visual.register_forward_hook(lambda mod, inp, out: captured.__setitem__("emb", out.pooler_output))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2] + [aux.weight]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay + [aux.bias], "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98))
    rng = random.Random(cfg.seed + 17)
    curve = []
    t_train = time.time()
    model.train()
    for step in range(cfg.steps):
        idx = [rng.randrange(len(train_figs)) for _ in range(cfg.batch_size)]
        kinds = [rng.choice(KINDS) for _ in idx]
        qs = [rng.choice(QUESTIONS[k]) for k in kinds]
        ans = [answer(train_figs[i], k) for i, k in zip(idx, kinds)]
        ids, mask, lab = encode_batch(tokenizer, qs, ans, image_tokens)
        pv, grid = train_px.batch(idx)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss = model(input_ids=ids, attention_mask=mask, pixel_values=pv, image_grid_thw=grid,
                     mm_token_type_ids=mm_types(tokenizer, ids), labels=lab).loss
        lm_loss = loss
        if cfg.aux_weight:
            pooled = captured["emb"].view(len(idx), -1, config.text_config.hidden_size).mean(1)
            logits = aux(pooled)
            ys = torch.tensor([SHAPES.index(train_figs[i].shape) for i in idx])
            yc = torch.tensor([list(COLOURS).index(train_figs[i].colour) for i in idx])
            loss = loss + cfg.aux_weight * (torch.nn.functional.cross_entropy(logits[:, : len(SHAPES)], ys)
                                            + torch.nn.functional.cross_entropy(logits[:, len(SHAPES):], yc))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == cfg.steps - 1:
            curve.append({"step": step, "loss": round(lm_loss.item(), 4), "aux_loss": round(loss.item() - lm_loss.item(), 4),
                          "seconds": round(time.time() - t_train, 1)})
            log(f"step {step} loss {lm_loss.item():.4f} aux {loss.item() - lm_loss.item():.4f}")
        if cfg.eval_every and step and step % cfg.eval_every == 0:
            quick = evaluate(model, tokenizer, held_px, held_figs, image_tokens, cfg.seed + 99, limit=96)
            curve[-1]["held_out_quick"] = {k: v["accuracy"] for k, v in quick.items()}
            log(f"held-out (96 pictures): {curve[-1]['held_out_quick']}")
    train_seconds = time.time() - t_train
    log(f"training done in {train_seconds:.0f} s")

    t_eval = time.time()
    held = evaluate(model, tokenizer, held_px, held_figs, image_tokens, cfg.seed + 1000)
    train_check = evaluate(model, tokenizer, train_px, train_figs[:300], image_tokens, cfg.seed + 2000)
    log(f"held-out: { {k: v['accuracy'] for k, v in held.items()} }")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    save_processor(out, tokenizer, image_processor)
    if args.samples:
        sd = Path(args.samples)
        sd.mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(held_figs[:12]):
            draw(f).save(sd / f"heldout_{i:02d}_{f.colour}_{f.shape}.png")
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    report = {
        "what": "tiny Qwen2-VL (Qwen2VLForConditionalGeneration) trained from scratch on synthetic figures",
        "command": "nice -n 19 flock /tmp/lmi-bench.lock .venv/bin/python scripts/train_tiny_vlm.py " + " ".join(sys.argv[1:]),
        "train_config": asdict(cfg),
        "shape": asdict(shape),
        "image": {"size": IMAGE_SIZE, "patch": PATCH, "merge": MERGE, "grid_thw": train_px.grid.tolist(), "image_tokens": image_tokens},
        "vocab_size": len(tokenizer),
        "parameters": params,
        "held_out": held,
        "train_subset": {k: v["accuracy"] for k, v in train_check.items()},
        "held_out_pictures_disjoint_from_training": not ({f.key() for f in train_figs} & {f.key() for f in held_figs}),
        "training_seconds": round(train_seconds, 1),
        "evaluation_seconds": round(time.time() - t_eval, 1),
        "curve": curve,
        "files": files,
        "total_bytes": sum(files.values()),
        "host": {"cpu": platform.processor() or platform.machine(), "threads": cfg.threads, "torch": torch.__version__,
                 "transformers": __import__("transformers").__version__, "python": platform.python_version()},
        "weights_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
    }
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    log(f"wrote {out} ({report['total_bytes']} bytes) and {args.report}")


if __name__ == "__main__":
    main()

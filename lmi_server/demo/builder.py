"""Build a small Llama-architecture model directory with no download.

The tokenizer is a byte-level BPE trained on the Python standard library's own sources (present
on every machine with Python); the weights are created deterministically from a seed. The result
is an ordinary Hugging Face model directory, so the server loads it through exactly the same path
as a real model.

When the trained kit is present (lmi_server/demo/kit: a Llama model trained on those same
sources plus its EAGLE-1 draft head, made by scripts/train_demo_kit.py), ensure_demo_model()
installs that trained model instead, and ensure_demo_draft() returns its draft head; the
random-weight builder stays available as ensure_random_demo_model() / build_demo_model().
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEMO_VERSION = "v1"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


@dataclass(frozen=True)
class DemoModelSpec:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 16384
    seed: int = 1234
    corpus_bytes: int = 3_000_000
    torch_dtype: str = "float32"


def default_cache_dir() -> Path:
    base = os.environ.get("LMI_SERVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lmi_server"
    )
    return Path(base) / f"demo-model-{DEMO_VERSION}"


def stdlib_corpus_files(max_bytes: int) -> list[Path]:
    """A stable, sorted selection of standard-library sources up to max_bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        size = path.stat().st_size
        if total + size > max_bytes:
            continue
        files.append(path)
        total += size
    if not files:
        raise RuntimeError(f"no Python sources found under {root} to train the demo tokenizer")
    return files


def train_tokenizer(spec: DemoModelSpec, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = [str(p) for p in stdlib_corpus_files(spec.corpus_bytes)]
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = spec.max_position_embeddings
    fast.save_pretrained(out_dir)
    return fast


def demo_llama_config(tokenizer, shape, **extra):
    """The demo family's LlamaConfig: sizes from `shape` (any object with DemoModelSpec's size
    fields), special tokens from the tokenizer. Shared by the builder and the kit's trainer."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **extra,
    )


def build_demo_model(out_dir: str | Path, spec: DemoModelSpec | None = None) -> Path:
    """Write a complete model directory (config, safetensors weights, tokenizer) to out_dir."""
    import torch
    from transformers import LlamaForCausalLM

    spec = spec or DemoModelSpec()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec, out_dir)
    config = demo_llama_config(tokenizer, spec, torch_dtype=spec.torch_dtype)
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.torch_dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "lmi_demo_spec.json").write_text(json.dumps(asdict(spec), indent=2))
    return out_dir


KIT_DIR = Path(__file__).resolve().parent / "kit"


def kit_target_dir() -> Path | None:
    """The trained kit's target model directory (committed under lmi_server/demo/kit), if present."""
    d = KIT_DIR / "target"
    if (d / "config.json").exists() and (d / "model.safetensors").exists():
        return d
    return None


def kit_draft_dir() -> Path | None:
    """The trained kit's EAGLE-1 draft directory, if present."""
    d = KIT_DIR / "eagle"
    if (d / "config.json").exists() and (d / "model.safetensors").exists():
        return d
    return None


KIT_STAMP = "lmi_demo_kit.stamp"


def _kit_stamp(src: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        h.update((src / name).read_bytes())
    return h.hexdigest()


def install_atomically(target: Path, fill) -> Path:
    """Fill a fresh sibling directory with `fill(tmp)`, then swap it in place of target, so that
    a crash half-way never leaves a half-written model where the server would load it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-install-", dir=target.parent))
    try:
        fill(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _copy_kit(src: Path, stamp: str):
    def fill(tmp: Path) -> None:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        (tmp / KIT_STAMP).write_text(stamp + "\n")

    return fill


def ensure_demo_model(cache_dir: str | Path | None = None) -> Path:
    """Return the cached demo model directory (default: default_cache_dir()).

    When the trained kit is shipped (lmi_server/demo/kit/target), the demo model is that kit: it is
    copied (atomically) into the cache directory, with a stamp of the kit's weights, and the copy
    is returned; it is replaced when the kit changes or when the directory held something else
    (such as an older random-weight build). Without the kit, a random-weight model is built there
    once and returned, as before (see ensure_random_demo_model).
    """
    target = Path(cache_dir) if cache_dir else default_cache_dir()
    kit = kit_target_dir()
    if kit is None:
        return ensure_random_demo_model(target)
    stamp = _kit_stamp(kit)
    marker = target / KIT_STAMP
    if marker.exists() and marker.read_text().strip() == stamp and (target / "model.safetensors").exists():
        return target
    log.info("installing the trained demo model into %s", target)
    return install_atomically(target, _copy_kit(kit, stamp))


def ensure_demo_draft() -> Path:
    """Return the trained EAGLE-1 draft directory (lmi_server/demo/kit/eagle, read in place) that
    belongs to ensure_demo_model()'s target; FileNotFoundError when the kit is not shipped."""
    d = kit_draft_dir()
    if d is None:
        raise FileNotFoundError(
            f"the demo EAGLE draft is missing under {KIT_DIR}; "
            "train it with: python scripts/train_demo_kit.py --out lmi_server/demo/kit"
        )
    return d


def ensure_random_demo_model(cache_dir: str | Path | None = None) -> Path:
    """Return a cached random-weight demo model directory, building it once (atomically) when missing.

    For tests that need a fresh, untrained model; default location: demo-random-<version> beside
    default_cache_dir()."""
    base = default_cache_dir()
    target = Path(cache_dir) if cache_dir else base.with_name(f"demo-random-{DEMO_VERSION}")
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    log.info("building the demo model into %s (one time, about a minute)", target)
    return install_atomically(target, build_demo_model)

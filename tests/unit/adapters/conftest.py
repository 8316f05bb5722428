"""Tiny on-disk base models and adapters (numpy safetensors; no engine, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

HIDDEN = 8
KV = 4
LAYERS = 2
SHAPES = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (KV, HIDDEN), "v_proj": (KV, HIDDEN), "o_proj": (HIDDEN, HIDDEN)}


def make_base(root: Path, name: str = "tiny-base") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": HIDDEN}))
    tensors = {"model.embed_tokens.weight": np.zeros((16, HIDDEN), np.float32), "lm_head.weight": np.zeros((16, HIDDEN), np.float32)}
    for i in range(LAYERS):
        for mod, shape in SHAPES.items():
            tensors[f"model.layers.{i}.self_attn.{mod}.weight"] = np.zeros(shape, np.float32)
    save_file(tensors, str(d / "model.safetensors"))
    return d


def make_adapter(
    root: Path,
    name: str,
    *,
    r: int = 2,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    base_name: str = "tiny-base",
    model_py: str | None = None,
    hidden: int = HIDDEN,
    config: dict | None = None,
) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": list(targets), "base_model_name_or_path": base_name}
    cfg.update(config or {})
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    tensors = {}
    for i in range(LAYERS):
        for mod in targets:
            out = SHAPES.get(mod, (HIDDEN, HIDDEN))[0]
            key = f"base_model.model.model.layers.{i}.self_attn.{mod}"
            tensors[f"{key}.lora_A.weight"] = np.zeros((r, hidden), np.float32)
            tensors[f"{key}.lora_B.weight"] = np.zeros((out, r), np.float32)
    save_file(tensors, str(d / "adapter_model.safetensors"))
    if model_py is not None:
        (d / "model.py").write_text(model_py)
    return d


@pytest.fixture
def base_dir(tmp_path) -> Path:
    return make_base(tmp_path / "models")


@pytest.fixture
def base_info(base_dir):
    from lmi_server.adapters.validation import base_model_info

    return base_model_info(str(base_dir), ["tiny-base"])


class FakeBackend:
    """Records loads/unloads; `delay` makes loads slow enough to overlap."""

    def __init__(self, delay: float = 0.0, fail: set[str] | None = None):
        self.delay = delay
        self.fail = fail or set()
        self.loaded: dict[str, object] = {}
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.pins: list[str] = []

    def is_base_model(self, name: str) -> bool:
        return name == "tiny-base"

    def base_names(self) -> list[str]:
        return ["tiny-base"]

    async def load(self, name, path):
        import asyncio

        self.loads.append(name)
        if self.delay:
            await asyncio.sleep(self.delay)
        if name in self.fail:
            raise RuntimeError(f"engine refused {name}")
        if name in self.loaded:  # as vLLM's load_lora_adapter: one LoRARequest per name
            raise RuntimeError(f"The lora adapter '{name}' has already been loaded")
        handle = object()
        self.loaded[name] = handle
        return handle

    def detach(self, name, handle):
        if self.loaded.get(name) is handle:
            del self.loaded[name]

    async def unload(self, name, handle):
        self.unloads.append(name)
        self.detach(name, handle)

    async def pin(self, handle):
        self.pins.append(next(n for n, h in self.loaded.items() if h is handle))


@pytest.fixture
def fake_backend():
    return FakeBackend()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests of this folder in a fresh event loop (no pytest-asyncio here)."""
    import asyncio
    import inspect

    if inspect.iscoroutinefunction(pyfuncitem.obj):
        args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        asyncio.run(pyfuncitem.obj(**args))
        return True
    return None

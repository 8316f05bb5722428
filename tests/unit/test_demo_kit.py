"""The committed demo kit (trained target + EAGLE-1 draft) is complete and self-consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmi_server.demo import builder

pytestmark = pytest.mark.unit

KIT = builder.KIT_DIR
TARGET = KIT / "target"
EAGLE = KIT / "eagle"
BUDGET_BYTES = 30 * 1024 * 1024


def _tensors(path: Path) -> dict[str, tuple[list[int], str]]:
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            out[k] = (list(sl.get_shape()), sl.get_dtype())
    return out


def test_kit_files_present():
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (TARGET / name).is_file(), name
    assert (EAGLE / "config.json").is_file()
    assert (EAGLE / "model.safetensors").is_file()
    assert (KIT / "training.json").is_file()
    assert (KIT / "training_loss.png").is_file()


def test_kit_under_size_budget():
    total = sum(p.stat().st_size for p in KIT.rglob("*") if p.is_file())
    assert total < BUDGET_BYTES, total


def test_target_config_and_tokenizer():
    from transformers import AutoTokenizer

    cfg = json.loads((TARGET / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["max_position_embeddings"] >= 16384
    tok = AutoTokenizer.from_pretrained(TARGET)
    assert len(tok) == cfg["vocab_size"]
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|bos|><|user|>\nhi<|end|>\n") and text.endswith("<|assistant|>\n")
    assert tok.eos_token_id == cfg["eos_token_id"]
    gen = json.loads((TARGET / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"]


def test_target_weights_match_config():
    cfg = json.loads((TARGET / "config.json").read_text())
    t = _tensors(TARGET / "model.safetensors")
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    assert t["model.embed_tokens.weight"][0] == [V, H]
    assert t["lm_head.weight"][0] == [V, H]
    assert sum(k.endswith("self_attn.q_proj.weight") for k in t) == L


def test_draft_matches_target():
    tcfg = json.loads((TARGET / "config.json").read_text())
    dcfg = json.loads((EAGLE / "config.json").read_text())
    assert dcfg["num_hidden_layers"] == 1
    assert dcfg["architectures"][0] in ("EagleLlamaForCausalLM", "LlamaForCausalLM")
    for key in ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "rms_norm_eps"):
        assert dcfg[key] == tcfg[key], key
    H, I = tcfg["hidden_size"], tcfg["intermediate_size"]
    kv = tcfg["num_key_value_heads"] * (H // tcfg["num_attention_heads"])
    expected = {
        "fc.weight": [H, 2 * H],
        "layers.0.self_attn.q_proj.weight": [H, H],
        "layers.0.self_attn.k_proj.weight": [kv, H],
        "layers.0.self_attn.v_proj.weight": [kv, H],
        "layers.0.self_attn.o_proj.weight": [H, H],
        "layers.0.post_attention_layernorm.weight": [H],
        "layers.0.mlp.gate_proj.weight": [I, H],
        "layers.0.mlp.up_proj.weight": [I, H],
        "layers.0.mlp.down_proj.weight": [H, I],
    }
    got = {k: v[0] for k, v in _tensors(EAGLE / "model.safetensors").items()}
    # embed_tokens / lm_head come from the target; input_layernorm is Identity in EAGLE-1 layer 0
    assert got == expected


def test_training_record():
    rec = json.loads((KIT / "training.json").read_text())
    for key in ("config", "target_train_seconds", "draft_train_seconds", "target_final_heldout_loss",
                "heldout_simulated_acceptance", "target_loss_curve", "draft_loss_curve"):
        assert key in rec, key
    # it learnt something: random init ~8.3 nats, unigram ~6; the shipped kit: ~4.9 held-out
    assert rec["target_final_heldout_loss"] < 5.5
    ev = rec.get("vllm_eval")
    if ev is not None:
        assert ev["lossless"] is True


def test_ensure_demo_model_installs_the_kit(tmp_path, monkeypatch):
    monkeypatch.setenv("LMI_SERVER_CACHE", str(tmp_path / "cache"))
    d = builder.ensure_demo_model()
    assert d == builder.default_cache_dir()
    assert (d / "model.safetensors").read_bytes() == (TARGET / "model.safetensors").read_bytes()
    assert (d / "tokenizer.json").is_file() and (d / builder.KIT_STAMP).is_file()
    assert builder.ensure_demo_draft() == EAGLE
    # explicit cache_dir; a second call reuses the copy
    m = builder.ensure_demo_model(tmp_path / "m")
    assert m == tmp_path / "m" and builder.ensure_demo_model(m) == m
    # a stale or foreign model in the cache directory is replaced by the kit
    (m / builder.KIT_STAMP).write_text("stale\n")
    (m / "model.safetensors").write_bytes(b"x")
    builder.ensure_demo_model(m)
    assert (m / "model.safetensors").read_bytes() == (TARGET / "model.safetensors").read_bytes()

"""scripts/train_eagle3.py without an engine or a model build: the draft-vocabulary maps (vLLM adds
d2t to the draft id), the saved tensor names/shapes and config of the eagle3 layout, and the
causality of the train-time unroll, on a tiny random Llama config."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_eagle3.py"


@pytest.fixture(scope="module")
def te3():
    spec = importlib.util.spec_from_file_location("train_eagle3", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_eagle3"] = mod
    spec.loader.exec_module(mod)
    return mod


def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=6,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       architectures=["LlamaForCausalLM"], eos_token_id=2)


def test_vocab_maps(te3):
    counts = [0] * 50
    for t, c in {7: 10, 3: 9, 40: 9, 11: 1, 2: 0}.items():
        counts[t] = c
    d2t_abs, d2t, t2d, t2dmap = te3.build_vocab_maps(counts, 4, always=(2,))
    assert d2t_abs.tolist() == [2, 3, 7, 40]  # eos forced in, then by count (ties: lower id), sorted
    base = torch.arange(4)
    assert (base + d2t).tolist() == d2t_abs.tolist()  # vLLM: targets = arange(draft) + d2t
    assert d2t.dtype == torch.long and t2d.dtype == torch.bool
    assert t2d.shape == (50,) and t2d.sum() == 4 and bool(t2d[40]) and not bool(t2d[11])
    assert t2dmap[40] == 3 and t2dmap[11] == -1
    cov = te3.coverage_table(counts, [1, 2, 50])
    assert cov[1] == pytest.approx(10 / 29) and cov[50] == pytest.approx(1.0)


def test_default_aux_layers(te3):
    assert te3.default_aux_layers(30) == [2, 15, 27]


def test_saved_layout(te3, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    cfg = tiny_config()
    H, Vd = cfg.hidden_size, 8
    head = te3.make_head(cfg, Vd, 3)
    d2t_abs, d2t, t2d, _ = te3.build_vocab_maps(list(range(50)), Vd)
    aux = te3.default_aux_layers(cfg.num_hidden_layers)
    monkeypatch.setattr(te3, "PROTECTED", tmp_path / "protected")
    te3.save_head(head, cfg, tmp_path / "out", d2t, t2d, aux, {"x": 1})
    sd = load_file(str(tmp_path / "out" / "model.safetensors"))
    hd = H // cfg.num_attention_heads
    expect = {
        "fc.weight": (H, 3 * H),
        "midlayer.self_attn.q_proj.weight": (cfg.num_attention_heads * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": (cfg.num_key_value_heads * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": (cfg.num_key_value_heads * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, cfg.num_attention_heads * hd),
        "midlayer.mlp.gate_proj.weight": (cfg.intermediate_size, H),
        "midlayer.mlp.up_proj.weight": (cfg.intermediate_size, H),
        "midlayer.mlp.down_proj.weight": (H, cfg.intermediate_size),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (Vd, H),
        "d2t": (Vd,),
        "t2d": (50,),
    }
    assert {k: tuple(v.shape) for k, v in sd.items()} == expect
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    assert not any("embed_tokens" in k for k in sd)  # vLLM shares the target's embedding
    import json

    c = json.loads((tmp_path / "out" / "config.json").read_text())
    assert c["architectures"] == ["LlamaForCausalLMEagle3"]
    assert c["num_hidden_layers"] == 1 and c["draft_vocab_size"] == Vd and c["vocab_size"] == 50
    assert c["target_hidden_size"] == H and c["tie_word_embeddings"] is False
    assert c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]


def test_refuses_shipped_eagle_dir(te3, tmp_path):
    cfg = tiny_config()
    head = te3.make_head(cfg, 8, 3)
    _, d2t, t2d, _ = te3.build_vocab_maps(list(range(50)), 8)
    with pytest.raises(SystemExit):
        te3.save_head(head, cfg, te3.PROTECTED, d2t, t2d, [2, 3, 3], {})


def test_unroll_is_causal(te3):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    torch.manual_seed(0)
    cfg = tiny_config()
    head = te3.make_head(cfg, 8, 3)
    with torch.no_grad():  # non-zero residual writers so every path matters
        for lin in (head.o_proj, head.down_proj):
            lin.weight.normal_(0, 0.1)
    T, H = 7, cfg.hidden_size
    emb, aux = torch.randn(1, T, H), torch.randn(1, T, 3 * H)
    rot = LlamaRotaryEmbedding(cfg)
    cos, sin = rot(emb, torch.arange(T).unsqueeze(0))
    with torch.no_grad():
        a = te3.unroll(head, emb, aux, cos, sin, 3)
        emb2, aux2 = emb.clone(), aux.clone()
        emb2[:, 5:] += 1.0
        aux2[:, 5:] += 1.0
        b = te3.unroll(head, emb2, aux2, cos, sin, 3)
    for k in range(3):
        assert a[k].shape == (1, T, 8)
        assert torch.allclose(a[k][:, :5], b[k][:, :5], atol=1e-6)  # rows < 5 never see rows >= 5
        assert not torch.allclose(a[k][:, 5:], b[k][:, 5:])

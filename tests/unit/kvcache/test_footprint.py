import pytest
from tests.unit.kvcache.kv_model_configs import DEEPSEEK_V2_LITE, GEMMA2_9B, LLAMA31_8B, QWEN25_1_5B, QWEN25_72B

from lmi_server.kvcache.footprint import ModelConfigError, kv_footprint

pytestmark = pytest.mark.unit


def test_qwen25_72b_is_320_kib_per_token():
    fp = kv_footprint(QWEN25_72B)
    assert fp.bytes_per_token == 327_680 == 2 * 80 * 8 * 128 * 2
    assert fp.sliding_window_layers == 0  # use_sliding_window: false
    assert "327,680 B per token" in fp.explanation


def test_qwen25_1_5b():
    assert kv_footprint(QWEN25_1_5B).bytes_per_token == 2 * 28 * 2 * 128 * 2 == 28_672


def test_llama31_8b():
    assert kv_footprint(LLAMA31_8B).bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072


def test_deepseek_mla_one_latent_per_layer():
    fp = kv_footprint(DEEPSEEK_V2_LITE)
    assert fp.is_mla
    assert fp.bytes_per_token == 27 * (512 + 64) * 2 == 31_104
    # MLA latent is replicated on every TP rank, GQA heads are split.
    assert fp.tp_shards(8) == 1
    assert kv_footprint(QWEN25_72B).tp_shards(8) == 8
    assert kv_footprint(QWEN25_1_5B).tp_shards(8) == 2  # only 2 KV heads to split


def test_sliding_window_layers_are_window_limited_for_the_engine():
    fp = kv_footprint(GEMMA2_9B)
    per_layer = 2 * 8 * 256 * 4
    assert fp.bytes_per_token_per_layer == per_layer
    assert (fp.full_attention_layers, fp.sliding_window_layers, fp.sliding_window) == (21, 21, 4096)
    assert fp.bytes_per_token == 42 * per_layer  # LMCache stores every layer
    assert fp.engine_bytes_for_sequence(8192) == per_layer * (21 * 8192 + 21 * 4096)
    assert fp.engine_bytes_for_sequence(1000) == 1000 * fp.bytes_per_token


def test_qwen2_sliding_window_used_from_max_window_layers():
    cfg = {**QWEN25_1_5B, "use_sliding_window": True, "sliding_window": 4096}
    fp = kv_footprint(cfg)
    assert (fp.full_attention_layers, fp.sliding_window_layers) == (21, 7)


def test_kv_cache_dtype_overrides_model_dtype_and_transformers5_dtype_key():
    assert kv_footprint(LLAMA31_8B, kv_cache_dtype="fp8").bytes_per_token == 65_536
    cfg = {k: v for k, v in LLAMA31_8B.items() if k != "torch_dtype"} | {"dtype": "float32"}
    assert kv_footprint(cfg).bytes_per_token == 262_144


def test_multimodal_text_config_is_used():
    cfg = {"architectures": ["X"], "text_config": dict(LLAMA31_8B)}
    assert kv_footprint(cfg).bytes_per_token == 131_072


def test_missing_key_is_named():
    cfg = {k: v for k, v in LLAMA31_8B.items() if k != "num_hidden_layers"}
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        kv_footprint(cfg)
    with pytest.raises(ModelConfigError, match="unknown KV dtype"):
        kv_footprint({**LLAMA31_8B, "torch_dtype": "int3"})

"""Which models blending can handle, decided from config.json, with the reason when it cannot."""

import pytest

from lmi_server.kvcache.blend.support import BlendUnsupportedModel, check_model
from tests.unit.kvcache.blend import model_configs as models


@pytest.mark.parametrize(
    "config,arch",
    [(models.SMOLLM2_135M, "LlamaForCausalLM"), (models.LLAMA31_8B, "LlamaForCausalLM"),
     (models.QWEN25_7B, "Qwen2ForCausalLM"), (models.QWEN3_8B, "Qwen3ForCausalLM")],
)
def test_llama_qwen2_qwen3_are_handled(config, arch):
    support = check_model(config)
    assert support.architecture == arch and support.check_layer == 1
    assert support.num_layers == config["num_hidden_layers"]
    assert arch in support.describe() and "re-rotated exactly" in support.describe()


@pytest.mark.parametrize(
    "config,kv_dtype,words",
    [
        ({**models.SMOLLM2_135M, "architectures": ["MistralForCausalLM"]}, None, "MistralForCausalLM is not supported"),
        ({k: v for k, v in models.SMOLLM2_135M.items() if k != "architectures"}, None, "none named"),
        (models.GEMMA3_LIKE, None, "Gemma3ForCausalLM"),
        ({**models.QWEN25_7B, "use_sliding_window": True}, None, "sliding-window"),
        ({**models.QWEN3_8B, "layer_types": ["full_attention", "sliding_attention"]}, None, "sliding-window"),
        (models.QWEN25_YARN, None, "'yarn'"),
        ({**models.SMOLLM2_135M, "quantization_config": {"quant_method": "gguf"}}, None, "GGUF"),
        (models.SMOLLM2_135M, "fp8_e4m3", "kv_cache_dtype=fp8_e4m3"),
        ({**models.SMOLLM2_135M, "num_hidden_layers": 1}, None, "check layer"),
    ],
)
def test_what_it_cannot_handle_is_refused_with_the_reason(config, kv_dtype, words):
    with pytest.raises(BlendUnsupportedModel, match=words):
        check_model(config, kv_cache_dtype=kv_dtype)


def test_bfloat16_kv_is_fine():
    assert check_model(models.QWEN3_8B, kv_cache_dtype="bfloat16").rope.head_dim == 128

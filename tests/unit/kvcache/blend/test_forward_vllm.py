"""The blended prefill through vLLM's own LlamaForCausalLM modules (built in this process from a
tiny random HF model, float32, tensor parallelism 1): a full prefill gives HF's logits and KV, and
ratio 1 with moved segments is a full prefill."""

import pytest
import torch

from lmi_server.kvcache.blend import forward

from .test_forward import CONFIG, assert_same, cached_prompt, docs, hf_reference, prompt_of

pytestmark = pytest.mark.unit

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    try:
        from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
        from vllm.distributed import init_distributed_environment, initialize_model_parallel
        from vllm.distributed.parallel_state import model_parallel_is_initialized
        from vllm.model_executor.model_loader.utils import process_weights_after_loading
        from vllm.model_executor.models.llama import LlamaForCausalLM
    except Exception as exc:  # noqa: BLE001 - any import failure means: no vLLM reference here
        pytest.skip(f"vLLM's Llama does not import here: {exc}")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    hf.config._attn_implementation = "eager"
    path = tmp_path_factory.mktemp("tiny-llama")
    hf.save_pretrained(path)
    config = VllmConfig(model_config=ModelConfig(model=str(path), dtype="float32", skip_tokenizer_init=True))
    with set_current_vllm_config(config):
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                         distributed_init_method=f"file://{path}/dist", backend="gloo")
            initialize_model_parallel(1, 1)
        model = LlamaForCausalLM(vllm_config=config, prefix="").eval()
        model.load_weights(hf.state_dict().items())
        process_weights_after_loading(model, config.model_config, torch.device("cpu"))
    return hf, model


@torch.no_grad()
def test_vllms_modules_give_hfs_full_prefill(models):
    hf, model = models
    adapter = forward.VLLMLlamaAdapter(model)
    assert (adapter.num_layers, adapter.num_heads, adapter.num_kv_heads, adapter.head_dim) == (4, 4, 2, 16)
    ids = prompt_of(docs(11), [3, 4, 5, 6])
    assert_same(forward.prefill(adapter, ids), *hf_reference(hf, ids))


@torch.no_grad()
def test_ratio_one_through_vllms_modules_is_a_full_prefill(models):
    from lmi_server.kvcache.blend.rope import RopeSpec

    hf, model = models
    adapter = forward.VLLMLlamaAdapter(model)
    spec = RopeSpec.from_hf_config(hf.config.to_dict())
    ids, reused_kv, mask = cached_prompt(adapter, spec, docs(12), [2, 0, 1], [9, 8, 7])
    assert mask.any()
    assert_same(forward.blend_prefill(adapter, ids, reused_kv, mask, ratio=1.0), *hf_reference(hf, ids))
    r0 = forward.blend_prefill(adapter, ids, reused_kv, mask, ratio=0.0)
    assert r0.selected.tolist() == (~mask).nonzero().flatten().tolist()

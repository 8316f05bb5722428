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


@pytest.mark.parametrize("ratio,mode,epic_tokens", [(1.0, "cacheblend", 0), (0.0, "cacheblend", 0), (1.0, "epic", 1000),
                                                     (0.0, "epic", 0), (1.0, "guided", 0), (0.0, "guided", 0)])
def test_the_worker_blends_into_a_paged_cache_what_it_stored_from_one(models, tmp_path, ratio, mode, epic_tokens):
    """The engine path minus the engine: a prefill's KV in vLLM's CPU paged layout is stored per
    segment (`store_from_blocks`), then the same documents in another order are blended into other
    blocks (`blend`). Ratio 1 writes a full prefill's KV; ratio 0 keeps the cached rows (layer 0
    exact, as its KV depends on token and position alone) and recomputes the rest. The EPIC mode
    does the same with every token of each span recomputed (1,000 per span) or none (0), and the
    question-guided mode with its ratio."""
    from lmi_server.kvcache.blend import paged
    from lmi_server.kvcache.blend.scheduling import BlendJob, StoreJob
    from lmi_server.kvcache.blend.segments import key_salt, split_at_separator
    from lmi_server.kvcache.blend.settings import BlendConfig
    from lmi_server.kvcache.blend.store import BlendCounters
    from lmi_server.kvcache.blend.worker import BlendWorker

    from .test_forward import SEP

    hf, model = models
    block, n_blocks = 16, 24
    config = BlendConfig(separator=" # # ", recompute_ratio=ratio, check_layer=1, chunk_size=8, min_reused_tokens=8,
                         store_dir=str(tmp_path / "store"), store_max_bytes=10**9, model_identity="tiny")
    worker = BlendWorker(config, hf.config.to_dict(), "LlamaForCausalLM", model=model)
    caches = {f"model.layers.{i}.self_attn.attn": torch.zeros(n_blocks, 2, block, 32) for i in range(4)}
    worker.register(caches, {name: type("Layer", (), {"isa": "vec"})() for name in caches})
    adapter = worker.adapter()
    documents, salt = docs(21), key_salt("tiny")

    first = prompt_of(documents, [9, 8, 7])
    table1 = [3, 0, 7, 5, 1, 9, 2, 4]
    slots = paged.slot_mapping(table1, 0, len(first), block)
    with torch.no_grad():
        for layer, (k, v) in zip(worker.layers, forward.prefill(adapter, first).kv):
            paged.scatter(layer, slots, k, v)  # what vLLM's own prefill leaves in the blocks
    segments = split_at_separator(first, SEP)[:-1]
    worker.run([StoreJob("r1", first, table1, [(s.start, len(s), 0) for s in segments], salt)])
    assert all(worker.store.cached_tokens(list(s.token_ids), salt) == len(s) for s in segments)

    second = prompt_of([documents[i] for i in (2, 0, 1)], [6, 5, 4])
    cached = [(s.start, len(s), len(s)) for s in split_at_separator(second, SEP)[:-1]] + [(len(second) - 3, 3, 0)]
    table2 = [10, 14, 11, 20, 12, 13, 8, 6]
    worker.run([BlendJob("r2", second, table2, cached, salt, ratio, mode=mode, epic_tokens=epic_tokens)])
    n = len(second)
    written = [paged.gather(layer, paged.slot_mapping(table2, 0, n - 1, block)) for layer in worker.layers]
    with torch.no_grad():
        full = forward.prefill(adapter, second).kv
    torch.testing.assert_close(written[0][0], full[0][0][: n - 1], atol=1e-4, rtol=1e-4)
    reused = sum(length for _, length, c in cached if c)
    counters = BlendCounters.read(config.store_dir)
    assert counters["blended_requests"] == 1 and counters["missed_loads"] == 0
    if ratio == 1.0:
        for (k, v), (fk, fv) in zip(written, full):
            torch.testing.assert_close(k, fk[: n - 1], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(v, fv[: n - 1], atol=1e-4, rtol=1e-4)
        assert counters["recomputed_tokens"] == reused and counters["reused_tokens"] == 0
    else:
        assert counters["reused_tokens"] == reused and counters["recomputed_tokens"] == 0
        assert not torch.allclose(written[-1][0], full[-1][0][: n - 1], atol=1e-4)  # the blend differs past layer 0


def test_the_worker_blends_past_vllms_own_prefix_hit(models, tmp_path):
    """With vLLM's prefix cache on, a request's first blocks may already hold its prompt head (a hit
    on another request's blocks). The blend reads that KV from the blocks as exact, writes only the
    blocks past it, and at ratio 1 the result is still a full prefill."""
    from lmi_server.kvcache.blend import paged
    from lmi_server.kvcache.blend.scheduling import BlendJob, StoreJob
    from lmi_server.kvcache.blend.segments import key_salt, split_at_separator
    from lmi_server.kvcache.blend.settings import BlendConfig
    from lmi_server.kvcache.blend.worker import BlendWorker

    from .test_forward import SEP

    hf, model = models
    block, n_blocks = 16, 24
    config = BlendConfig(separator=" # # ", recompute_ratio=1.0, check_layer=1, chunk_size=8, min_reused_tokens=8,
                         store_dir=str(tmp_path / "store"), store_max_bytes=10**9, model_identity="tiny")
    worker = BlendWorker(config, hf.config.to_dict(), "LlamaForCausalLM", model=model)
    caches = {f"model.layers.{i}.self_attn.attn": torch.zeros(n_blocks, 2, block, 32) for i in range(4)}
    worker.register(caches, {name: type("Layer", (), {"isa": "vec"})() for name in caches})
    adapter = worker.adapter()
    documents, salt = docs(31), key_salt("tiny")

    first = prompt_of(documents, [9, 8, 7])
    table1 = [3, 0, 7, 5, 1, 9, 2, 4]
    with torch.no_grad():
        for layer, (k, v) in zip(worker.layers, forward.prefill(adapter, first).kv):
            paged.scatter(layer, paged.slot_mapping(table1, 0, len(first), block), k, v)
    worker.run([StoreJob("r1", first, table1, [(s.start, len(s), 0) for s in split_at_separator(first, SEP)[:-1]], salt)])

    # the same first document, then the others swapped: vLLM's prefix cache holds the first block
    second = prompt_of([documents[i] for i in (0, 2, 1)], [6, 5, 4])
    prefix = block
    assert second[:prefix] == first[:prefix]
    segments = [s for s in split_at_separator(second, SEP)[:-1] if s.start >= prefix]
    cached = [(s.start, len(s), len(s)) for s in segments]
    table2 = [table1[0], 14, 11, 20, 12, 13, 8, 6]  # block 0 shared with the first request
    held_before = [paged.gather(layer, paged.slot_mapping(table2, 0, prefix, block)) for layer in worker.layers]
    worker.run([BlendJob("r2", second, table2, cached, salt, 1.0, prefix=prefix)])
    n = len(second)
    with torch.no_grad():
        full = forward.prefill(adapter, second).kv
    for layer, (fk, fv), (hk, hv) in zip(worker.layers, full, held_before):
        k, v = paged.gather(layer, paged.slot_mapping(table2, 0, n - 1, block))
        torch.testing.assert_close(k, fk[: n - 1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, fv[: n - 1], atol=1e-4, rtol=1e-4)
        assert torch.equal(k[:prefix], hk) and torch.equal(v[:prefix], hv)  # the shared block as it was


def test_the_blend_reads_the_prefix_from_the_blocks_and_never_writes_it(models, tmp_path):
    """The held prefix is whatever the shared blocks hold (here: altered KV): the blend attends to it
    in every layer, below the check layer too (its tokens are not computed again there), and leaves
    those blocks untouched."""
    from lmi_server.kvcache.blend import paged
    from lmi_server.kvcache.blend.scheduling import BlendJob
    from lmi_server.kvcache.blend.settings import BlendConfig
    from lmi_server.kvcache.blend.worker import BlendWorker

    hf, model = models
    block = 16
    config = BlendConfig(separator=" # # ", recompute_ratio=1.0, check_layer=1, chunk_size=8, min_reused_tokens=8,
                         store_dir=str(tmp_path / "store"), store_max_bytes=10**9, model_identity="tiny")
    worker = BlendWorker(config, hf.config.to_dict(), "LlamaForCausalLM", model=model)
    caches = {f"model.layers.{i}.self_attn.attn": torch.zeros(24, 2, block, 32) for i in range(4)}
    worker.register(caches, {name: type("Layer", (), {"isa": "vec"})() for name in caches})
    adapter = worker.adapter()
    ids = prompt_of(docs(41), [6, 5, 4])
    n, table = len(ids), [5, 1, 9, 2, 4, 7, 8, 3]
    with torch.no_grad():
        full = forward.prefill(adapter, ids).kv
    held = paged.slot_mapping(table, 0, block, block)
    for layer, (k, v) in zip(worker.layers, full):
        paged.scatter(layer, held, 1.5 * k[:block], 1.5 * v[:block])
    worker.run([BlendJob("r", ids, table, [], b"salt", 1.0, prefix=block)])
    rest = paged.slot_mapping(table, block, n - 1 - block, block)
    for i, (layer, (fk, fv)) in enumerate(zip(worker.layers, full)):
        k, v = paged.gather(layer, held)
        assert torch.equal(k, (1.5 * fk[:block]).to(k.dtype)) and torch.equal(v, (1.5 * fv[:block]).to(v.dtype))
        k, _ = paged.gather(layer, rest)
        if i == 0:  # layer 0's K depends on token and position alone
            torch.testing.assert_close(k, fk[block : n - 1], atol=1e-4, rtol=1e-4)
        else:  # the held prefix is trusted at every layer (never recomputed): the prompt attends to it
            assert not torch.allclose(k, fk[block : n - 1], atol=1e-4)

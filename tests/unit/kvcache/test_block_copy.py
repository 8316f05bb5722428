"""Block-wise KV copies give byte-for-byte what LMCache's own kernel gives, for stores (paged KV ->
chunks) and hits (chunks -> paged KV), with scattered blocks, a skipped prefix and a short last
chunk; other layouts stay with LMCache's kernel."""

import pytest
import torch

from lmcache.v1.multiprocess.transfer_context.base import gather_paged_kv_to_cpu, scatter_cpu_to_paged_kv
from lmcache.v1.platform.torch_ops import mp_mem_kernels

from lmi_server.kvcache import block_copy

pytestmark = pytest.mark.unit

LAYERS, BLOCKS, HEADS, BLOCK, HEAD = 3, 24, 2, 128, 16
# two chunks of 2 blocks each (one run, one scattered pair), then a chunk of one block
BLOCK_IDS = [5, 6, 17, 2, 9]


@pytest.fixture
def lmcache_kernel(monkeypatch):
    """The kernel LMCache ships; each test leaves it in place again."""
    original = mp_mem_kernels._transfer_per_layer_fused
    monkeypatch.setattr(mp_mem_kernels, "_transfer_per_layer_fused", original)
    return original


def vllm_cpu_kv(dtype=torch.bfloat16, fill=True):
    """vLLM's CPU KV cache: one [blocks, kv_heads, block_size, 2*head_size] tensor per layer (K and V
    packed per token, head-major inside a block)."""
    make = torch.randn if fill else torch.zeros
    return {f"model.layers.{i}.self_attn.attn": make(BLOCKS, HEADS, BLOCK, 2 * HEAD).to(dtype) for i in range(LAYERS)}


def test_runs_of_consecutive_blocks():
    assert list(block_copy.consecutive_runs([5, 6, 17, 2, 3, 4])) == [(0, 5, 2), (2, 17, 1), (3, 2, 3)]
    assert list(block_copy.consecutive_runs([])) == []


def test_lmcache_sees_vllms_cpu_layout_as_packed_kv():
    from lmcache.v1.multiprocess.transfer_context.base import compute_kv_layout

    assert compute_kv_layout(vllm_cpu_kv())[4].name == "NL_X_NB_NH_BS_CS"


def test_install_replaces_the_packed_kv_kernel_once(lmcache_kernel):
    assert block_copy.install() and block_copy.install()
    kernel = mp_mem_kernels._transfer_per_layer_fused
    assert kernel.lmi_block_copy and kernel.lmcache_kernel is lmcache_kernel


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_store_gathers_the_same_chunks_as_lmcache(lmcache_kernel, dtype):
    kv = vllm_cpu_kv(dtype)
    theirs = gather_paged_kv_to_cpu(kv, BLOCK_IDS[:4], 2)
    block_copy.install()
    ours = gather_paged_kv_to_cpu(kv, BLOCK_IDS[:4], 2)
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert a.shape == (LAYERS, 2 * BLOCK, HEADS * 2 * HEAD) and torch.equal(a, b)
    # and the chunk really is token-major: token 7 of block 5, head 1 of layer 0
    layer0 = next(iter(kv.values()))
    assert torch.equal(ours[0][0, 7, 2 * HEAD : 4 * HEAD], layer0[5, 1, 7])


@pytest.mark.parametrize("skip_tokens", [0, BLOCK])
def test_a_hit_scatters_the_same_kv_as_lmcache(lmcache_kernel, skip_tokens):
    chunks = [torch.randn(LAYERS, 2 * BLOCK, HEADS * 2 * HEAD).to(torch.bfloat16) for _ in range(3)]
    theirs, ours = vllm_cpu_kv(fill=False), vllm_cpu_kv(fill=False)
    # three chunks over six blocks: one run of two, then scattered pairs
    scatter_cpu_to_paged_kv(theirs, BLOCK_IDS + [11], chunks, 2, skip_first_n_tokens=skip_tokens)
    block_copy.install()
    scatter_cpu_to_paged_kv(ours, BLOCK_IDS + [11], chunks, 2, skip_first_n_tokens=skip_tokens)
    for name in ours:
        assert torch.equal(ours[name], theirs[name])
    layer0 = next(iter(ours.values()))
    assert layer0.abs().sum() > 0
    assert bool(layer0[5].abs().sum() == 0) == bool(skip_tokens)  # a skipped block stays untouched


def test_token_major_layouts_stay_with_lmcaches_kernel():
    called = []

    class TokenMajor:
        is_hnd = False

    layers = [torch.zeros(BLOCKS, BLOCK, HEADS, 2 * HEAD)]
    block_copy.transfer_per_layer_fused(
        layers, [torch.zeros(1, BLOCK, HEADS * 2 * HEAD)], [1], 1, 1, BLOCK, TokenMajor, False, 0,
        fallback=lambda *a: called.append(a), valid_range=None,
    )
    assert len(called) == 1 and called[0][0] is layers


def test_objects_it_cannot_view_go_to_lmcaches_kernel():
    """A strided chunk (not LMCache's own buffers) is left to LMCache's kernel rather than copied
    through a reshaped temporary that would drop the writes."""
    called = []

    class HeadMajor:
        is_hnd = True

    strided = torch.zeros(LAYERS, HEADS * 2 * HEAD, 2 * BLOCK).transpose(1, 2)
    block_copy.transfer_per_layer_fused(
        [torch.zeros(BLOCKS, HEADS, BLOCK, 2 * HEAD)], [strided], [1, 2], 2, 2, BLOCK, HeadMajor, True, 0,
        fallback=lambda *a: called.append(a), valid_range=None,
    )
    assert len(called) == 1 and called[0][1][0] is strided

"""Token-granular KV copies into vLLM's CPU paged KV cache: the layout is the one vLLM's own kernel
writes, a round trip matches a reference built element by element, a segment starts and ends
mid-block over scattered blocks, and K loaded at new positions equals K computed there."""

import pytest
import torch

from lmi_server.kvcache.blend import paged
from lmi_server.kvcache.blend.rope import RopeSpec, rotate

pytestmark = pytest.mark.unit

BLOCKS, HEADS, BLOCK, HEAD = 6, 2, 16, 32
TABLE = [4, 1, 5, 2]  # a request's block table: scattered, not ascending


def empty_cache(dtype=torch.float32, blocks=BLOCKS, block=BLOCK, head=HEAD):
    return torch.zeros(blocks, HEADS, block, 2 * head, dtype=dtype)


def kv(n, seed=0, dtype=torch.float32, head=HEAD):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HEADS, head, generator=g).to(dtype), torch.randn(n, HEADS, head, generator=g).to(dtype)


def reference_scatter(cache, slots, k, v):
    """Element by element: per (block, head), K at d x block_size + t, then V at block_size x
    head_size + t x head_size + d."""
    blocks, heads, block, width = cache.shape
    head = width // 2
    flat = cache.view(blocks, heads, -1)
    for i, slot in enumerate(slots):
        b, t = divmod(int(slot), block)
        for h in range(heads):
            for d in range(head):
                flat[b, h, d * block + t] = k[i, h, d]
                flat[b, h, block * head + t * head + d] = v[i, h, d]


@pytest.mark.parametrize("isa", ["vec", "vec16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [16, 32])
def test_layout_is_the_one_vllms_cpu_kernel_writes(isa, dtype, block):
    ops = pytest.importorskip("vllm._custom_ops")
    head = 64  # vec wants head_size % 32 == 0 for some paths; both take 64
    n = 3 * block - 5
    k, v = kv(n, dtype=dtype, head=head)
    slots = paged.slot_mapping(TABLE, 3, n, block)
    theirs = empty_cache(dtype, block=block, head=head)
    halves = theirs.view(BLOCKS, HEADS, 2 * block, head).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(k, v, halves[0], halves[1], slots, isa)
    ours = empty_cache(dtype, block=block, head=head)
    paged.scatter(ours, slots, k, v)
    assert torch.equal(ours, theirs)
    back_k, back_v = paged.gather(theirs, slots)
    assert torch.equal(back_k, k) and torch.equal(back_v, v)


def test_slot_mapping_follows_the_block_table():
    slots = paged.slot_mapping(TABLE, 14, 4, BLOCK)
    assert slots.tolist() == [4 * 16 + 14, 4 * 16 + 15, 1 * 16 + 0, 1 * 16 + 1]
    assert paged.slot_mapping(TABLE, 0, 0, BLOCK).numel() == 0
    with pytest.raises(ValueError, match="blocks"):
        paged.slot_mapping(TABLE, 60, 5, BLOCK)
    with pytest.raises(ValueError):
        paged.slot_mapping(TABLE, -1, 2, BLOCK)


@pytest.mark.parametrize("start,n", [(0, 16), (5, 9), (13, 30), (0, 64), (31, 1)])
def test_round_trip_matches_a_hand_built_reference(start, n):
    k, v = kv(n, seed=start)
    slots = paged.slot_mapping(TABLE, start, n, BLOCK)
    ours, ref = torch.randn(BLOCKS, HEADS, BLOCK, 2 * HEAD), None
    ref = ours.clone()
    paged.scatter(ours, slots, k, v)
    reference_scatter(ref, slots, k, v)
    assert torch.equal(ours, ref)  # and so every other slot kept its bytes
    back_k, back_v = paged.gather(ours, slots)
    assert torch.equal(back_k, k) and torch.equal(back_v, v)


def test_bad_shapes_and_slots_are_refused():
    cache = empty_cache()
    k, v = kv(3)
    with pytest.raises(ValueError, match="distinct"):
        paged.scatter(cache, [1, 1, 2], k, v)
    with pytest.raises(ValueError, match="slots must lie"):
        paged.scatter(cache, [0, 1, BLOCKS * BLOCK], k, v)
    with pytest.raises(ValueError, match="must be"):
        paged.scatter(cache, [0, 1], k, v)
    with pytest.raises(paged.PagedLayoutError):
        paged.gather(torch.zeros(BLOCKS, HEADS, BLOCK), [0])
    with pytest.raises(paged.PagedLayoutError):
        paged.gather(empty_cache().transpose(0, 1), [0])


def test_only_checked_kernels_are_accepted():
    paged.check_isa("vec")
    paged.check_isa("vec16")
    with pytest.raises(paged.PagedLayoutError, match="amx"):
        paged.check_isa("amx")


SPEC = RopeSpec(head_dim=HEAD, rotary_dim=HEAD, base=10000.0)
PARTIAL = RopeSpec(head_dim=HEAD, rotary_dim=HEAD // 2, base=500000.0, rope_type="llama3", factor=8.0,
                   original_max_position=8192)


@pytest.mark.parametrize("spec", [SPEC, PARTIAL], ids=["default", "llama3-partial"])
@pytest.mark.parametrize("to_start", [0, 7, 37, 5000])
def test_a_segment_loaded_at_new_positions_has_the_k_computed_there(spec, to_start):
    """Cached at segment-local positions 0..n-1, loaded at q..q+n-1: K equals the projection rotated
    at q.. (float32, 1e-5); V is unchanged."""
    n = 21
    raw_k, v = kv(n, seed=3)  # K before RoPE, as the projection gives it
    cached_k = rotate(raw_k, torch.arange(n), spec)
    blocks = [5, 0, 3] + list(range(6, 6 + 320))
    cache = empty_cache(blocks=6 + 320)
    slots = paged.slot_mapping(blocks, to_start, n, BLOCK)
    paged.load_segment(cache, slots, cached_k, v, spec, from_start=0, to_start=to_start)
    got_k, got_v = paged.gather(cache, slots)
    expected = rotate(raw_k, torch.arange(to_start, to_start + n), spec)
    torch.testing.assert_close(got_k, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(got_v, v)
    # and stored back at local positions: the cached K again
    back_k, back_v = paged.store_segment(cache, slots, spec, at_start=to_start)
    torch.testing.assert_close(back_k, cached_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(back_v, v)


def test_load_in_bfloat16_rounds_once():
    n = 10
    raw_k, v = kv(n, seed=4)
    cached = rotate(raw_k, torch.arange(n), SPEC).to(torch.bfloat16)
    cache = empty_cache(torch.bfloat16)
    slots = paged.slot_mapping(TABLE, 9, n, BLOCK)
    paged.load_segment(cache, slots, cached, v.to(torch.bfloat16), SPEC, to_start=9)
    got_k, _ = paged.gather(cache, slots)
    assert got_k.dtype == torch.bfloat16
    torch.testing.assert_close(got_k.float(), rotate(raw_k, torch.arange(9, 9 + n), SPEC), atol=3e-2, rtol=2e-2)

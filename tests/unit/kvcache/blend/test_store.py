"""The segment store: a segment's chunks round-trip, are found wherever the segment stood (keys of
its own tokens and the salt only), a missing chunk ends the hit, and the store stays under its size
by dropping what was used longest ago."""

import os
import time

import pytest
import torch

from lmi_server.kvcache.blend.segments import key_salt
from lmi_server.kvcache.blend.store import BlendCounters, SegmentStore

pytestmark = pytest.mark.unit

LAYERS, HEADS, DIM, CHUNK = 3, 2, 8, 4
SALT = key_salt("model-a")


def seg_kv(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, HEADS, DIM, generator=g), torch.randn(n, HEADS, DIM, generator=g)) for _ in range(LAYERS)]


def store(tmp_path, max_bytes=10**9):
    return SegmentStore(tmp_path / "segments", chunk_size=CHUNK, max_bytes=max_bytes)


def test_a_segment_round_trips_whole_and_by_its_head(tmp_path):
    s = store(tmp_path)
    tokens, kv = list(range(10, 20)), seg_kv(10)
    assert s.cached_tokens(tokens, SALT) == 0 and s.load(tokens, SALT, 10) is None
    assert s.save(tokens, SALT, kv) > 0
    assert s.cached_tokens(tokens, SALT) == 10  # two whole chunks and the 2-token tail
    for got, want in zip(s.load(tokens, SALT, 10), kv):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    head = s.load(tokens, SALT, 8)
    assert head[0][0].shape == (8, HEADS, DIM) and torch.equal(head[2][1], kv[2][1][:8])
    # a longer segment with the same first 8 tokens shares its first two chunks, not the third
    longer = tokens[:8] + [99, 98, 97, 96]
    assert s.cached_tokens(longer, SALT) == 8


def test_keys_depend_on_the_salt_and_the_tokens_only(tmp_path):
    s = store(tmp_path)
    tokens = [5, 6, 7, 8, 9]
    s.save(tokens, SALT, seg_kv(5))
    assert s.cached_tokens(tokens, key_salt("model-a")) == 5
    assert s.cached_tokens(tokens, key_salt("model-a", "tenant-b")) == 0
    assert s.cached_tokens(tokens, key_salt("model-b")) == 0
    assert s.cached_tokens([6, 5, 7, 8, 9], SALT) == 0


def test_a_missing_chunk_ends_the_hit_and_a_gone_chunk_is_a_miss_on_load(tmp_path):
    s = store(tmp_path)
    tokens = list(range(12))
    s.save(tokens, SALT, seg_kv(12))
    keys = s.keys(tokens, SALT)
    os.unlink(s._path(keys[1]))
    assert s.cached_tokens(tokens, SALT) == 4
    assert s.load(tokens, SALT, 12) is None
    # saving again fills only what is missing (from a chunk boundary)
    s.save(tokens, SALT, seg_kv(12), skip_tokens=4)
    assert s.cached_tokens(tokens, SALT) == 12


def test_the_store_drops_what_was_used_longest_ago(tmp_path):
    probe = store(tmp_path / "probe")
    one_chunk = probe.save([1, 2, 3, 4], SALT, seg_kv(4))
    s = store(tmp_path, max_bytes=int(2.5 * one_chunk))
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    s.save(a, SALT, seg_kv(4))
    time.sleep(0.02)
    s.save(b, SALT, seg_kv(4))
    time.sleep(0.02)
    assert s.load(a, SALT, 4) is not None  # a read makes `a` the most recently used
    time.sleep(0.02)
    s.save(c, SALT, seg_kv(4))
    assert [s.cached_tokens(t, SALT) for t in (a, b, c)] == [4, 0, 4]
    assert s.size_bytes() <= s.max_bytes


def test_counters_add_up_across_writers(tmp_path):
    first = BlendCounters(tmp_path)
    first.add(blended_requests=1, reused_tokens=100, blend_seconds=0.5)
    first.add(reused_tokens=20)
    values = BlendCounters.read(tmp_path)
    assert values["blended_requests"] == 1 and values["reused_tokens"] == 120 and values["blend_seconds"] == 0.5
    assert BlendCounters.read(tmp_path / "nothing")["reused_tokens"] == 0


def test_stores_of_servers_that_are_gone_are_removed(tmp_path):
    import subprocess
    import sys

    from lmi_server.kvcache.blend.store import remove_stale_stores

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = tmp_path / f"lmi-blend-{gone.stdout.strip()}", tmp_path / f"lmi-blend-{os.getpid()}"
    other = tmp_path / "lmi-blend-notapid"
    for d in (dead, alive, other):
        (d / "x.kv").parent.mkdir()
        (d / "x.kv").write_bytes(b"kv")
    assert remove_stale_stores(tmp_path) == [str(dead)]
    assert not dead.exists() and alive.exists() and other.exists()
    assert remove_stale_stores(tmp_path / "missing") == []


def test_a_segment_is_exact_only_after_the_prefix_it_was_computed_after(tmp_path):
    from lmi_server.kvcache.blend.segments import ContextKeys

    s = store(tmp_path)
    prompt = list(range(100, 130))
    seg = prompt[10:20]
    here, elsewhere = ContextKeys(prompt, SALT).at(20), ContextKeys([7] + prompt, SALT).at(21)
    s.save(seg, SALT, seg_kv(10), context=here)
    assert s.is_exact(seg, SALT, here) and not s.is_exact(seg, SALT, elsewhere)
    # stored already (from another prompt): the KV kept is not this prompt's, so no mark
    s.save(seg, SALT, seg_kv(10, seed=1), context=elsewhere)
    assert not s.is_exact(seg, SALT, elsewhere)
    # a head kept from elsewhere: not exact either
    longer = seg + [1, 2, 3, 4]
    s.save(longer, SALT, seg_kv(14), skip_tokens=8, context=elsewhere)
    assert not s.is_exact(longer, SALT, elsewhere)
    # the mark goes with the chunk it vouches for
    small = SegmentStore(tmp_path / "small", chunk_size=CHUNK, max_bytes=1)
    small.save(seg, SALT, seg_kv(10), context=here)
    assert not small.is_exact(seg, SALT, here)
    assert not list((tmp_path / "small").glob("*.ctx"))


def test_context_keys_hash_every_token_before_the_end():
    from lmi_server.kvcache.blend.segments import ContextKeys, SegmentationError

    keys = ContextKeys([1, 2, 3, 4], SALT)
    at2, at4 = keys.at(2), keys.at(4)
    assert ContextKeys([1, 2, 9, 9], SALT).at(2) == at2 != ContextKeys([1, 3, 3, 4], SALT).at(2)
    assert ContextKeys([1, 2, 3, 4], key_salt("model-b")).at(4) != at4
    assert keys.at(2) == at2  # asked again: the same
    with pytest.raises(SegmentationError, match="increasing"):
        ContextKeys([1, 2, 3], SALT).at(5)

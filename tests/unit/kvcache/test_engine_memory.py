"""The engine's default KV size on CPU hosts, from fake node / cgroup / meminfo figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmi_server.kvcache.engine_memory import (
    GIB,
    MAX_DEFAULT_BYTES,
    EngineMemoryError,
    MemoryFacts,
    plan_cpu_kv_cache,
    probe_memory,
    read_cgroup,
    read_node_meminfo,
    worker_node,
)

pytestmark = pytest.mark.unit

SMOLLM2_BPT = 23_040  # 2 x 30 layers x 3 KV heads x 64 x 2 bytes
WEIGHTS = 269 * (1 << 20)


def plan(facts: MemoryFacts, **kw):
    args = dict(weight_bytes=WEIGHTS, bytes_per_token=SMOLLM2_BPT, max_model_len=8192, max_num_seqs=128)
    args.update(kw)
    return plan_cpu_kv_cache(facts, **args)


def test_small_node_on_a_big_machine_is_the_limit():
    # The machine has 24 GiB free, but vLLM's worker binds to a node with 6.36 of 7.71 GiB free:
    # vLLM's own rule (0.92 x 7.71 GiB) would refuse to start here.
    facts = MemoryFacts(mem_available=23 * GIB, mem_total=24 * GIB, node_id=0, node_total=int(7.71 * GIB), node_available=int(6.36 * GIB))
    p = plan(facts)
    usable = int(6.36 * GIB)
    headroom = usable - WEIGHTS - max(GIB, int(0.1 * usable))
    assert p.kv_cache_bytes <= headroom // 2 and p.kv_cache_bytes > headroom // 2 - (64 << 20)
    assert p.kv_cache_bytes < 0.92 * 7.71 * GIB
    assert "NUMA node 0" in p.reasons[0] and "half the headroom" in p.reasons[2]


def test_tight_cgroup_wins_over_free_memory():
    facts = MemoryFacts(
        mem_available=100 * GIB, mem_total=128 * GIB, node_id=0, node_total=64 * GIB, node_available=60 * GIB,
        cgroup_limit=6 * GIB, cgroup_usage=1 * GIB,
    )
    assert plan(MemoryFacts(mem_available=100 * GIB, mem_total=128 * GIB)).kv_cache_bytes == MAX_DEFAULT_BYTES
    p = plan(facts)
    assert p.kv_cache_bytes <= (5 * GIB - WEIGHTS - GIB) // 2
    assert "cgroup limit 6.00 GiB" in p.reasons[0]


def test_no_numa_information_uses_meminfo():
    facts = MemoryFacts(mem_available=10 * GIB, mem_total=16 * GIB)
    p = plan(facts)
    assert p.kv_cache_bytes <= (10 * GIB - WEIGHTS - GIB) // 2
    assert "NUMA" not in p.reasons[0]


def test_big_host_is_capped_by_the_working_set_and_the_ceiling():
    facts = MemoryFacts(mem_available=1000 * GIB, mem_total=1024 * GIB, node_id=0, node_total=512 * GIB, node_available=500 * GIB)
    small = plan(facts, max_num_seqs=4, max_model_len=4096)
    assert small.kv_cache_bytes <= 4 * 4096 * SMOLLM2_BPT and "working set" in small.reasons[2]
    big = plan(facts, max_num_seqs=512)
    assert big.kv_cache_bytes == MAX_DEFAULT_BYTES


def test_lmcache_cpu_tier_is_taken_off():
    facts = MemoryFacts(mem_available=10 * GIB, mem_total=24 * GIB)
    without = plan(facts)
    with_tier = plan(facts, lmcache_cpu_bytes=4 * GIB)
    assert with_tier.kv_cache_bytes < without.kv_cache_bytes
    assert "LMCache CPU tier 4.00 GiB" in with_tier.reasons[1]


def test_too_little_memory_names_the_options():
    facts = MemoryFacts(mem_available=int(1.5 * GIB), mem_total=2 * GIB)
    with pytest.raises(EngineMemoryError) as info:
        plan(facts)
    message = str(info.value)
    assert "option.cpu_kv_cache_space" in message and "option.kv_cache_memory_bytes" in message
    assert "option.max_model_len" in message


def test_one_full_sequence_is_the_floor():
    facts = MemoryFacts(mem_available=3 * GIB, mem_total=4 * GIB)
    # 1M-token sequences of this model need 22 GiB: no default fits.
    with pytest.raises(EngineMemoryError, match="1,000,000-token sequence"):
        plan(facts, max_model_len=1_000_000)


def _node_meminfo(total_kb: int, free_kb: int, file_kb: int = 0) -> str:
    return (
        f"Node 0 MemTotal:       {total_kb} kB\nNode 0 MemFree:        {free_kb} kB\n"
        f"Node 0 Active(file):    {file_kb} kB\nNode 0 Inactive(file):  0 kB\nNode 0 SReclaimable:    0 kB\n"
    )


def test_probe_reads_node_of_first_allowed_cpu_and_cgroup(tmp_path: Path):
    nodes = tmp_path / "node"
    for n, cpus, total in ((0, "0-3", 8_000_000), (1, "4-7", 16_000_000)):
        (nodes / f"node{n}").mkdir(parents=True)
        (nodes / f"node{n}" / "cpulist").write_text(cpus + "\n")
        (nodes / f"node{n}" / "meminfo").write_text(_node_meminfo(total, total // 2, 1000))
    assert worker_node(nodes, allowed_cpus={5, 6}) == 1
    assert worker_node(nodes, allowed_cpus={2}) == 0
    assert worker_node(tmp_path / "missing", allowed_cpus={0}) is None
    assert read_node_meminfo(nodes / "node1" / "meminfo") == (16_000_000 * 1024, (8_000_000 + 1000) * 1024)

    cg = tmp_path / "cgroup"
    cg.mkdir()
    (cg / "memory.max").write_text("max\n")
    assert read_cgroup(cg) == (None, None)
    (cg / "memory.max").write_text(str(6 * GIB) + "\n")
    (cg / "memory.current").write_text(str(GIB) + "\n")
    assert read_cgroup(cg) == (6 * GIB, GIB)
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(1 << 62))
    assert read_cgroup(tmp_path / "v1") == (None, None)

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 25000000 kB\nMemFree: 1 kB\nMemAvailable: 24000000 kB\n")
    facts = probe_memory(str(meminfo), tmp_path / "missing", cg)
    assert facts.node_id is None and facts.cgroup_limit == 6 * GIB and facts.mem_available == 24_000_000 * 1024


def test_probe_of_this_machine_gives_a_plan():
    facts = probe_memory()
    assert facts.mem_available > 0
    p = plan_cpu_kv_cache(facts, weight_bytes=0, bytes_per_token=1024, max_model_len=256, max_num_seqs=1)
    assert p.kv_cache_bytes > 0

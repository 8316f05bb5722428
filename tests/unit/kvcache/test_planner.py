"""Auto plan numbers. Host figures assumed (stated, as LMI's published figures imply):

An 8-GPU-class host like AWS p5.48xlarge: 8 x H100 with 80 GiB each, 2 TiB RAM (1,900 GiB
available), NVMe with 28,000 GiB free. gpu_memory_utilization 0.9; activation memory ignored.
Qwen2.5-72B (bf16 weights, ~145.4 GB) served at TP=4 uses 320 GiB of GPU memory; Qwen2.5-1.5B
(~3.09 GB) at TP=1 uses one 80 GiB GPU. With these figures the engine's own KV cache holds
~500K tokens (72B) and ~2.59M tokens (1.5B): offloading pays from there on, as LMI published.
"""

import json
from pathlib import Path

import pytest
from tests.unit.kvcache.kv_model_configs import DEEPSEEK_V2_LITE, LLAMA31_8B, QWEN25_1_5B, QWEN25_72B

from lmi_server.kvcache.footprint import kv_footprint
from lmi_server.kvcache.host import GIB, DiskInfo, GPUInfo, HostFacts
from lmi_server.config.options import LMCacheOptions
from lmi_server.kvcache.plan import KVCacheConfigError
from lmi_server.kvcache.planner import EngineFacts, engine_kv_capacity, lmi_tier_budget, plan_auto

pytestmark = pytest.mark.unit

H100 = GPUInfo(count=8, memory_bytes_each=80 * GIB, name="H100")
RAM_AVAILABLE = 1_900 * GIB
QWEN72_WEIGHTS = 145_400_000_000
QWEN1_5_WEIGHTS = 3_090_000_000


def p5_host(weights: int | None, tp: int, disk_free: int | None = 28_000 * GIB) -> HostFacts:
    return HostFacts(
        available_ram_bytes=RAM_AVAILABLE,
        total_ram_bytes=2048 * GIB,
        gpu=H100,
        disk=DiskInfo(path=Path("/mnt/nvme/lmcache"), free_bytes=disk_free, block_size=4096) if disk_free else None,
        model_weight_bytes=weights,
        model_weight_source="test figure",
        tensor_parallel=tp,
    )


def plan(config, host, *, seqs=1, max_len=32768, **opts):
    return plan_auto(
        config, EngineFacts(max_num_seqs=seqs, max_model_len=max_len), host, LMCacheOptions(lmcache_auto_config=True, **opts),
        port=5555, metrics_port=5556, python="python", check_disk=False,
    )


def test_72b_engine_capacity_is_about_500k_tokens():
    cap = engine_kv_capacity(kv_footprint(QWEN25_72B), p5_host(QWEN72_WEIGHTS, tp=4), EngineFacts(1, 32768), 32768)
    per_gpu = int(80 * GIB * 0.9) - QWEN72_WEIGHTS // 4  # 40,959,411,328 B of KV space per GPU
    assert per_gpu == 40_959_411_328
    assert cap.tokens == int(per_gpu * 4 / 327_680) == 499_992
    assert "499,992 tokens" in cap.reason


def test_1_5b_engine_capacity_is_about_2_5m_tokens():
    cap = engine_kv_capacity(kv_footprint(QWEN25_1_5B), p5_host(QWEN1_5_WEIGHTS, tp=1), EngineFacts(1, 32768), 32768)
    assert cap.tokens == int((int(80 * GIB * 0.9) - QWEN1_5_WEIGHTS) / 28_672) == 2_588_567
    assert 2_400_000 < cap.tokens < 2_700_000


@pytest.mark.parametrize(
    ("config", "weights", "tp", "below", "above"),
    [(QWEN25_72B, QWEN72_WEIGHTS, 4, 400_000, 600_000), (QWEN25_1_5B, QWEN1_5_WEIGHTS, 1, 2_000_000, 3_000_000)],
)
def test_offloading_only_when_it_pays(config, weights, tp, below, above):
    host = p5_host(weights, tp)
    no = plan(config, host, lmcache_expected_context_tokens=below)
    assert no.mode is None and no.kv_transfer_config is None and no.server_argv is None
    assert any("no offloading" in r for r in no.reasons)
    yes = plan(config, host, lmcache_expected_context_tokens=above)
    assert yes.mode == "mp"
    assert any("offloading pays" in r for r in yes.reasons)


def test_72b_cpu_tier_numbers():
    host = p5_host(QWEN72_WEIGHTS, tp=4)
    p = plan(QWEN25_72B, host, lmcache_expected_context_tokens=600_000)
    need = 600_000 * 327_680  # 196,608,000,000 B = 183.1 GiB
    # LMI reserve: max(2 x 145.4 GB, 20 % of 1,900 GiB = 380 GiB) = 380 GiB; (1,900 - 380) / 4 = 380 GiB per rank,
    # x 4 ranks = 1,520 GiB for the one MP server. The working set needs less, so L1 = need (to 0.01 GiB).
    budget = lmi_tier_budget(RAM_AVAILABLE, QWEN72_WEIGHTS, 4, "CPU tier")
    assert budget.reserve_bytes == int(0.2 * RAM_AVAILABLE)
    assert budget.per_rank_bytes == 380 * GIB and budget.total_bytes == 1_520 * GIB
    assert p.tiers.l1_bytes <= need < p.tiers.l1_bytes + GIB // 100
    argv = p.server_argv
    assert argv[argv.index("--l1-size-gb") + 1] == "183.1"
    assert argv[argv.index("--supported-transfer-mode") + 1] == "lmcache_driven"  # CUDA host
    assert p.tiers.disk is None  # the CPU tier holds the whole working set
    assert "--l2-adapter" not in argv


def test_72b_huge_working_set_gets_a_disk_tier():
    host = p5_host(QWEN72_WEIGHTS, tp=4)
    p = plan(QWEN25_72B, host, lmcache_expected_context_tokens=10_000_000, lmcache_cache_dir=Path("/mnt/nvme/lmcache"))
    assert p.tiers.l1_bytes == 1_520 * GIB  # the whole RAM budget
    # disk: 28,000 GiB free, reserve 20 % = 5,600 GiB -> 22,400 GiB, all of it (need 10M x 327,680 B =
    # 3,051.8 GiB, but a persistent tier keeps documents of past requests too).
    assert p.tiers.disk.size_bytes == 22_400 * GIB
    spec = json.loads(p.server_argv[p.server_argv.index("--l2-adapter") + 1])
    assert spec == {"type": "fs", "base_path": "/mnt/nvme/lmcache", "use_odirect": True}


def test_disk_tier_needs_a_cache_dir_and_says_so():
    p = plan(QWEN25_72B, p5_host(QWEN72_WEIGHTS, tp=4), lmcache_expected_context_tokens=10_000_000)
    assert p.tiers.disk is None
    assert any("option.lmcache_cache_dir is not set" in r for r in p.reasons)


def test_model_reserve_dominates_on_a_small_host():
    host = HostFacts(available_ram_bytes=400 * GIB, total_ram_bytes=512 * GIB, gpu=H100, model_weight_bytes=QWEN72_WEIGHTS, tensor_parallel=4)
    b = lmi_tier_budget(host.available_ram_bytes, QWEN72_WEIGHTS, 4, "CPU tier")
    assert b.reserve_bytes == 2 * QWEN72_WEIGHTS  # 290.8 GB > 20 % of 400 GiB (85.9 GB)
    assert b.per_rank_bytes == (400 * GIB - 2 * QWEN72_WEIGHTS) // 4


def test_unknown_model_size_is_stated():
    host = p5_host(None, tp=1)
    p = plan(LLAMA31_8B, host, lmcache_expected_context_tokens=10_000_000)
    assert any("model weights: unknown" in r or "test figure" in r for r in p.reasons)
    assert any("model size unknown" in r for r in p.reasons)
    assert any("weights unknown, taken as 0" in r for r in p.reasons)


def test_llama_8b_numbers():
    host = p5_host(16_060_000_000, tp=1)
    cap = engine_kv_capacity(kv_footprint(LLAMA31_8B), host, EngineFacts(1, 131072), 131072)
    assert cap.tokens == int((int(80 * GIB * 0.9) - 16_060_000_000) / 131_072) == 467_295
    p = plan(LLAMA31_8B, host, seqs=8, max_len=131072)  # 1,048,576 tokens of working set
    assert p.mode == "mp"
    assert p.tiers.l1_bytes <= 1_048_576 * 131_072 < p.tiers.l1_bytes + GIB // 100  # 128 GiB


def test_deepseek_mla_capacity_counts_replicated_latent():
    weights = 31_400_000_000  # DeepSeek-V2-Lite bf16
    host = p5_host(weights, tp=2)
    cap = engine_kv_capacity(kv_footprint(DEEPSEEK_V2_LITE), host, EngineFacts(1, 32768), 32768)
    per_gpu = int(80 * GIB * 0.9) - weights // 2
    assert cap.tokens == int(per_gpu * 1 / 31_104)  # not x2: every rank holds the whole latent


def test_cpu_host_plan_uses_engine_driven_and_subtracts_engine_kv():
    host = HostFacts(available_ram_bytes=20 * GIB, total_ram_bytes=24 * GIB, model_weight_bytes=10_000_000, tensor_parallel=1)
    demo = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256, "dtype": "bfloat16"}
    p = plan_auto(demo, EngineFacts(4, 8192, engine_kv_cache_bytes=1 * GIB), host, LMCacheOptions(lmcache_auto_config=True, lmcache_expected_context_tokens=2_000_000),
                  port=5555, metrics_port=5556, python="python", check_disk=False)
    # 2 x 4 x 2 x 64 x 2 = 2,048 B/token; engine 1 GiB = 524,288 tokens < 2M.
    assert p.mode == "mp"
    assert p.server_argv[p.server_argv.index("--supported-transfer-mode") + 1] == "engine_driven"
    # RAM 20 GiB - 1 GiB engine KV = 19 GiB; reserve 20 % -> 15.2 GiB budget; need 2M x 2,048 B = 3.81 GiB.
    assert p.tiers.l1_bytes == 381 * GIB // 100
    assert p.env["PYTHONHASHSEED"] == "0" and p.env["LMCACHE_TRACK_USAGE"] == "false"
    out = json.loads(p.to_json())
    assert out["mode"] == "mp" and out["reasons"]
    # no /dev/shm size known: pickled hits, RPC timeout for 8,192 x 2,048 B = 16.8 MB -> the 2 s floor
    assert not p.tiers.shm and any("--shm-size" in w for w in p.warnings)
    assert p.kv_transfer_config["kv_connector_extra_config"]["lmcache.mp.mq_timeout"] == 2.0


def test_cpu_host_plan_puts_the_tier_in_dev_shm_when_it_fits():
    demo = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256, "dtype": "bfloat16"}
    for shm_free, expected in ((8 * GIB, True), (GIB, False)):
        host = HostFacts(available_ram_bytes=20 * GIB, total_ram_bytes=24 * GIB, model_weight_bytes=10_000_000, shm_free_bytes=shm_free)
        p = plan_auto(demo, EngineFacts(4, 8192, engine_kv_cache_bytes=1 * GIB), host,
                      LMCacheOptions(lmcache_auto_config=True, lmcache_expected_context_tokens=2_000_000),
                      port=5555, metrics_port=5556, python="python", check_disk=False)
        assert p.tiers.shm is expected  # the tier is 3.81 GiB
        assert ("--shm-name" in p.server_argv) is expected
        assert p.kv_transfer_config["kv_connector"] == "GuardedLMCacheMPConnector"


def test_inprocess_on_cpu_host_is_an_error():
    host = HostFacts(available_ram_bytes=20 * GIB, total_ram_bytes=24 * GIB)
    with pytest.raises(KVCacheConfigError, match="needs a GPU"):
        plan(LLAMA31_8B, host, lmcache_mode="inprocess")


def test_inprocess_on_gpu_gives_lmi_connector_and_per_rank_env():
    p = plan(QWEN25_72B, p5_host(QWEN72_WEIGHTS, tp=4), lmcache_mode="inprocess", lmcache_expected_context_tokens=10_000_000)
    assert p.mode == "inprocess" and p.server_argv is None
    assert p.kv_transfer_config == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}
    assert p.env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "380"  # per rank, as LMI
    assert p.env["LMCACHE_CHUNK_SIZE"] == "256"


def test_size_overrides_force_a_plan():
    p = plan(QWEN25_1_5B, p5_host(QWEN1_5_WEIGHTS, tp=1), lmcache_expected_context_tokens=1000, lmcache_cpu_size_gb=8)
    assert p.mode == "mp" and p.tiers.l1_bytes == 8 * GIB


def test_a_cache_dir_gives_a_persistent_disk_tier_even_when_the_working_set_fits():
    host = p5_host(QWEN1_5_WEIGHTS, tp=1)
    without = plan(QWEN25_1_5B, host, lmcache_expected_context_tokens=100_000)
    assert without.mode is None
    p = plan(QWEN25_1_5B, host, lmcache_expected_context_tokens=100_000, lmcache_cache_dir=Path("/mnt/nvme/lmcache"))
    assert p.mode == "mp" and p.tiers.disk is not None and p.tiers.disk.path == Path("/mnt/nvme/lmcache")
    assert p.tiers.disk.size_bytes > 0
    assert any("offloading for persistence" in r for r in p.reasons)
    assert any("survives restarts" in r for r in p.reasons)


def test_cpu_plan_takes_chunks_of_128_tokens_in_whole_blocks_and_gpu_or_blend_keeps_256():
    """On a CPU host a hit's uncached tail (up to one chunk) is most of its time: the auto plan takes
    128-token chunks there (whole engine blocks); GPU hosts and blending keep LMCache's 256."""
    demo = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256, "dtype": "bfloat16"}
    cpu = HostFacts(available_ram_bytes=20 * GIB, total_ram_bytes=24 * GIB, model_weight_bytes=10_000_000)

    def chunk(host, **engine):
        p = plan_auto(demo, EngineFacts(4, 8192, engine_kv_cache_bytes=1 * GIB, **engine), host,
                      LMCacheOptions(lmcache_auto_config=True, lmcache_expected_context_tokens=2_000_000),
                      port=5555, metrics_port=5556, python="python", check_disk=False)
        assert p.server_argv[p.server_argv.index("--chunk-size") + 1] == str(p.tiers.chunk_size)
        return p.tiers.chunk_size, p.reasons

    size, reasons = chunk(cpu, block_size=128)
    assert size == 128 and any("chunk size 128 tokens on a CPU host" in r for r in reasons)
    assert chunk(cpu, block_size=16)[0] == 128
    assert chunk(cpu, block_size=256)[0] == 256  # never less than one block
    assert chunk(cpu, block_size=128, blend=True)[0] == 256
    assert plan(QWEN25_1_5B, p5_host(QWEN1_5_WEIGHTS, tp=1), lmcache_expected_context_tokens=10_000_000).tiers.chunk_size == 256

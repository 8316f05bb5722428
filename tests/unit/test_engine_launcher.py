"""The fork-server launch of engine cores is used only where vLLM's own launch loses nothing by it."""

from types import SimpleNamespace

from lmi_server import engine_launcher


def config(device="cpu", dp=1, numa=False, connector=None):
    return SimpleNamespace(
        device_config=SimpleNamespace(device_type=device),
        parallel_config=SimpleNamespace(data_parallel_size=dp, numa_bind=numa),
        kv_transfer_config=SimpleNamespace(kv_connector_module_path=connector) if connector else None,
    )


def test_only_a_single_cpu_engine_without_numa_binding_qualifies():
    assert engine_launcher.not_applicable(config()) is None
    assert engine_launcher.not_applicable(config(device="cuda")) == "not a CPU engine"
    assert engine_launcher.not_applicable(config(dp=2)) == "data parallelism"
    assert engine_launcher.not_applicable(config(numa=True)) == "NUMA binding"


def test_a_gpu_engine_keeps_vllms_launch():
    assert engine_launcher.install(config(device="cuda")) is False


def test_the_kv_connector_module_is_preloaded_too():
    mods = engine_launcher.preload_modules(config(connector="lmcache.integration.vllm.lmcache_mp_connector"))
    assert mods[-1] == "lmcache.integration.vllm.lmcache_mp_connector"
    assert "vllm.v1.engine.core" in mods

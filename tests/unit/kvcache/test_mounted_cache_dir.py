"""The auto plan takes the conventional mounted cache directory (the chart's kvCache volume), and
every MP plan names its KV namespace."""

from __future__ import annotations

import json

from lmi_server.config.schema import build_serving_config
from lmi_server.kvcache import host
from lmi_server.kvcache.namespace import EXTRA_CONFIG_KEY
from lmi_server.runtime import resolve_runtime

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 2048, "torch_dtype": "float32",
    "vocab_size": 128, "intermediate_size": 128,
}
AUTO = {"option.lmcache_auto_config": "true", "option.max_model_len": "1024", "option.max_rolling_batch_size": "1",
        "option.cpu_kv_cache_space": "1", "option.lmcache_cpu_size_gb": "0.25"}


def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return d


def test_mounted_cache_dir_only_when_it_exists(tmp_path):
    assert host.mounted_cache_dir(tmp_path) == tmp_path
    assert host.mounted_cache_dir(tmp_path / "absent") is None
    assert not (tmp_path / "absent").exists()  # never created


def test_auto_plan_uses_the_mounted_volume_and_says_why(tmp_path, monkeypatch):
    volume = tmp_path / "kvcache"
    volume.mkdir()
    monkeypatch.setattr(host, "MOUNTED_CACHE_DIR", volume)
    plan = resolve_runtime(build_serving_config(AUTO, model_dir(tmp_path)), build_demo=False).kv_plan
    assert plan.mode == "mp" and plan.tiers.disk is not None and plan.tiers.disk.path == volume
    assert any("conventional path" in r and str(volume) in r for r in plan.reasons)
    spec = json.loads(plan.server_argv[plan.server_argv.index("--l2-adapter") + 1])
    assert spec["type"] == "fs" and spec["base_path"] == str(volume)


def test_auto_plan_without_the_volume_has_no_disk_tier(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "MOUNTED_CACHE_DIR", tmp_path / "absent")
    plan = resolve_runtime(build_serving_config(AUTO, model_dir(tmp_path)), build_demo=False).kv_plan
    assert plan.tiers is None or plan.tiers.disk is None


def test_mp_plan_names_its_namespace_from_model_and_dtype(tmp_path):
    d = model_dir(tmp_path)
    (d / "lmcache.yaml").write_text("chunk_size: 256\nmax_local_cpu_size: 1\n")
    props = {"option.lmcache_config_file": "lmcache.yaml", "option.max_model_len": "1024"}
    f32 = resolve_runtime(build_serving_config({**props, "option.dtype": "fp32"}, d), build_demo=False).kv_plan
    bf16 = resolve_runtime(build_serving_config({**props, "option.dtype": "bf16"}, d), build_demo=False).kv_plan
    ns32 = f32.kv_transfer_config["kv_connector_extra_config"][EXTRA_CONFIG_KEY]
    ns16 = bf16.kv_transfer_config["kv_connector_extra_config"][EXTRA_CONFIG_KEY]
    assert ns32.startswith("model-") and ns16.startswith("model-") and ns32 != ns16
    assert any(ns32 in r and "namespace" in r for r in f32.reasons)

"""On SageMaker (recognised by its environment), caches default to /tmp, the instance's NVMe
volume: downloads, Hugging Face's and the compile caches, and the auto plan's LMCache disk tier
(/tmp/lmcache, O_DIRECT where a real probe says the filesystem takes it), with the reason in the
plan; a variable the user set wins; the model directory is left as it was. Elsewhere nothing moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmi_server import engine, sagemaker_caches
from lmi_server.config.schema import build_serving_config
from lmi_server.kvcache import host
from lmi_server.runtime import resolve_runtime
from lmi_server.sagemaker_env import on_sagemaker, why
from tests.unit.kvcache.test_mounted_cache_dir import AUTO, model_dir

SM = {"SAGEMAKER_SAFE_PORT_RANGE": "10000-10999"}


@pytest.mark.parametrize("env, expected", [
    ({}, False),
    ({"SM_NUM_GPUS": "1"}, False),  # LMI users set it anywhere
    ({"SAGEMAKER_SAFE_PORT_RANGE": "10000-10999"}, True),
    ({"SAGEMAKER_BIND_TO_PORT": "8081"}, True),
    ({"SAGEMAKER_CONTAINER_LOG_LEVEL": "20"}, True),  # the SageMaker Python SDK
    ({"SAGEMAKER_REGION": "us-west-2"}, True),
    ({"SAGEMAKER_REGION": ""}, False),
    ({"LMI_ON_SAGEMAKER": "true"}, True),
    ({"SAGEMAKER_BIND_TO_PORT": "8081", "LMI_ON_SAGEMAKER": "false"}, False),
])
def test_sagemaker_is_recognised_by_its_environment(env, expected):
    assert on_sagemaker(env) is expected
    if expected:
        assert why(env) != "not SageMaker"


def test_caches_move_to_tmp_on_sagemaker_only(tmp_path):
    assert sagemaker_caches.cache_environment({}, root=tmp_path) == {}
    chosen = sagemaker_caches.cache_environment(dict(SM), root=tmp_path)
    assert set(chosen) >= {"HF_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"}
    assert all(v.startswith("/tmp/") for v in chosen.values())
    assert chosen["HF_HOME"] == "/tmp/.cache/huggingface"  # LMI's images' value


def test_a_variable_the_user_set_wins(tmp_path):
    env = {**SM, "HF_HOME": "/data/hf"}
    set_now = sagemaker_caches.apply(env, root=tmp_path)
    assert "HF_HOME" not in set_now and env["HF_HOME"] == "/data/hf"
    assert env["VLLM_CACHE_ROOT"] == "/tmp/.cache/vllm"


def test_nothing_moves_when_tmp_is_not_writable(tmp_path):
    assert sagemaker_caches.cache_environment(dict(SM), root=tmp_path / "absent") == {}
    assert sagemaker_caches.kv_cache_dir(dict(SM), root=tmp_path / "absent") is None


def test_downloads_go_to_tmp_on_sagemaker(tmp_path, monkeypatch):
    from lmi_server.model_source import cache_root

    monkeypatch.delenv("SERVING_DOWNLOAD_DIR", raising=False)
    monkeypatch.setenv("LMI_SERVER_CACHE", str(tmp_path / "image-cache"))
    monkeypatch.delenv("LMI_ON_SAGEMAKER", raising=False)
    for name in ("SAGEMAKER_CONTAINER_LOG_LEVEL", "SAGEMAKER_REGION", "SAGEMAKER_SAFE_PORT_RANGE", "SAGEMAKER_BIND_TO_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert cache_root() == tmp_path / "image-cache" / "download"
    monkeypatch.setenv("SAGEMAKER_REGION", "us-west-2")
    assert cache_root() == sagemaker_caches.DOWNLOAD_DIR == Path("/tmp/lmi_server/download")
    monkeypatch.setenv("SERVING_DOWNLOAD_DIR", str(tmp_path / "mine"))  # LMI's variable wins
    assert cache_root() == tmp_path / "mine"


def test_engine_environment_carries_the_cache_defaults(monkeypatch, tmp_path):
    for key in sagemaker_caches.CACHE_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SAGEMAKER_REGION", "us-west-2")
    cfg = build_serving_config({}, model_dir(tmp_path))
    env = engine.engine_environment(cfg, gpus=0)
    assert env["TRITON_CACHE_DIR"] == "/tmp/.cache/triton" and env["VLLM_CACHE_ROOT"] == "/tmp/.cache/vllm"


def _snapshot(path):
    return sorted((str(p.relative_to(path)), p.stat().st_mtime_ns) for p in path.rglob("*"))


def test_auto_plan_takes_tmp_lmcache_on_sagemaker_and_says_why(tmp_path, monkeypatch):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    monkeypatch.setattr(host, "MOUNTED_CACHE_DIR", tmp_path / "absent")
    monkeypatch.setattr(sagemaker_caches, "NVME_ROOT", nvme)
    monkeypatch.setenv("SAGEMAKER_CONTAINER_LOG_LEVEL", "20")
    monkeypatch.delenv("SAGEMAKER_SAFE_PORT_RANGE", raising=False)
    model = model_dir(tmp_path)
    before = _snapshot(model)
    plan = resolve_runtime(build_serving_config(AUTO, model), build_demo=False).kv_plan
    disk = plan.tiers.disk
    assert disk is not None and disk.path == nvme / "lmcache"
    assert disk.odirect == host.odirect_supported(nvme / "lmcache")  # what a real open(O_DIRECT) said
    why_line = next(r for r in plan.reasons if str(nvme / "lmcache") in r and "SageMaker" in r)
    assert "NVMe" in why_line and "SAGEMAKER_CONTAINER_LOG_LEVEL" in why_line
    assert _snapshot(model) == before  # the model directory (read-only on SageMaker) is untouched


def test_auto_plan_elsewhere_keeps_no_disk_tier(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "MOUNTED_CACHE_DIR", tmp_path / "absent")
    monkeypatch.setattr(sagemaker_caches, "NVME_ROOT", tmp_path)
    for name in ("SAGEMAKER_CONTAINER_LOG_LEVEL", "SAGEMAKER_REGION", "SAGEMAKER_SAFE_PORT_RANGE",
                 "SAGEMAKER_BIND_TO_PORT", "LMI_ON_SAGEMAKER"):
        monkeypatch.delenv(name, raising=False)
    plan = resolve_runtime(build_serving_config(AUTO, model_dir(tmp_path)), build_demo=False).kv_plan
    assert plan.tiers is None or plan.tiers.disk is None
    assert not (tmp_path / "lmcache").exists()


def test_an_explicit_cache_dir_wins_on_sagemaker(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setattr(host, "MOUNTED_CACHE_DIR", tmp_path / "absent")
    monkeypatch.setattr(sagemaker_caches, "NVME_ROOT", tmp_path / "nvme-unused")
    monkeypatch.setenv("LMI_ON_SAGEMAKER", "true")
    props = {**AUTO, "option.lmcache_cache_dir": str(mine)}
    plan = resolve_runtime(build_serving_config(props, model_dir(tmp_path)), build_demo=False).kv_plan
    assert plan.tiers.disk.path == mine and not (tmp_path / "nvme-unused").exists()

"""The KV namespace covers every setting that changes the bytes of a stored chunk (online
quantization, config overrides such as RoPE scaling, a hub model's commit, a speculative draft's
layers, ...): a change of one is another namespace, so no chunk is read across it; the same
setting written differently is the same namespace; and a server that sets none of them keeps the
namespace it had before they were counted."""

from __future__ import annotations

import json
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub import constants as hf_constants

from lmi_server.config.schema import build_serving_config
from lmi_server.kvcache.namespace import EXTRA_CONFIG_KEY, KV_SETTINGS, KVIdentity, kv_settings
from lmi_server.runtime import resolve_runtime

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 2048, "torch_dtype": "float32",
    "vocab_size": 128, "intermediate_size": 128,
}
HUB = "org/some-model"
SHA_A, SHA_B = "a" * 40, "b" * 40


def model_dir(tmp_path, name="model", config=TINY, weights=b"w" * 64):
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    (d / "model.safetensors").write_bytes(weights)
    (d / "lmcache.yaml").write_text("chunk_size: 256\nmax_local_cpu_size: 1\n")
    return d


def runtime(d, serving=False, **props):
    base = {"option.lmcache_config_file": str(d / "lmcache.yaml"), "option.max_model_len": "1024"}
    return resolve_runtime(build_serving_config({**base, **props}, d), build_demo=serving)


def namespace(d, serving=False, **props):
    plan = runtime(d, serving, **props).kv_plan
    assert plan.mode == "mp"
    return plan.kv_transfer_config["kv_connector_extra_config"][EXTRA_CONFIG_KEY]


def opts(**kw):
    return {f"option.{k}": v for k, v in kw.items()}


# ------------------------------------------------------------------ stable where nothing is set


def test_a_server_without_these_settings_keeps_its_namespace():
    """The digest of an identity without settings is the one computed before settings were counted
    (value taken from that code), so existing deployments keep their stored KV."""
    facts = dict(model="hub:org/some-model@main", model_name="some-model", dtype="bfloat16", kv_cache_dtype="auto",
                 chunk_size=256, tensor_parallel=1, pipeline_parallel=1, platform="cuda",
                 lmcache_version="0.5.6", vllm_version="0.32.0")
    assert KVIdentity(**facts).namespace() == "some-model-31b39ecca247484621dd"
    assert KVIdentity(**facts, settings=(("quantization", '"fp8"'),)).namespace() != "some-model-31b39ecca247484621dd"


@pytest.mark.parametrize("default", [
    {"hf_overrides": {}}, {"quantization": None}, {"disable_sliding_window": False}, {"mamba_cache_dtype": "auto"},
    {"kv_cache_dtype_skip_layers": []}, {"load_format": "auto"}, {"speculative_config": {"method": "ngram"}},
])
def test_a_setting_at_its_default_is_not_counted(default):
    assert kv_settings(default) == ()


# ------------------------------------------------------------------ one test per setting


def test_quantization_changes_the_namespace(tmp_path):
    d = model_dir(tmp_path)
    plain, fp8 = namespace(d), namespace(d, **opts(quantization="fp8"))
    assert plain != fp8 != namespace(d, **opts(quantization="bitsandbytes"))
    # LMI's name for it, and another spelling of the method: the same quantization, the same KV
    assert namespace(d, **opts(quantize="fp8")) == fp8 == namespace(d, **opts(quantization=" FP8 "))


def test_hf_overrides_change_the_namespace_in_any_key_order(tmp_path):
    d = model_dir(tmp_path)
    one = namespace(d, **opts(hf_overrides='{"num_hidden_layers": 1, "attention": {"bias": true, "heads": 4}}'))
    reordered = namespace(d, **opts(hf_overrides='{"attention": {"heads": 4, "bias": true}, "num_hidden_layers": 1}'))
    assert one == reordered
    assert one != namespace(d) and one != namespace(d, **opts(hf_overrides='{"num_hidden_layers": 2}'))
    assert namespace(d, **opts(hf_overrides="{}")) == namespace(d)


def test_rope_scaling_override_changes_the_namespace(tmp_path):
    """RoPE scaling reaches vLLM through hf_overrides (vLLM 0.32 has no rope_scaling argument)."""
    d = model_dir(tmp_path)
    yarn = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}}
    factor_4 = namespace(d, **opts(hf_overrides=json.dumps(yarn)))
    same = {"rope_scaling": {"original_max_position_embeddings": 2048, "factor": 4, "rope_type": "yarn"}}
    assert factor_4 == namespace(d, **opts(hf_overrides=json.dumps(same)))
    factor_2 = {"rope_scaling": {**yarn["rope_scaling"], "factor": 2.0}}
    assert len({namespace(d), factor_4, namespace(d, **opts(hf_overrides=json.dumps(factor_2)))}) == 3


def test_rope_theta_override_changes_the_namespace(tmp_path):
    d = model_dir(tmp_path)
    million = namespace(d, **opts(hf_overrides='{"rope_theta": 1000000}'))
    assert million == namespace(d, **opts(hf_overrides='{"rope_theta": 1e6}'))
    assert len({namespace(d), million, namespace(d, **opts(hf_overrides='{"rope_theta": 500000}'))}) == 3


@pytest.mark.parametrize("setting", [
    {"quantization_config": '{"activation_scheme": "dynamic"}'}, {"hf_config_path": "org/other-config"},
    {"code_revision": "v2"}, {"load_format": "dummy"}, {"kv_cache_dtype_skip_layers": '["0"]'},
    {"disable_sliding_window": "true"}, {"mamba_cache_dtype": "float16"}, {"mamba_ssm_cache_dtype": "float32"},
    {"mm_processor_kwargs": '{"max_pixels": 200704}'}, {"media_io_kwargs": '{"video": {"num_frames": 8}}'},
])
def test_every_other_kv_setting_changes_the_namespace(tmp_path, setting):
    assert set(setting) <= set(KV_SETTINGS)
    d = model_dir(tmp_path)
    assert namespace(d, **opts(**setting)) != namespace(d)


def test_a_speculative_draft_with_kv_layers_changes_the_namespace(tmp_path):
    """vLLM registers an EAGLE head's attention layers with the KV connector: they are in every
    chunk, so another draft (or none) is another namespace; n-gram lookup has no layers."""
    d = model_dir(tmp_path)
    draft = model_dir(tmp_path, "draft")
    other = model_dir(tmp_path / "o", "draft", weights=b"v" * 64)
    eagle = {"method": "eagle", "num_speculative_tokens": 2}
    with_draft = kv_settings({"speculative_config": {**eagle, "model": str(draft)}})
    assert with_draft and with_draft != kv_settings({"speculative_config": {**eagle, "model": str(other)}})
    assert kv_settings({"speculative_config": {**eagle, "model": str(draft), "num_speculative_tokens": 5}}) == with_draft
    ngram = namespace(d, **opts(speculative_method="ngram"))
    assert ngram == namespace(d)


# ------------------------------------------------------------------ a hub model: its commit


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache; the hub answers nothing unless a test says so."""
    cache = tmp_path / "hf"
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("VLLM_USE_MODELSCOPE", raising=False)

    def unreachable(*args, **kwargs):
        raise AssertionError("the hub is not asked here")

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", unreachable)
    return cache


def cache_ref(cache, revision, sha):
    ref = cache / "models--org--some-model" / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(sha)


def test_a_hub_model_is_keyed_by_the_commit_of_its_revision(tmp_path, hf_cache):
    d = model_dir(tmp_path)
    cache_ref(hf_cache, "main", SHA_A)
    run = runtime(d, **opts(model_id=HUB))
    assert run.engine_args["revision"] == SHA_A  # the engine loads the commit the keys name
    at_a = run.kv_plan.kv_transfer_config["kv_connector_extra_config"][EXTRA_CONFIG_KEY]
    assert any(f"revision main is commit {SHA_A}" in r for r in run.kv_plan.reasons)
    assert at_a == namespace(d, **opts(model_id=HUB, revision="main")) == namespace(d, **opts(model_id=HUB, revision=SHA_A))
    cache_ref(hf_cache, "main", SHA_B)  # main moved: other weights, another namespace
    assert namespace(d, **opts(model_id=HUB)) != at_a


def test_serving_asks_the_hub_for_the_commit(tmp_path, hf_cache, monkeypatch):
    d = model_dir(tmp_path)
    asked = []

    def repo_info(self, repo_id, *, revision=None, **kwargs):
        asked.append((repo_id, revision))
        return SimpleNamespace(sha=SHA_B)

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", repo_info)
    cache_ref(hf_cache, "v1", SHA_A)  # what an earlier download saw: the hub's answer wins
    run = runtime(d, serving=True, **opts(model_id=HUB, revision="v1"))
    assert asked == [(HUB, "v1")] and run.engine_args["revision"] == SHA_B
    assert (hf_cache / "models--org--some-model" / "refs" / "v1").read_text() == SHA_B


def test_an_unresolved_hub_revision_keys_the_revision_as_before(tmp_path, hf_cache):
    d = model_dir(tmp_path)
    run = runtime(d, **opts(model_id=HUB))
    assert "revision" not in run.engine_args
    assert any("revision main not resolved" in r for r in run.kv_plan.reasons)
    cache_ref(hf_cache, "main", SHA_A)
    assert namespace(d, **opts(model_id=HUB)) != run.kv_plan.kv_transfer_config["kv_connector_extra_config"][EXTRA_CONFIG_KEY]

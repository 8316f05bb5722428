"""Blend settings from the option keys and the LMCache file, the plan `lmi-server config` shows,
what it hands the engine's connector, and the combinations it refuses."""

from __future__ import annotations

import json

import pytest

from lmi_server import cli
from lmi_server.config.options import LMCacheOptions
from lmi_server.config.schema import ConfigError, build_serving_config
from lmi_server.kvcache.blend.settings import EXTRA_CONFIG_KEY, BlendConfig, resolve_blend_settings
from lmi_server.kvcache.lmcache_file import parse_lmcache_config
from lmi_server.kvcache.plan import KVCacheConfigError
from lmi_server.runtime import resolve_runtime
from tests.unit.kvcache.blend import model_configs as models

TINY_LLAMA = {
    **models.SMOLLM2_135M, "hidden_size": 64, "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "max_position_embeddings": 2048, "torch_dtype": "float32", "vocab_size": 128,
    "intermediate_size": 128,
}
LMCACHE_YAML = "chunk_size: 256\nmax_local_cpu_size: 1\n"


def model_dir(tmp_path, config=TINY_LLAMA, lmcache_yaml=LMCACHE_YAML):
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "lmcache.yaml").write_text(lmcache_yaml)
    return tmp_path


def test_off_by_default_with_lmcaches_defaults():
    s = resolve_blend_settings(LMCacheOptions())
    assert (s.enabled, s.separator, s.recompute_ratio) == (False, " # # ", 0.15)
    assert set(s.sources.values()) == {"default"}


def test_option_keys_and_file_keys_both_switch_it_on():
    s = resolve_blend_settings(LMCacheOptions.model_validate({"lmcache_blend": "true", "lmcache_blend_recompute_ratio": "0.3"}))
    assert s.enabled and s.recompute_ratio == 0.3 and s.sources["recompute_ratio"] == "option.lmcache_blend_recompute_ratio"
    f = parse_lmcache_config({"enable_blending": True, "blend_special_str": " ## ", "blend_recompute_ratios": [0.2]})
    s = resolve_blend_settings(LMCacheOptions(), f)
    assert (s.enabled, s.separator, s.recompute_ratio) == (True, " ## ", 0.2)
    assert s.sources["enabled"] == "LMCache file `enable_blending`"
    # the same value in both places is fine; different values are an error naming both keys
    resolve_blend_settings(LMCacheOptions.model_validate({"lmcache_blend_separator": " ## "}), f)
    with pytest.raises(KVCacheConfigError, match="lmcache_blend_separator.*blend_special_str"):
        resolve_blend_settings(LMCacheOptions.model_validate({"lmcache_blend_separator": " # # "}), f)


@pytest.mark.parametrize(
    "data,words",
    [({"blend_recompute_ratios": [0.1, 0.2]}, "one ratio"), ({"blend_recompute_ratios": [1.5]}, r"\[0, 1\]"),
     ({"blend_special_str": ""}, "blend_special_str"), ({"blend_check_layers": [1]}, "does not support")],
)
def test_bad_file_blend_keys_are_errors(data, words):
    with pytest.raises(KVCacheConfigError, match=words):
        parse_lmcache_config(data)


@pytest.mark.parametrize(
    "props,words",
    [({"option.lmcache_blend_recompute_ratio": "1.2"}, "lmcache_blend_recompute_ratio"),
     ({"option.lmcache_blend_separator": ""}, "lmcache_blend_separator"),
     ({"option.lmcache_blend": "maybe"}, "lmcache_blend"),
     ({"option.lmcache_blnd": "true"}, "did you mean option.lmcache_blend")],
)
def test_bad_option_values_are_start_up_errors(tmp_path, props, words):
    with pytest.raises(ConfigError, match=words):
        build_serving_config(props, model_dir(tmp_path))


def test_config_shows_the_blend_plan(tmp_path):
    props = {"option.lmcache_config_file": "lmcache.yaml", "option.lmcache_blend": "true", "option.max_model_len": "1024"}
    runtime = resolve_runtime(build_serving_config(props, model_dir(tmp_path)), build_demo=False)
    blend = runtime.describe()["lmcache_blend"]
    assert blend["enabled"] and blend["separator"] == " # # " and blend["recompute_ratio"] == 0.15
    assert blend["chunk_size"] == 256 and blend["check_layer"] == 1
    assert any("LlamaForCausalLM" in r for r in blend["reasons"])
    assert blend["min_reused_tokens"] == 256 and blend["store_max_bytes"] == 2 * 2**30
    # the engine's connector gets the same settings; vLLM's own prefix caching stays as configured
    extra = runtime.engine_args["kv_transfer_config"]["kv_connector_extra_config"]
    config = BlendConfig.from_extra_config(extra)
    assert (config.separator, config.recompute_ratio, config.chunk_size) == (" # # ", 0.15, 256)
    assert config.store_dir == blend["store_dir"] and config.model_identity.startswith(str(tmp_path))
    assert "enable_prefix_caching" not in runtime.engine_args  # vLLM's default: on (a blend keeps its hit)
    json.dumps(runtime.describe(), default=str)
    off = resolve_runtime(build_serving_config({"option.lmcache_config_file": "lmcache.yaml"}, tmp_path), build_demo=False)
    assert off.describe()["lmcache_blend"] is None
    assert EXTRA_CONFIG_KEY not in off.engine_args["kv_transfer_config"]["kv_connector_extra_config"]
    assert "enable_prefix_caching" not in off.engine_args


def test_the_file_alone_switches_the_plan_on(tmp_path):
    d = model_dir(tmp_path, lmcache_yaml=LMCACHE_YAML + "enable_blending: true\nblend_recompute_ratios: [0.25]\n")
    runtime = resolve_runtime(build_serving_config({"option.lmcache_config_file": "lmcache.yaml"}, d), build_demo=False)
    assert runtime.blend["enabled"] and runtime.blend["recompute_ratio"] == 0.25


@pytest.mark.parametrize(
    "config,props,words",
    [
        (TINY_LLAMA, {}, "needs LMCache"),
        ({**TINY_LLAMA, "architectures": ["MistralForCausalLM"]}, {"option.lmcache_config_file": "lmcache.yaml"},
         "MistralForCausalLM is not supported"),
        ({**TINY_LLAMA, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
         {"option.lmcache_config_file": "lmcache.yaml"}, "'yarn'"),
    ],
)
def test_what_blending_cannot_handle_is_a_config_error(tmp_path, config, props, words):
    cfg = build_serving_config({**props, "option.lmcache_blend": "true", "option.max_model_len": "1024"}, model_dir(tmp_path, config))
    with pytest.raises(ConfigError, match=words):
        resolve_runtime(cfg, build_demo=False)


@pytest.mark.parametrize(
    "props,words",
    [({"option.speculative_config": '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'},
      "speculative decoding")],
)
def test_blending_refuses_what_it_cannot_serve_beside(tmp_path, props, words):
    props = {"option.lmcache_config_file": "lmcache.yaml", "option.lmcache_blend": "true",
             "option.max_model_len": "1024", **props}
    with pytest.raises(ConfigError, match=words):
        resolve_runtime(build_serving_config(props, model_dir(tmp_path)), build_demo=False)


def test_a_quoted_separator_keeps_its_spaces_through_serving_properties(tmp_path):
    from lmi_server.config.properties import parse_properties

    props = parse_properties('option.lmcache_blend_separator=" # # "\n')
    cfg = build_serving_config(props, model_dir(tmp_path))
    assert cfg.lmcache.lmcache_blend_separator == " # # "
    assert build_serving_config({"option.lmcache_blend_separator": "##"}, tmp_path).lmcache.lmcache_blend_separator == "##"
    with pytest.raises(ConfigError, match="JSON string"):
        build_serving_config({"option.lmcache_blend_separator": '"\\x"'}, tmp_path)


@pytest.mark.parametrize("value, words", [
    ([4, 4], "strictly increasing"),
    ([-1, 3], "token offset"),
    ([1.5], "token offset"),
    ([True], "token offset"),
    ("0,5", "list"),
    (list(range(2000)), "at most"),
])
def test_bad_request_boundaries_name_the_field(value, words):
    from lmi_server.kvcache.blend.settings import request_boundaries

    with pytest.raises(ValueError, match=words) as err:
        request_boundaries({"lmi_blend_boundaries": value})
    assert "kv_transfer_params.lmi_blend_boundaries" in str(err.value)


def test_request_boundaries_are_checked_against_the_prompt():
    from lmi_server.kvcache.blend.settings import prompt_boundaries, request_boundaries

    assert request_boundaries(None) is None and request_boundaries({"other": 1}) is None
    assert prompt_boundaries({"lmi_blend_boundaries": [0, 3, 9]}, 9) == (0, 3, 9)
    with pytest.raises(ValueError, match="past the prompt's 9 tokens"):
        prompt_boundaries({"lmi_blend_boundaries": [3, 10]}, 9)


@pytest.mark.parametrize(
    "props,words",
    [({"option.lmcache_blend_mode": "lego"}, "lmcache_blend_mode"),
     ({"option.lmcache_blend_epic_tokens": "-1"}, "lmcache_blend_epic_tokens"),
     ({"option.lmcache_blend_epic_tokens": "many"}, "lmcache_blend_epic_tokens")],
)
def test_bad_blend_modes_are_start_up_errors_naming_the_key(tmp_path, props, words):
    with pytest.raises(ConfigError, match=words):
        build_serving_config({"option.lmcache_blend": "true", **props}, model_dir(tmp_path))


def test_the_epic_mode_reaches_the_connector_and_the_plan(tmp_path):
    props = {"option.lmcache_config_file": "lmcache.yaml", "option.lmcache_blend": "true", "option.max_model_len": "1024",
             "option.lmcache_blend_mode": "epic", "option.lmcache_blend_epic_tokens": "16"}
    runtime = resolve_runtime(build_serving_config(props, model_dir(tmp_path)), build_demo=False)
    blend = runtime.describe()["lmcache_blend"]
    assert (blend["mode"], blend["epic_tokens"]) == ("epic", 16)
    assert blend["sources"]["mode"] == "option.lmcache_blend_mode"
    assert any("first 16 tokens of each run" in r for r in blend["reasons"])
    config = BlendConfig.from_extra_config(runtime.engine_args["kv_transfer_config"]["kv_connector_extra_config"])
    assert (config.mode, config.epic_tokens) == ("epic", 16)
    default = resolve_blend_settings(LMCacheOptions())
    assert (default.mode, default.epic_tokens, default.sources["mode"]) == ("guided", 32, "default")


def test_the_default_guided_and_the_cacheblend_modes_say_what_they_recompute(tmp_path):
    base = {"option.lmcache_config_file": "lmcache.yaml", "option.lmcache_blend": "true", "option.max_model_len": "1024"}
    for extra, mode, words in (({}, "guided", "the question attends to most"),
                               ({"option.lmcache_blend_mode": "cacheblend"}, "cacheblend", "most deviating KV at layer 1")):
        runtime = resolve_runtime(build_serving_config({**base, **extra}, model_dir(tmp_path)), build_demo=False)
        blend = runtime.describe()["lmcache_blend"]
        assert blend["mode"] == mode and any(words in r for r in blend["reasons"]), blend["reasons"]
        config = BlendConfig.from_extra_config(runtime.engine_args["kv_transfer_config"]["kv_connector_extra_config"])
        assert config.mode == mode


@pytest.mark.parametrize(
    "params,words",
    [({"lmi_blend_mode": "fast"}, "kv_transfer_params.lmi_blend_mode"),
     ({"lmi_blend_epic_tokens": -3}, "kv_transfer_params.lmi_blend_epic_tokens"),
     ({"lmi_blend_epic_tokens": 2.5}, "kv_transfer_params.lmi_blend_epic_tokens")],
)
def test_bad_request_modes_name_the_field(params, words):
    from lmi_server.kvcache.blend.settings import request_mode

    with pytest.raises(ValueError, match=words):
        request_mode(params, "cacheblend", 32)


def test_a_request_may_name_its_own_mode():
    from lmi_server.kvcache.blend.settings import names_own_blend, request_mode

    assert request_mode(None, "cacheblend", 32) == ("cacheblend", 32)
    assert request_mode({"lmi_blend_mode": "epic"}, "cacheblend", 32) == ("epic", 32)
    assert request_mode({"lmi_blend_epic_tokens": 0}, "epic", 32) == ("epic", 0)
    assert names_own_blend({"lmi_blend_epic_tokens": 0}) and not names_own_blend({"other": 1})

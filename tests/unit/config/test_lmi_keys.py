"""Every LMI key and environment variable of `lmi_keys.json` does what the data says it does:
mapped (the resolved configuration changes), read from the environment or not applicable (one
log line, nothing else changes), or refused (a start-up error naming it with the reason)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lmi_server.config.lmi_compat import LmiKey, lmi_keys
from lmi_server.config.loader import load_serving_config
from lmi_server.config.schema import ConfigError, ServingConfig, build_serving_config
from lmi_server.speculative import build_speculative_config

# Mapped entries whose effect is a check or another key's outcome rather than a changed setting:
# the test asserts what they became instead (and the tests below assert their effect).
MAPPED_WITHOUT_CHANGE = {"option.enable_reasoning", "option.engine"}
REPORT_ONLY = ("not_applicable", "translated", "defaults", "sources", "overridden_by_file")


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU host unless a test says otherwise
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 8}))
    return d


def resolve(model_dir: Path, props: dict[str, str], env: dict[str, str] | None = None) -> ServingConfig:
    (model_dir / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return load_serving_config(model_dir, environ=env or {})


def settings(cfg: ServingConfig) -> dict:
    return cfg.model_dump(mode="json", exclude=set(REPORT_ONLY))


def placed(entry: LmiKey, value: str) -> tuple[dict[str, str], dict[str, str]]:
    """(properties, environment) that give the entry this value, beside what its example needs."""
    props = dict(entry.example_with or {})
    if entry.kind == "env":
        return props, {entry.name: value}
    return {**props, entry.name: value}, {}


def ids(entry: LmiKey) -> str:
    return entry.name


@pytest.mark.parametrize("entry", lmi_keys(), ids=ids)
def test_every_lmi_key_does_what_the_data_says(entry: LmiKey, model_dir, caplog):
    assert entry.example is not None, "every entry carries an example value"
    props, env = placed(entry, entry.example)
    baseline = resolve(model_dir, dict(entry.example_with or {}))
    if entry.here == "refused":
        with pytest.raises(ConfigError) as info:
            resolve(model_dir, props, env)
        assert any(entry.name in p and (entry.why or "") in p for p in info.value.problems), info.value.problems
        return
    with caplog.at_level(logging.INFO, logger="lmi_server.config.loader"):
        cfg = resolve(model_dir, props, env)
    logged = [r.getMessage() for r in caplog.records if entry.name in r.getMessage()]
    if entry.here == "mapped":
        if entry.name in MAPPED_WITHOUT_CHANGE:
            assert entry.name in cfg.translated or "engine" in cfg.not_applicable
        else:
            assert settings(cfg) != settings(baseline), f"{entry.name}={entry.example} changed nothing"
        assert entry.name not in cfg.not_applicable
    elif entry.here == "environment":
        assert cfg.translated[entry.name] == entry.why
        assert len(logged) == 1 and entry.why in logged[0]
        assert settings(cfg) == settings(baseline)
    else:
        assert cfg.not_applicable[entry.name] == entry.why
        assert len(logged) == 1 and entry.why in logged[0], logged
        assert settings(cfg) == settings(baseline)


REFUSED_VALUES = [
    (e, v) for e in lmi_keys() for v in (e.refused_values or (["not-a-backend"] if e.accepted_values else []))
]


@pytest.mark.parametrize("entry,value", REFUSED_VALUES, ids=[f"{e.name}={v}" for e, v in REFUSED_VALUES])
def test_refused_values_stop_start_up_with_the_reason(entry: LmiKey, value: str, model_dir):
    props, env = placed(entry, value)
    with pytest.raises(ConfigError) as info:
        resolve(model_dir, props, env)
    assert any(entry.name in p and (entry.refused_why or "") in p for p in info.value.problems), info.value.problems


TOP_LEVEL = [e for e in lmi_keys() if e.kind == "top-level" and "." not in e.name and e.here != "refused"]


@pytest.mark.parametrize("entry", TOP_LEVEL, ids=ids)
def test_top_level_keys_also_come_as_serving_variables(entry: LmiKey, model_dir):
    from_file = resolve(model_dir, {entry.name: entry.example})
    from_env = resolve(model_dir, {}, {"SERVING_" + entry.name.upper(): entry.example})
    assert settings(from_env) == settings(from_file)
    assert len(from_env.not_applicable) == len(from_file.not_applicable)
    assert set(from_env.not_applicable) <= {entry.name.lower(), "SERVING_" + entry.name.upper()}


def test_data_is_complete_and_consistent():
    names = [e.name for e in lmi_keys()]
    assert len(names) == len(set(names))
    for e in lmi_keys():
        assert e.meaning and e.lmi, e.name
        assert (e.to if e.here == "mapped" else e.why), e.name
        assert e.kind != "option" or e.name.startswith("option."), e.name
    simplified = {"HF_MODEL_ID", "HF_REVISION", "HF_TOKEN", "HF_MODEL_TRUST_REMOTE_CODE", "HF_MODEL_QUANTIZE", "HF_TASK",
                  "TENSOR_PARALLEL_DEGREE", "PIPELINE_PARALLEL_DEGREE", "MAX_BATCH_SIZE", "MAX_CONCURRENT_REQUESTS",
                  "MAX_BATCH_PREFILL_TOKENS", "SM_NUM_GPUS", "SAGEMAKER_MAX_PAYLOAD_IN_MB", "SAGEMAKER_STARTUP_TIMEOUT",
                  "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "SAGEMAKER_NUM_MODEL_WORKERS", "SERVING_LOAD_MODELS",
                  "SERVING_OPTS", "SERVING_FEATURES"}
    assert simplified <= set(names)


# --- the examples, one by one ---------------------------------------------------------

def test_simplified_setup_variables_change_the_resolved_config(model_dir):
    cfg = resolve(model_dir, {}, {"MAX_BATCH_SIZE": "4", "HF_REVISION": "v1", "MAX_CONCURRENT_REQUESTS": "3",
                                  "TENSOR_PARALLEL_DEGREE": "max", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "16"})
    assert cfg.engine_args["max_num_seqs"] == 4 and cfg.engine_args["revision"] == "v1"
    assert cfg.engine_args["tensor_parallel_size"] == 1  # max on a CPU host
    assert cfg.server.job_queue_size == 3 and cfg.server.max_request_bytes == 16 * 1024 * 1024


def test_explicit_option_wins_over_lmi_variables_and_file_over_both(model_dir):
    cfg = resolve(model_dir, {}, {"OPTION_MAX_ROLLING_BATCH_SIZE": "8", "MAX_BATCH_SIZE": "4"})
    assert cfg.engine_args["max_num_seqs"] == 8 and "not used" in cfg.translated["MAX_BATCH_SIZE"]
    cfg = resolve(model_dir, {"option.max_rolling_batch_size": "16"}, {"MAX_BATCH_SIZE": "4"})
    assert cfg.engine_args["max_num_seqs"] == 16
    cfg = resolve(model_dir, {}, {"TENSOR_PARALLEL_DEGREE": "2", "SM_NUM_GPUS": "8"})
    assert cfg.engine_args["tensor_parallel_size"] == 2


def test_job_queue_size_top_level_maps_and_option_spelling_wins(model_dir):
    assert resolve(model_dir, {"job_queue_size": "100"}).server.job_queue_size == 100
    cfg = resolve(model_dir, {"job_queue_size": "100", "option.job_queue_size": "7"})
    assert cfg.server.job_queue_size == 7 and "not used" in cfg.translated["job_queue_size"]
    cfg = resolve(model_dir, {}, {"SERVING_JOB_QUEUE_SIZE": "50", "MAX_CONCURRENT_REQUESTS": "3"})
    assert cfg.server.job_queue_size == 50  # LMI's start-up script: SERVING_JOB_QUEUE_SIZE wins


def test_lmcache_recipe_switches_on_this_servers_lmcache(model_dir):
    recipe = {"option.kv_transfer_config": '{"kv_connector":"LMCacheConnectorV1", "kv_role":"kv_both"}'}
    auto = resolve(model_dir, recipe)
    assert auto.lmcache.lmcache_auto_config and "kv_transfer_config" not in auto.engine_args
    from_file = resolve(model_dir, recipe, {"LMCACHE_CONFIG_FILE": "/opt/ml/model/lmcache.yaml"})
    assert str(from_file.lmcache.lmcache_config_file) == "/opt/ml/model/lmcache.yaml"
    assert not from_file.lmcache.lmcache_auto_config
    mp = resolve(model_dir, {"option.kv_transfer_config": '{"kv_connector": "LMCacheMPConnector"}'})
    assert mp.lmcache.lmcache_auto_config
    alone = resolve(model_dir, {}, {"LMCACHE_CONFIG_FILE": "/x.yaml"})
    assert alone.lmcache.lmcache_config_file is None and "LMCACHE_CONFIG_FILE" in alone.not_applicable


def test_other_kv_connectors_go_to_vllm_and_bad_ones_are_refused(model_dir):
    nixl = resolve(model_dir, {"option.kv_transfer_config": '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'})
    assert nixl.engine_args["kv_transfer_config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    for props, needle in [
        ({"option.kv_transfer_config": '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_producer"}'}, "kv_role"),
        ({"option.kv_transfer_config": "{nope"}, "expected JSON"),
        ({"option.kv_transfer_config": '{"kv_connector": "NixlConnector"}', "option.lmcache_auto_config": "true"}, "keep one"),
    ]:
        with pytest.raises(ConfigError) as info:
            resolve(model_dir, props)
        assert any("option.kv_transfer_config" in p and needle in p for p in info.value.problems), info.value.problems


def test_cpu_offload_per_gpu_is_vllms_cpu_offload(model_dir):
    assert resolve(model_dir, {"option.cpu_offload_gb_per_gpu": "4"}).engine_args["cpu_offload_gb"] == 4.0
    with pytest.raises(ConfigError, match="conflicts"):
        resolve(model_dir, {"option.cpu_offload_gb_per_gpu": "4", "option.cpu_offload_gb": "2"})


def test_removed_lora_keys_are_reported_not_refused(model_dir):
    cfg = resolve(model_dir, {"option.enable_lora": "true", "option.long_lora_scaling_factors": "4.0",
                              "option.lora_extra_vocab_size": "256"})
    assert {"option.long_lora_scaling_factors", "option.lora_extra_vocab_size"} <= set(cfg.not_applicable)
    from lmi_server.config.schema import vllm_engine_arg_table

    assert not {"long_lora_scaling_factors", "lora_extra_vocab_size"} & set(vllm_engine_arg_table())


def test_enable_reasoning_needs_a_parser_as_in_lmi(model_dir):
    with pytest.raises(ConfigError, match="option.reasoning_parser"):
        resolve(model_dir, {"option.enable_reasoning": "true"})
    cfg = resolve(model_dir, {"option.enable_reasoning": "true", "option.reasoning_parser": "deepseek_r1"})
    assert cfg.engine_args["reasoning_parser"] == "deepseek_r1"
    assert "reasoning on" in cfg.translated["option.enable_reasoning"]


@pytest.mark.parametrize("task,expected", [
    ("text-embedding", {"convert": "embed"}), ("feature-extraction", {"runner": "pooling", "convert": "embed"}),
    ("text-generation", {"runner": "generate"}), ("classify", {"convert": "classify"}), ("auto", {}),
])
def test_task_and_hf_task_choose_vllms_runner(model_dir, task, expected):
    for cfg in (resolve(model_dir, {"option.task": task}), resolve(model_dir, {}, {"HF_TASK": task})):
        assert {k: cfg.engine_args[k] for k in ("runner", "convert") if k in cfg.engine_args} == expected


def test_normalize_false_turns_the_pooler_activation_off(model_dir):
    cfg = resolve(model_dir, {"option.normalize": "false", "option.pooler_config": '{"pooling_type": "MEAN"}'})
    assert cfg.engine_args["pooler_config"] == {"pooling_type": "MEAN", "use_activation": False}


def test_option_engine_is_the_top_level_engine(model_dir):
    assert "engine" in resolve(model_dir, {}, {"OPTION_ENGINE": "Python"}).not_applicable
    with pytest.raises(ConfigError, match="vLLM"):
        resolve(model_dir, {}, {"OPTION_ENGINE": "Rust"})


def test_speculative_config_without_method_is_inferred_as_vllm_does(model_dir):
    for spec, method in [
        ({"model": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}, "ngram"),
        ({"model": "yuhuili/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 5}, "eagle"),
        ({"model": "org/Llama3.1-8B_eagle3", "num_speculative_tokens": 5}, "eagle3"),
        ({"model": "meta-llama/Llama3.2-1B-Instruct", "num_speculative_tokens": 5}, "draft_model"),
    ]:
        cfg = build_serving_config({"option.speculative_config": json.dumps(spec)}, model_dir)
        assert build_speculative_config(cfg, str(model_dir))["method"] == method


# --- LMI's defaults on GPU hosts ----------------------------------------------------------------

def test_tensor_parallel_defaults_to_every_visible_gpu(model_dir, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    cfg = resolve(model_dir, {})
    assert cfg.engine_args["tensor_parallel_size"] == 4 and "tensor_parallel_size" in cfg.defaults
    assert resolve(model_dir, {"option.pipeline_parallel_degree": "2"}).engine_args["tensor_parallel_size"] == 2
    explicit = resolve(model_dir, {"option.tensor_parallel_degree": "1"})
    assert explicit.engine_args["tensor_parallel_size"] == 1 and not explicit.defaults
    assert resolve(model_dir, {}, {"TENSOR_PARALLEL_DEGREE": "max"}).engine_args["tensor_parallel_size"] == 4


def test_tensor_parallel_default_divides_the_attention_heads(model_dir, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 6}))
    cfg = resolve(model_dir, {})
    assert cfg.engine_args["tensor_parallel_size"] == 3 and "6 attention heads" in cfg.defaults["tensor_parallel_size"]


def test_cpu_hosts_and_builtin_models_keep_one_engine_rank(model_dir, monkeypatch):
    assert "tensor_parallel_size" not in resolve(model_dir, {}).engine_args
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert "tensor_parallel_size" not in resolve(model_dir, {"option.model_id": "lmi-demo"}).engine_args


def test_lora_defaults_to_four_adapters_per_batch(model_dir):
    assert resolve(model_dir, {"option.enable_lora": "true"}).engine_args["max_loras"] == 4
    assert resolve(model_dir, {"option.enable_lora": "true", "option.max_loras": "2"}).engine_args["max_loras"] == 2
    assert "max_loras" not in resolve(model_dir, {}).engine_args


# --- what LMI does not document still stops start-up ------------------------------------------

@pytest.mark.parametrize("props,env,name", [
    ({"option.max_rolling_batch_sise": "8"}, {}, "option.max_rolling_batch_sise"),
    ({"job_queue_sise": "8"}, {}, "job_queue_sise"),
    ({}, {"OPTION_NOT_A_KEY": "1"}, "option.not_a_key"),
    ({}, {"SERVING_JOB_QUEUE_SISE": "1"}, "SERVING_JOB_QUEUE_SISE"),
])
def test_unknown_keys_still_stop_start_up_naming_the_key(model_dir, props, env, name):
    with pytest.raises(ConfigError) as info:
        resolve(model_dir, props, env)
    assert any(name in p for p in info.value.problems), info.value.problems


def test_unknown_sagemaker_variables_are_reported_not_refused(model_dir):
    cfg = resolve(model_dir, {}, {"SAGEMAKER_SOMETHING_NEW": "1"})
    assert "SAGEMAKER_SOMETHING_NEW" in cfg.not_applicable

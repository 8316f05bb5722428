import json
from pathlib import Path

import pytest

from lmi_server.config.loader import load_serving_config
from lmi_server.config.schema import ConfigError, all_known_keys, build_serving_config


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return d


def problems_of(props: dict[str, str], model_dir: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_serving_config(props, model_dir)
    return info.value.problems


def test_lmi_names_map_to_vllm(model_dir, monkeypatch):
    cfg = build_serving_config(
        {
            "option.tensor_parallel_degree": "2",
            "option.pipeline_parallel_degree": "1",
            "option.max_rolling_batch_size": "64",
            "option.max_rolling_batch_prefill_tokens": "8192",
            "option.quantize": "awq",
            "option.dtype": "bf16",
            "option.max_model_len": "4096",
            "option.gpu_memory_utilization": "0.85",
            "option.enable_prefix_caching": "false",
            "option.trust_remote_code": "TRUE",
        },
        model_dir,
    )
    args = cfg.engine_args
    assert args["tensor_parallel_size"] == 2
    assert args["pipeline_parallel_size"] == 1
    assert args["max_num_seqs"] == 64
    assert args["max_num_batched_tokens"] == 8192
    assert args["quantization"] == "awq"
    assert args["dtype"] == "bfloat16"
    assert args["max_model_len"] == 4096
    assert args["gpu_memory_utilization"] == 0.85
    assert args["enable_prefix_caching"] is False
    assert args["trust_remote_code"] is True
    assert args["model"] == str(model_dir)


def test_tensor_parallel_max_uses_visible_gpus(model_dir, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert build_serving_config({"option.tensor_parallel_degree": "max"}, model_dir).engine_args["tensor_parallel_size"] == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert build_serving_config({"option.tensor_parallel_degree": "max"}, model_dir).engine_args["tensor_parallel_size"] == 1


def test_other_vllm_engine_arguments_pass_through_typed(model_dir):
    cfg = build_serving_config(
        {
            "option.block_size": "32",
            "option.enforce_eager": "true",
            "option.kv_cache_dtype": "fp8",
            "option.speculative_config": '{"method": "ngram", "num_speculative_tokens": 3}',
            "option.seed": "7",
        },
        model_dir,
    )
    assert cfg.engine_args["block_size"] == 32
    assert cfg.engine_args["enforce_eager"] is True
    assert cfg.engine_args["kv_cache_dtype"] == "fp8"
    assert cfg.engine_args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}


def test_unknown_key_names_it_and_suggests_the_nearest(model_dir):
    (problem,) = problems_of({"option.max_rolling_batch_sise": "8"}, model_dir)
    assert "option.max_rolling_batch_sise" in problem
    assert "did you mean option.max_rolling_batch_size?" in problem


def test_unknown_key_without_near_match_has_no_suggestion(model_dir):
    (problem,) = problems_of({"option.zzzzqqq": "1"}, model_dir)
    assert "unknown key" in problem and "did you mean" not in problem


@pytest.mark.parametrize(
    "key,value,expect",
    [
        ("option.max_model_len", "lots", "expected an integer"),
        ("option.gpu_memory_utilization", "most", "expected a number"),
        ("option.enforce_eager", "perhaps", "expected true or false"),
        ("option.dtype", "fp7", "expected one of"),
        ("option.speculative_config", "{method: eagle", "expected JSON"),
        ("option.lmcache_auto_config", "maybe", "valid boolean"),
        ("option.lmcache_mode", "sideways", "'mp', 'inprocess' or 'auto'"),
        ("option.max_request_bytes", "-5", "greater than 0"),
        ("option.sessions_expiration", "soon", "valid integer"),
    ],
)
def test_ill_typed_values_name_key_and_value(model_dir, key, value, expect):
    (problem,) = problems_of({key: value}, model_dir)
    assert key in problem and repr(value) in problem and expect in problem


def test_typed_error_shows_a_correct_example(model_dir):
    (problem,) = problems_of({"option.max_model_len": "lots"}, model_dir)
    assert "example: option.max_model_len=4096" in problem


def test_conflicting_lmi_and_vllm_names_are_an_error(model_dir):
    (problem,) = problems_of({"option.max_rolling_batch_size": "8", "option.max_num_seqs": "16"}, model_dir)
    assert "option.max_rolling_batch_size" in problem and "option.max_num_seqs" in problem and "conflict" in problem


def test_same_value_under_both_names_is_accepted(model_dir):
    cfg = build_serving_config({"option.tensor_parallel_degree": "1", "option.tensor_parallel_size": "1"}, model_dir)
    assert cfg.engine_args["tensor_parallel_size"] == 1


def test_all_problems_reported_at_once(model_dir):
    problems = problems_of({"option.foo": "1", "option.max_model_len": "x", "option.rolling_batch": "trtllm"}, model_dir)
    assert len(problems) == 3


def test_real_lmi_file_keys_are_accepted_and_reported(model_dir):
    cfg = build_serving_config(
        {
            "engine": "Python",
            "option.rolling_batch": "vllm",
            "option.async_mode": "true",
            "option.entryPoint": "djl_python.lmi_vllm.vllm_async_service",
            "option.mpi_mode": "false",
            "minWorkers": "1",
            "option.max_rolling_batch_size": "32",
        },
        model_dir,
    )
    assert set(cfg.not_applicable) == {"engine", "option.rolling_batch", "option.async_mode", "option.entryPoint", "option.mpi_mode", "minWorkers"}
    assert cfg.engine_args["max_num_seqs"] == 32


@pytest.mark.parametrize("props", [{"option.rolling_batch": "trtllm"}, {"option.rolling_batch": "tnx"}, {"engine": "DeepSpeed"}])
def test_other_backends_are_a_clear_error(model_dir, props):
    (problem,) = problems_of(props, model_dir)
    assert "vLLM" in problem


def test_server_owned_engine_arguments_are_refused(model_dir):
    (problem,) = problems_of({"option.model": "x"}, model_dir)
    assert "option.model" in problem and "option.model_id" in problem
    # LMI's LMCache recipe is read (tests/unit/config/test_lmi_keys.py); without a connector it says what it wants
    (problem,) = problems_of({"option.kv_transfer_config": "{}"}, model_dir)
    assert "option.kv_transfer_config" in problem and "kv_connector" in problem


def test_model_id_relative_absolute_hub_and_invalid(tmp_path, model_dir):
    root = tmp_path
    rel = build_serving_config({"option.model_id": "model"}, root)
    assert rel.model.source == "local" and rel.model.path_or_id == str(model_dir.resolve())
    absolute = build_serving_config({"option.model_id": str(model_dir)}, tmp_path / "elsewhere")
    assert absolute.model.path_or_id == str(model_dir.resolve())
    hub = build_serving_config({"option.model_id": "Qwen/Qwen2.5-1.5B-Instruct"}, tmp_path / "elsewhere")
    assert hub.model.source == "hub" and hub.engine_args["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert hub.model.served_names == ["Qwen/Qwen2.5-1.5B-Instruct"]
    (problem,) = problems_of({"option.model_id": "./missing"}, tmp_path)
    assert "./missing" in problem
    s3 = build_serving_config({"option.model_id": "s3://bucket/models/llama"}, tmp_path)
    assert s3.model.source == "s3" and s3.model.served_names == ["llama"]  # downloaded at start-up
    (problem,) = problems_of({"option.model_id": "https://example.com/model"}, tmp_path)
    assert "https://" in problem and "s3://bucket/prefix" in problem


def test_model_dir_with_config_json_is_the_model(model_dir):
    cfg = build_serving_config({}, model_dir)
    assert cfg.model.source == "local" and cfg.model.served_names == ["model"]


def test_no_model_means_the_embedded_assistant(tmp_path):
    cfg = build_serving_config({}, tmp_path)
    assert cfg.model.source == "assistant" and cfg.model.served_names == ["smollm2-135m-instruct"]


def test_builtin_model_names(tmp_path):
    demo = build_serving_config({"option.model_id": "lmi-demo"}, tmp_path)
    assert demo.model.source == "demo" and demo.model.served_names == ["lmi-demo"]
    assistant = build_serving_config({"option.model_id": "smollm2-135m-instruct"}, tmp_path)
    assert assistant.model.source == "assistant"


def test_frontend_options_are_keys_with_lmi_spellings(tmp_path):
    props = {
        "option.enable_auto_tool_choice": "true",
        "option.tool_call_parser": "hermes",
        "option.chat_template_content_format": "openai",
        "option.response_role": "bot",
        "option.max_log_len": "100",
        "option.return_tokens_as_token_ids": "true",
        "option.enable_request_id_headers": "true",
        "option.enable_log_requests": "true",
        "option.reasoning_parser": "qwen3",
    }
    cfg = build_serving_config(props, tmp_path)
    assert cfg.frontend_args == {
        "enable_auto_tool_choice": True, "tool_call_parser": "hermes", "chat_template_content_format": "openai",
        "response_role": "bot", "max_log_len": 100, "return_tokens_as_token_ids": True,
        "enable_request_id_headers": True,
    }
    # engine arguments among vLLM's serve options stay engine arguments
    assert cfg.engine_args["enable_log_requests"] is True and cfg.engine_args["reasoning_parser"] == "qwen3"


def test_frontend_option_errors_name_the_key(tmp_path):
    problems = problems_of({"option.enable_auto_tool_choice": "maybe", "option.tool_call_parser": "hermez"}, tmp_path)
    text = "\n".join(problems)
    assert "option.enable_auto_tool_choice='maybe'" in text and "expected true or false" in text
    assert "option.tool_call_parser='hermez'" in text and "did you mean hermes" in text
    (listener,) = problems_of({"option.port": "9000"}, tmp_path)
    assert "option.port" in listener and "lmi-server serve" in listener
    (key,) = problems_of({"option.api_keys": "x"}, tmp_path)
    assert "option.api_keys" in key


def test_tool_parser_plugin_may_register_new_names(tmp_path):
    cfg = build_serving_config({"option.tool_parser_plugin": "/p/plugin.py", "option.tool_call_parser": "mine"}, tmp_path)
    assert cfg.frontend_args["tool_call_parser"] == "mine"


def test_served_model_name_list(model_dir):
    cfg = build_serving_config({"option.served_model_name": "a, b"}, model_dir)
    assert cfg.engine_args["served_model_name"] == ["a", "b"]


def test_loader_reads_model_dir_file_and_environment(model_dir):
    (model_dir / "serving.properties").write_text("option.max_model_len=2048\noption.dtype=fp32\n")
    env = {"OPTION_MAX_MODEL_LEN": "9999", "OPTION_MAX_ROLLING_BATCH_SIZE": "4"}
    cfg = load_serving_config(model_dir, environ=env)
    assert cfg.engine_args["max_model_len"] == 2048  # the file wins
    assert cfg.engine_args["max_num_seqs"] == 4  # the environment fills the rest
    assert cfg.overridden_by_file == ["option.max_model_len"]
    assert cfg.sources["option.max_rolling_batch_size"] == "env"


def test_loader_explicit_properties_path(model_dir, tmp_path):
    other = tmp_path / "custom.properties"
    other.write_text("option.max_model_len=1024\n")
    assert load_serving_config(model_dir, other, environ={}).engine_args["max_model_len"] == 1024
    with pytest.raises(ConfigError):
        load_serving_config(model_dir, tmp_path / "nope.properties", environ={})


def test_every_key_is_lowercase_and_unique():
    keys = all_known_keys()
    assert len(keys) == len(set(keys)) and all(k == k.lower() for k in keys)


def test_long_values_are_clipped_but_prose_with_apostrophes_is_not():
    from lmi_server.config.schema import ConfigError

    prose = (
        "too little memory for the engine's KV cache: (usable memory = min(MemAvailable 22.95 GiB, free on "
        "NUMA node 0 (the engine worker's) 13.94 GiB of 14.21 GiB) = 13.94 GiB; headroom = 13.94 GiB usable - "
        "weights 135.43 GiB) and the model's context"
    )
    assert ConfigError([prose]).problems == [prose]
    clipped = ConfigError(["option.chat_template=" + repr("x" * 500) + ": not a file"]).problems[0]
    assert "(500 characters)" in clipped and len(clipped) < 200 and clipped.endswith(": not a file")

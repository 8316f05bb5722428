"""resolve_runtime on a faked model directory (a config.json, no weights): engine arguments,
environment and KV plan are worked out without starting an engine."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from lmi_server.config.schema import ConfigError, build_serving_config
from lmi_server.runtime import longest_sequence_kv_bytes, resolve_runtime

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 2048, "torch_dtype": "float32",
    "vocab_size": 128, "intermediate_size": 128,
}


def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path


def test_a_local_model_directory_resolves_without_an_engine(tmp_path, monkeypatch):
    for module in ("vllm.v1.engine.async_llm", "vllm.engine.arg_utils"):
        monkeypatch.setitem(sys.modules, module, None)  # importing an engine would raise ImportError
    cfg = build_serving_config({"option.max_model_len": "1024", "option.tensor_parallel_degree": "1"}, model_dir(tmp_path))
    runtime = resolve_runtime(cfg, build_demo=False)
    assert runtime.engine_args["model"] == str(tmp_path)
    assert runtime.engine_args["served_model_name"] == [tmp_path.name]
    assert runtime.engine_args["max_model_len"] == 1024 and runtime.engine_args["tensor_parallel_size"] == 1
    assert "kv_transfer_config" not in runtime.engine_args  # no LMCache asked for
    assert runtime.kv_plan is not None and runtime.kv_plan.mode != "mp"
    json.dumps(runtime.describe(), default=str)  # `lmi-server config` prints it


def test_an_lmcache_file_gives_the_engine_a_kv_connector(tmp_path):
    d = model_dir(tmp_path)
    (d / "lmcache.yaml").write_text("chunk_size: 256\nmax_local_cpu_size: 1\n")
    cfg = build_serving_config({"option.lmcache_config_file": "lmcache.yaml", "option.max_model_len": "1024"}, d)
    runtime = resolve_runtime(cfg, build_demo=False)
    assert runtime.kv_plan.mode == "mp" and runtime.kv_plan.server_argv
    kv = runtime.engine_args["kv_transfer_config"]
    assert kv["kv_connector"] == "GuardedLMCacheMPConnector"
    # the RPC timeout is sized from this model's KV: 1,024 tokens of it, or the floor
    assert kv["kv_connector_extra_config"]["lmcache.mp.mq_timeout"] >= 2.0


def test_start_up_log_states_the_lmcache_plan_and_its_warnings(tmp_path, caplog):
    d = model_dir(tmp_path)
    (d / "lmcache.yaml").write_text("chunk_size: 256\nmax_local_cpu_size: 1\nmp_shm: true\n")
    cfg = build_serving_config({"option.lmcache_config_file": "lmcache.yaml", "option.max_model_len": "1024"}, d)
    runtime = resolve_runtime(cfg, build_demo=False)
    runtime.kv_plan.warnings.append("example warning")
    with caplog.at_level(logging.INFO, logger="lmi_server.test"):
        runtime.log_start_up(logging.getLogger("lmi_server.test"))
    plan_lines = [r for r in caplog.records if r.getMessage().startswith("LMCache plan: ")]
    assert plan_lines and "transfer mode engine_driven" in plan_lines[0].getMessage()
    assert any(r.levelno == logging.WARNING and r.getMessage() == "LMCache: example warning" for r in caplog.records)


def test_longest_sequence_kv_follows_the_engine_dtype():
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256, "torch_dtype": "bfloat16"}
    # 2 layers x K and V x 2 heads x 64 x bytes
    assert longest_sequence_kv_bytes(config, {"max_model_len": 1000}) == 1000 * 2 * 2 * 2 * 64 * 2
    assert longest_sequence_kv_bytes(config, {"max_model_len": 1000, "dtype": "float32"}) == 1000 * 2 * 2 * 2 * 64 * 4
    assert longest_sequence_kv_bytes(config, {"max_model_len": 1000, "dtype": "float32", "kv_cache_dtype": "fp8"}) == 1000 * 2 * 2 * 2 * 64
    assert longest_sequence_kv_bytes(None, {}) is None
    assert longest_sequence_kv_bytes({"num_hidden_layers": "x"}, {}) is None


def test_a_missing_chat_template_file_is_a_config_error(tmp_path):
    cfg = build_serving_config({"option.chat_template": "nope.jinja", "option.max_model_len": "1024"}, model_dir(tmp_path))
    with pytest.raises(ConfigError, match="nope.jinja"):
        resolve_runtime(cfg, build_demo=False)


CPUINFO_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
CPUINFO_SPR = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
CPUINFO_ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"


@pytest.mark.parametrize(("text", "native"), [(CPUINFO_AVX2, False), (CPUINFO_SPR, True), (CPUINFO_ARM, True), ("", None)])
def test_native_bf16_is_read_from_cpu_flags(tmp_path, text, native):
    from lmi_server.config import host

    (tmp_path / "cpuinfo").write_text(text)
    assert host.cpu_has_native_bf16(str(tmp_path / "cpuinfo")) is native
    assert host.cpu_has_native_bf16(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    ("source", "given", "native", "expected"),
    [
        ("assistant", None, False, "float32"),  # AVX2-only CPU (no native bf16)
        ("assistant", None, True, "float32"),  # AVX-512 BF16 / AMX: bf16 kernels flip the near-tie answer
        ("assistant", None, None, "float32"),  # unknown CPU: the same rule
        ("demo", None, True, "float32"),
        ("assistant", "auto", True, "float32"),
        ("assistant", "bfloat16", True, "bfloat16"),  # the user's choice wins
        ("assistant", "bfloat16", False, "bfloat16"),
        ("local", None, True, None),  # a user's model keeps vLLM's behaviour
        ("local", None, False, None),
    ],
)
def test_builtin_models_run_float32_on_every_cpu_kind(monkeypatch, source, given, native, expected):
    from types import SimpleNamespace

    from lmi_server import runtime

    monkeypatch.setattr(runtime.host, "gpu_count", lambda: 0)
    monkeypatch.setattr(runtime.host, "cpu_has_native_bf16", lambda: native)
    engine_args = {} if given is None else {"dtype": given}
    runtime.builtin_defaults(SimpleNamespace(model=SimpleNamespace(source=source)), engine_args, [])
    assert engine_args.get("dtype") == expected


def test_weights_served_in_another_float_type_are_counted_at_their_loaded_size():
    from lmi_server.runtime import loaded_weight_bytes

    assert loaded_weight_bytes(100, {"torch_dtype": "bfloat16"}, "float32") == 200
    assert loaded_weight_bytes(100, {"torch_dtype": "float32"}, "bfloat16") == 50
    assert loaded_weight_bytes(100, {"torch_dtype": "bfloat16"}, None) == 100  # the model's own dtype
    assert loaded_weight_bytes(100, {}, "float32") == 100  # unknown storage: the files' size
    assert loaded_weight_bytes(None, {"torch_dtype": "bfloat16"}, "float32") is None


def test_cpu_engines_run_without_onednn_global_primitive_cache(tmp_path, monkeypatch):
    """The cache that made the CPU worker grow through a soak is off on CPU hosts; a user's value wins."""
    from lmi_server.engine import engine_environment

    cfg = build_serving_config({"option.max_model_len": "1024"}, model_dir(tmp_path))
    assert engine_environment(cfg, gpus=0)["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "0"
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in engine_environment(cfg, gpus=1)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    monkeypatch.setattr("lmi_server.engine.host.gpu_count", lambda: 0)
    runtime = resolve_runtime(cfg, build_demo=False)
    assert runtime.env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "0"
    import os

    before = set(os.environ)
    runtime.apply_environment()
    for key in set(os.environ) - before:  # leave the test process's environment as it was
        os.environ.pop(key)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"


@pytest.mark.parametrize(
    ("source", "frontend", "engine", "expect_tools"),
    [
        ("assistant", {}, {}, True),
        ("demo", {}, {}, True),
        ("assistant", {"tool_call_parser": "hermes"}, {}, False),  # the user's choice stands
        ("assistant", {"enable_auto_tool_choice": False}, {}, False),
        ("local", {}, {}, False),  # a user's model: vLLM's defaults
    ],
)
def test_tool_calling_is_on_for_the_builtin_models_unless_configured(source, frontend, engine, expect_tools):
    from types import SimpleNamespace

    from lmi_server import runtime

    frontend_args, engine_args = dict(frontend), dict(engine)
    runtime.builtin_tool_defaults(SimpleNamespace(model=SimpleNamespace(source=source)), engine_args, frontend_args, [])
    if expect_tools:
        assert frontend_args == {"enable_auto_tool_choice": True, "tool_call_parser": "pythonic"}
        assert engine_args["structured_outputs_config"] == {"backend": "xgrammar", "disable_any_whitespace": True}
    else:
        assert frontend_args == frontend and "structured_outputs_config" not in engine_args


def test_builtin_tool_defaults_keep_a_users_structured_outputs_backend():
    from types import SimpleNamespace

    from lmi_server import runtime

    engine_args = {"structured_outputs_config": {"backend": "guidance"}}
    frontend_args: dict = {}
    runtime.builtin_tool_defaults(SimpleNamespace(model=SimpleNamespace(source="assistant")), engine_args, frontend_args, [])
    assert frontend_args["tool_call_parser"] == "pythonic" and engine_args["structured_outputs_config"] == {"backend": "guidance"}


@pytest.mark.parametrize(
    "props, engine_seqs, fair",
    [
        ({"option.max_rolling_batch_size": "8"}, 10, {"batch_size": 8, "reserved_slots": 2, "engine_max_num_seqs": 10}),
        ({"option.max_rolling_batch_size": "64"}, 72, {"batch_size": 64, "reserved_slots": 8, "engine_max_num_seqs": 72}),
        ({"option.max_num_seqs": "64", "option.reserved_slots": "4"}, 68, {"batch_size": 64, "reserved_slots": 4, "engine_max_num_seqs": 68}),
        ({"option.max_num_seqs": "8", "option.reserved_slots": "0"}, 8, None),
        ({"option.max_num_seqs": "8", "option.admission_policy": "fifo"}, 8, None),
        ({}, None, None),  # no batch size: vLLM's default, the reserve comes out of it
    ],
)
def test_fair_admission_adds_its_reserved_slots_to_a_batch_size_the_user_set(tmp_path, props, engine_seqs, fair):
    runtime = resolve_runtime(build_serving_config({"option.max_model_len": "1024", **props}, model_dir(tmp_path)), build_demo=False)
    assert runtime.engine_args.get("max_num_seqs") == engine_seqs
    assert runtime.fair_slots == fair
    assert any("option.reserved_slots" in note for note in runtime.notes) == (fair is not None)


@pytest.mark.parametrize(
    "gpus, given, expected",
    [
        (0, {}, False),  # CPU: prompts prefilled whole
        (0, {"enable_chunked_prefill": True}, True),  # the user's choice wins
        (0, {"max_num_batched_tokens": 512, "max_model_len": 1024}, None),  # a budget below the longest prompt: vLLM chunks
        (0, {"max_num_batched_tokens": 2048, "max_model_len": 1024}, False),
        (1, {}, None),  # GPU: vLLM's own default
    ],
)
def test_cpu_engines_prefill_prompts_whole_unless_told(monkeypatch, gpus, given, expected):
    from lmi_server import runtime

    monkeypatch.setattr(runtime.host, "gpu_count", lambda: gpus)
    engine_args, notes = dict(given), []
    runtime.cpu_scheduler_defaults(engine_args, {"max_position_embeddings": 4096}, notes)
    assert engine_args.get("enable_chunked_prefill") == expected
    assert bool(notes) == (gpus == 0 and "enable_chunked_prefill" not in given)


@pytest.mark.parametrize(
    "props, scheduler_cls",
    [
        ({}, "lmi_server.tenant_scheduler.TenantPrefillScheduler"),  # the fair policy is the default
        ({"option.tenant_prefill_step": "false"}, None),
        ({"option.admission_policy": "fifo"}, None),
        ({"option.scheduler_cls": "my.Scheduler"}, "my.Scheduler"),  # the user's own is kept
    ],
)
def test_fair_admission_names_the_new_tenant_scheduler_for_the_engine(tmp_path, props, scheduler_cls):
    runtime = resolve_runtime(build_serving_config({"option.max_model_len": "1024", **props}, model_dir(tmp_path)), build_demo=False)
    assert runtime.engine_args.get("scheduler_cls") == scheduler_cls
    assert any("tenant_prefill_step" in note for note in runtime.notes) == ("option.admission_policy" not in props
                                                                                 and "option.tenant_prefill_step" not in props)

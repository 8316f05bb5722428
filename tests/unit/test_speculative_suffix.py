"""`option.speculative_method=suffix`: the measured defaults, vLLM's suffix keys checked before start-up,
the extension it needs, and Arctic Inference's vLLM plugin kept off."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmi_server import speculative_suffix
from lmi_server.config.schema import ConfigError, build_serving_config
from lmi_server.speculative import SpeculativeConfigError, build_speculative_config

TARGET = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "vocab_size": 4096, "num_hidden_layers": 4}
MEASURED = {
    "method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
}


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TARGET))
    return tmp_path


def spec(model_dir: Path, props: dict[str, str]):
    return build_speculative_config(build_serving_config(props, model_dir), str(model_dir))


def test_suffix_alone_takes_the_measured_settings(model_dir):
    assert spec(model_dir, {"option.speculative_method": "suffix"}) == MEASURED


def test_suffix_explicit_token_count_wins(model_dir):
    out = spec(model_dir, {"option.speculative_method": "suffix", "option.num_speculative_tokens": "6"})
    assert out == {**MEASURED, "num_speculative_tokens": 6}


def test_suffix_json_form_keeps_the_users_keys_and_caps_the_draft(model_dir):
    """vLLM would draft up to the tree depth (24) when no count is given; ours caps it at 16."""
    out = spec(model_dir, {"option.speculative_config": json.dumps(
        {"method": "suffix", "suffix_decoding_max_tree_depth": 32, "suffix_decoding_min_token_prob": 0.3})})
    assert out == {"method": "suffix", "suffix_decoding_max_tree_depth": 32, "suffix_decoding_min_token_prob": 0.3,
                   "num_speculative_tokens": 16}


@pytest.mark.parametrize("config, needle", [
    ({"suffix_decoding_max_tree_depth": 0}, "suffix_decoding_max_tree_depth=0: must be at least 1"),
    ({"suffix_decoding_max_tree_depth": "deep"}, "expected an integer"),
    ({"suffix_decoding_max_cached_requests": -1}, "suffix_decoding_max_cached_requests=-1"),
    ({"suffix_decoding_max_spec_factor": -0.5}, "suffix_decoding_max_spec_factor=-0.5"),
    ({"suffix_decoding_max_spec_factor": True}, "expected a number"),
    ({"suffix_decoding_min_token_prob": 1.5}, "must be from 0 to 1"),
    ({"num_speculative_tokens": 12, "suffix_decoding_max_tree_depth": 8}, "exceeds suffix_decoding_max_tree_depth=8"),
    ({"num_speculative_tokens": 20}, "from 1 to 16"),
    ({"model": "eagle"}, "give no draft model"),
    ({"num_speculative_tokens_per_batch_size": [[1, 4, 4]]}, "not supported with method 'suffix'"),
])
def test_bad_suffix_settings_are_startup_errors_that_say_what_to_fix(model_dir, config, needle):
    with pytest.raises(SpeculativeConfigError) as info:
        spec(model_dir, {"option.speculative_config": json.dumps({"method": "suffix", **config})})
    assert needle in str(info.value)


def test_vllm_accepts_the_defaults_we_pass():
    """The keys we write are vLLM's own SpeculativeConfig fields, and its validation takes our values."""
    from vllm.config import SpeculativeConfig

    fields = SpeculativeConfig.__dataclass_fields__
    assert set(speculative_suffix.SUFFIX_DEFAULTS) <= set(fields)
    for key, value in speculative_suffix.SUFFIX_DEFAULTS.items():
        assert fields[key].default == value, key  # "vLLM's defaults, written out"


def test_missing_extension_is_a_startup_error_naming_the_fix(model_dir, monkeypatch):
    monkeypatch.setattr(speculative_suffix, "available", lambda: False)
    with pytest.raises(SpeculativeConfigError, match="scripts/build_suffix_decoding.py"):
        spec(model_dir, {"option.speculative_method": "suffix"})


def test_the_extension_is_installed_and_drafts_on_cpu():
    """What vLLM's proposer calls: a prompt tree drafts the continuation it has seen (no GPU needed)."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    assert speculative_suffix.available()
    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=4)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7]
    cache.start_request("r", prompt)
    draft = cache.speculate("r", prompt[-3:], max_spec_tokens=4)
    assert list(draft.token_ids)[:2] == [8, 9]


def test_arctic_plugin_switched_on_is_refused(tmp_path, monkeypatch):
    from lmi_server.runtime import resolve_speculative

    monkeypatch.setenv(speculative_suffix.PLUGIN_SWITCH, "1")
    cfg = build_serving_config({"option.speculative_method": "suffix"}, tmp_path / "no-model")
    with pytest.raises(ConfigError, match="unset ARCTIC_INFERENCE_ENABLED"):
        resolve_speculative(cfg, {"model": str(tmp_path)}, build_demo=False)


def test_arctic_plugin_is_inert_in_vllms_plugin_loading():
    """vLLM loads every `vllm.general_plugins` entry point in each engine process: Arctic's, with the switch
    unset, must leave vLLM unpatched (the same GPUModelRunner, no V2-runner override)."""
    code = (
        "import os; os.environ.pop('ARCTIC_INFERENCE_ENABLED', None); os.environ.pop('VLLM_USE_V2_MODEL_RUNNER', None)\n"
        "from importlib.metadata import entry_points\n"
        "(ep,) = [e for e in entry_points(group='vllm.general_plugins') if e.name == 'arctic_inference']\n"
        "import vllm.v1.worker.gpu_model_runner as m; before = dict(vars(m.GPUModelRunner))\n"
        "ep.load()()\n"
        "assert dict(vars(m.GPUModelRunner)) == before, 'patched'\n"
        "assert 'VLLM_USE_V2_MODEL_RUNNER' not in os.environ\n"
        "print('inert')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().endswith("inert"), proc.stderr[-2000:]

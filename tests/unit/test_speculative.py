import json
from pathlib import Path

import pytest

from lmi_server.config.schema import build_serving_config
from lmi_server.speculative import SpeculativeConfigError, build_speculative_config

TARGET = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "vocab_size": 4096, "num_hidden_layers": 4}


def write_model(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def model_dir(tmp_path):
    write_model(tmp_path, TARGET)
    write_model(tmp_path / "eagle", {**TARGET, "num_hidden_layers": 1, "architectures": ["EagleLlamaForCausalLM"]})
    return tmp_path


def spec(model_dir: Path, props: dict[str, str]):
    cfg = build_serving_config(props, model_dir)
    return build_speculative_config(cfg, str(model_dir))


def test_convenience_keys_build_vllm_config_with_resolved_draft(model_dir):
    out = spec(model_dir, {"option.speculative_method": "eagle", "option.speculative_draft_model": "eagle", "option.num_speculative_tokens": "4"})
    assert out == {"method": "eagle", "model": str((model_dir / "eagle").resolve()), "num_speculative_tokens": 4}


def test_json_form_passes_through_with_relative_draft_resolved(model_dir):
    out = spec(model_dir, {"option.speculative_config": '{"method": "eagle", "model": "eagle", "num_speculative_tokens": 2}'})
    assert out["model"] == str((model_dir / "eagle").resolve()) and out["num_speculative_tokens"] == 2


def test_ngram_needs_no_draft(model_dir):
    out = spec(model_dir, {"option.speculative_method": "ngram", "option.num_speculative_tokens": "5"})
    assert out == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 5, "prompt_lookup_min": 2}


NGRAM_MEASURED = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 5, "prompt_lookup_min": 2}
NGRAM_SCHEDULE = [[1, 8, 8], [9, 4096, 0]]


def test_ngram_alone_takes_the_measured_settings_not_vllms(model_dir):
    """`option.speculative_method=ngram` and nothing else: the draft length, lookup sizes and batch-size
    schedule chosen by benchmarks/spec_grounded.py for any model."""
    out = spec(model_dir, {"option.speculative_method": "ngram"})
    assert out == {**NGRAM_MEASURED, **({"num_speculative_tokens_per_batch_size": NGRAM_SCHEDULE} if NGRAM_SCHEDULE else {})}


def test_ngram_default_schedule_steps_aside_above_eight_running_requests_in_vllm(model_dir):
    """vLLM's own lookup of the default schedule: 8 draft tokens up to 8 running requests, none above."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    out = spec(model_dir, {"option.speculative_method": "ngram"})
    dense = build_dynamic_sd_schedule_lookup(out["num_speculative_tokens_per_batch_size"], 256, out["num_speculative_tokens"])
    assert dense[1] == dense[8] == 8 and dense[9] == dense[16] == dense[256] == 0


def test_ngram_explicit_token_count_wins_and_drops_the_schedule(model_dir):
    out = spec(model_dir, {"option.speculative_method": "ngram", "option.num_speculative_tokens": "3"})
    assert out["num_speculative_tokens"] == 3 and "num_speculative_tokens_per_batch_size" not in out


def test_ngram_json_form_is_passed_as_given(model_dir):
    given = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert spec(model_dir, {"option.speculative_config": json.dumps(given)}) == given


def test_ngram_alone_on_the_assistant_takes_the_same_measured_settings(tmp_path):
    from lmi_server.runtime import resolve_speculative

    cfg = build_serving_config({"option.speculative_method": "ngram"}, tmp_path / "no-model")
    assert cfg.model.source == "assistant"
    target = write_model(tmp_path / "target", {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "vocab_size": 49152})
    out = resolve_speculative(cfg, {"model": str(target)}, build_demo=False)
    assert {k: out[k] for k in NGRAM_MEASURED} == NGRAM_MEASURED and "model" not in out
    assert out.get("num_speculative_tokens_per_batch_size") == NGRAM_SCHEDULE


def test_no_speculation_when_not_asked(model_dir):
    assert spec(model_dir, {}) is None


@pytest.mark.parametrize(
    "props,needle",
    [
        ({"option.speculative_method": "eagle", "option.speculative_draft_model": "missing"}, "no such directory"),
        ({"option.speculative_method": "eagle"}, "needs a draft model"),
        ({"option.speculative_draft_model": "eagle"}, "speculative_method is required"),
        ({"option.speculative_method": "eagle", "option.speculative_draft_model": "wide"}, "hidden_size 512"),
        ({"option.speculative_method": "eagle", "option.speculative_draft_model": "othervocab"}, "vocab_size 32000"),
        ({"option.speculative_method": "mtp"}, "num_nextn_predict_layers"),
        ({"option.speculative_config": '{"method": "eagle", "model": "eagle", "num_speculative_tokens": 40}'}, "from 1 to 16"),
        ({"option.speculative_config": '{"num_speculative_tokens": 3}'}, 'needs a "method"'),
        ({"option.speculative_config": '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2}'}, "prompt_lookup_min"),
        ({"option.speculative_config": '{"method": "ngram", "num_speculative_tokens": 3}', "option.speculative_method": "eagle"}, "use one of the two forms"),
        ({"option.speculative_method": "eagle", "option.speculative_draft_model": "nocfg"}, "has no config.json"),
    ],
)
def test_each_validation_error_says_what_to_fix(model_dir, props, needle):
    write_model(model_dir / "wide", {**TARGET, "hidden_size": 512})
    write_model(model_dir / "othervocab", {**TARGET, "vocab_size": 32000})
    (model_dir / "nocfg").mkdir()
    with pytest.raises(SpeculativeConfigError) as info:
        spec(model_dir, props)
    assert needle in str(info.value)


def test_eagle_on_an_unsupported_architecture(tmp_path):
    write_model(tmp_path, {**TARGET, "architectures": ["GPT2LMHeadModel"]})
    write_model(tmp_path / "eagle", TARGET)
    with pytest.raises(SpeculativeConfigError, match="not supported for the target architecture"):
        spec(tmp_path, {"option.speculative_method": "eagle", "option.speculative_draft_model": "eagle"})


def test_num_speculative_tokens_range_is_checked_by_the_config_model(model_dir):
    from lmi_server.config.schema import ConfigError

    with pytest.raises(ConfigError, match="option.num_speculative_tokens"):
        build_serving_config({"option.num_speculative_tokens": "0"}, model_dir)


@pytest.mark.parametrize("props, tokens, by_batch", [
    ({}, 2, [[1, 2, 2], [3, 8, 1], [9, 4096, 0]]),
    ({"option.num_speculative_tokens": "4"}, 4, None),
])
def test_eagle3_alone_takes_the_assistants_shipped_head(tmp_path, props, tokens, by_batch):
    """The default assistant with `option.speculative_method=eagle3` and nothing else: the EAGLE-3 head
    shipped for it, drafting 2 tokens at 1-2 running requests, 1 at 3-8 and none above (measured),
    unless the key says how many."""
    from lmi_server.runtime import resolve_speculative

    cfg = build_serving_config({"option.speculative_method": "eagle3", **props}, tmp_path / "no-model")
    assert cfg.model.source == "assistant"
    target = write_model(tmp_path / "target", {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "vocab_size": 49152})
    out = resolve_speculative(cfg, {"model": str(target)}, build_demo=False)
    assert out["method"] == "eagle3" and out["num_speculative_tokens"] == tokens
    assert out.get("num_speculative_tokens_per_batch_size") == by_batch
    shipped = Path(out["model"])
    assert shipped.parts[-3:] == ("demo", "assistant", "eagle3")
    config = json.loads((shipped / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 8192


def test_draft_tokens_by_batch_size_pass_through_json(model_dir):
    out = spec(model_dir, {"option.speculative_config": json.dumps(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
         "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 64, 1]]})})
    assert out["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 64, 1]]


@pytest.mark.parametrize("schedule, why", [
    ([[2, 8, 2]], "must start at 1"),
    ([[1, 8, 4]], "drafts more than num_speculative_tokens=3"),
    ([[1, 8, 2], [4, 16, 1]], "non-overlapping"),
    ([[1, 8]], "triples"),
    ("1-8:2", "triples"),
    ([[1, 8, True]], "triples"),
])
def test_bad_draft_tokens_by_batch_size_is_a_startup_error_naming_the_key(model_dir, schedule, why):
    props = {"option.speculative_config": json.dumps(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
         "num_speculative_tokens_per_batch_size": schedule})}
    with pytest.raises(SpeculativeConfigError, match="num_speculative_tokens_per_batch_size") as info:
        spec(model_dir, props)
    assert why in str(info.value)

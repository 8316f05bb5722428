import logging

from hypothesis import given
from hypothesis import strategies as st

from lmi_server.config.properties import (
    merge_sources,
    options_from_environment,
    parse_properties,
)


def test_separators_comments_and_whitespace():
    text = """
# a comment
! another comment
   option.a=1
option.b : two
option.c three
option.d\t=\t  four
engine = Python
"""
    assert parse_properties(text) == {
        "option.a": "1",
        "option.b": "two",
        "option.c": "three",
        "option.d": "four",
        "engine": "Python",
    }


def test_line_continuations_join_and_strip_leading_whitespace():
    text = "option.speculative_config={\"method\": \"eagle\", \\\n     \"num_speculative_tokens\": 3}\n"
    assert parse_properties(text) == {"option.speculative_config": '{"method": "eagle", "num_speculative_tokens": 3}'}


def test_even_backslashes_do_not_continue():
    assert parse_properties("option.path=C:\\\\\noption.x=1") == {"option.path": "C:\\", "option.x": "1"}


def test_escapes_in_keys_and_values():
    props = parse_properties("my\\ key=a\\tb\\u0041\\=c\nk\\:x=1")
    assert props == {"my key": "a\tbA=c", "k:x": "1"}


def test_empty_value_and_key_only():
    assert parse_properties("option.a=\noption.b") == {"option.a": "", "option.b": ""}


def test_later_duplicate_wins():
    assert parse_properties("option.a=1\noption.a=2") == {"option.a": "2"}


def test_comment_marker_inside_value_is_kept():
    assert parse_properties("option.a=x # not a comment") == {"option.a": "x # not a comment"}


_key = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="=:#!\\"), min_size=1, max_size=20)
_value = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="\\"), max_size=40)


def _escape_value(value: str) -> str:
    # A leading space would be eaten as separator whitespace; Java escapes it.
    return ("\\ " + value[1:]) if value.startswith(" ") else value


@given(st.dictionaries(_key, _value, max_size=8))
def test_round_trip_of_generated_files(entries):
    text = "\n".join(f"{k}={_escape_value(v)}" for k, v in entries.items())
    parsed = parse_properties(text)
    expected = {k: (v.rstrip() if k.startswith("option.") else v) for k, v in entries.items()}
    assert parsed == expected


@given(st.text(max_size=200))
def test_parser_never_crashes_on_arbitrary_text(text):
    try:
        result = parse_properties(text)
    except ValueError as exc:  # only a malformed \\u escape may be refused
        assert "\\u" in str(exc) or "escape" in str(exc)
    else:
        assert isinstance(result, dict)


def test_environment_mapping():
    env = {
        "OPTION_MAX_ROLLING_BATCH_SIZE": "16",
        "OPTION_ENTRYPOINT": "djl_python.vllm",
        "HF_MODEL_ID": "Qwen/Qwen2.5-1.5B",
        "SM_NUM_GPUS": "4",
        "PATH": "/usr/bin",
        "OPTION_": "ignored",
    }
    assert options_from_environment(env) == {
        "option.max_rolling_batch_size": "16",
        "option.entrypoint": "djl_python.vllm",
        "option.model_id": "Qwen/Qwen2.5-1.5B",
        "option.tensor_parallel_degree": "4",
    }


def test_explicit_option_beats_sagemaker_alias():
    env = {"OPTION_MODEL_ID": "/models/a", "HF_MODEL_ID": "org/b"}
    assert options_from_environment(env)["option.model_id"] == "/models/a"


def test_file_wins_over_environment_and_override_is_logged(caplog):
    with caplog.at_level(logging.WARNING):
        merged = merge_sources({"option.max_model_len": "4096"}, {"option.max_model_len": "8192", "option.dtype": "fp16"})
    assert merged.values == {"option.max_model_len": "4096", "option.dtype": "fp16"}
    assert merged.sources == {"option.max_model_len": "file", "option.dtype": "env"}
    assert merged.overridden_by_file == ["option.max_model_len"]
    assert "option.max_model_len" in caplog.text and "8192" in caplog.text

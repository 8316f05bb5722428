"""Hostile input to the two parsers that face the outside: serving.properties and LMI bodies.

Anything may come in; what comes out is a value, a ConfigError / ValidationError naming the
problem, or (for bodies) a 400 - never another exception.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lmi_server.api.body import MAX_JSON_DEPTH, json_depth_exceeds
from lmi_server.api.sagemaker.lmi_protocol import LMIRequest, to_completion_body
from lmi_server.config.loader import load_serving_config
from lmi_server.config.properties import parse_properties
from lmi_server.config.schema import ConfigError, build_serving_config

pytestmark = pytest.mark.unit

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=25,
)
lmi_like = st.fixed_dictionaries(
    {"inputs": st.one_of(st.text(max_size=30), st.lists(st.text(max_size=10), max_size=3), json_values)},
    optional={
        "parameters": st.one_of(
            json_values,
            st.dictionaries(
                st.sampled_from(["max_new_tokens", "temperature", "top_p", "top_k", "stop", "n", "seed", "details", "bogus"]),
                json_values,
                max_size=5,
            ),
        ),
        "stream": json_values,
        "adapters": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(lmi_like, json_values))
def test_lmi_parser_accepts_or_names_the_problem(body):
    try:
        req = LMIRequest.model_validate(body)
    except ValidationError as exc:
        assert exc.errors()  # pydantic names the field
        return
    completion = to_completion_body(req, "m")
    assert completion["max_tokens"] >= 1 and completion["prompt"]
    json.dumps(completion)  # what goes to vLLM is plain JSON


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_properties_text_with_nul_and_control_characters(text):
    props = parse_properties(text)
    try:
        build_serving_config(props)
    except ConfigError as exc:
        assert exc.problems


def test_huge_line_and_nul_bytes(tmp_path):
    (tmp_path / "serving.properties").write_text("option.max_model_len=" + "9" * 1_000_000 + "\noption.dtype=fp\x0032\n")
    with pytest.raises(ConfigError) as info:
        load_serving_config(tmp_path, environ={})
    text = str(info.value)
    assert "option.dtype" in text and len(text) < 20_000  # the error names the keys without echoing a megabyte


def test_invalid_utf8_file_is_a_config_error(tmp_path):
    (tmp_path / "serving.properties").write_bytes(b"option.max_model_len=\xff\xfe\x00\n")
    with pytest.raises(ConfigError) as info:
        load_serving_config(tmp_path, environ={})
    assert "serving.properties" in str(info.value)


def test_deeply_nested_json_option_is_a_config_error(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "serving.properties").write_text(f"option.speculative_config={deep}\n")
    with pytest.raises(ConfigError) as info:
        load_serving_config(tmp_path, environ={})
    assert "option.speculative_config" in str(info.value)


def test_deep_body_nesting_is_detected_without_recursion():
    value: list = []
    for _ in range(MAX_JSON_DEPTH + 5):
        value = [value]
    assert json_depth_exceeds(value) and not json_depth_exceeds([[1]])

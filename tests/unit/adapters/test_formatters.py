"""model.py formatters: loading, isolation, failures."""

from __future__ import annotations

import re

import pytest

from lmi_server.adapters.formatters import FormatterError, load_formatters

DECORATOR = "from djl_python.output_formatter import output_formatter\n"
UPPER = DECORATOR + "PREFIX = 'A'\n@output_formatter\ndef up(response):\n    return PREFIX + response.upper()\n"
LOWER = DECORATOR + "PREFIX = 'B'\n@output_formatter\ndef low(response):\n    return PREFIX + response.lower()\n"
RETIRED = "def output_formatter(text, context):\n    return text.upper()\n"
# LMI's documented form: djl_python's decorators, a payload dict in, the response object out.
LMI_STYLE = (
    "from djl_python.input_parser import input_formatter\n"
    "from djl_python.output_formatter import output_formatter\n"
    "@input_formatter\ndef pre(decoded_payload, tokenizer=None):\n"
    "    return {'inputs': decoded_payload['question'], 'parameters': {'max_new_tokens': 4}, 'tok': tokenizer}\n"
    "@output_formatter\ndef post(response):\n    return {'answer': response['text']}\n"
)


def write(tmp_path, name, text):
    d = tmp_path / name
    d.mkdir()
    (d / "model.py").write_text(text)
    return d


def test_no_script_means_no_formatters(tmp_path):
    (tmp_path / "plain").mkdir()
    assert load_formatters("plain", tmp_path / "plain").empty


def test_each_script_in_its_own_namespace(tmp_path):
    a = load_formatters("a", write(tmp_path, "a", UPPER))
    b = load_formatters("b", write(tmp_path, "b", LOWER))
    assert a.format_response("Hi") == "AHI"
    assert b.format_response("Hi") == "Bhi"
    assert a.module_name != b.module_name
    # loading the same directory twice gives independent modules
    again = load_formatters("a", tmp_path / "a")
    assert again.module_name != a.module_name and again.format_response("x") == "AX"


def test_the_retired_text_contract_is_refused_with_how_to_mark_it(tmp_path):
    with pytest.raises(FormatterError, match=r"defines output_formatter\(\) without a decorator; mark it with @output_formatter"):
        load_formatters("old", write(tmp_path, "old", RETIRED))


def test_lmi_decorated_formatters_take_the_payload_and_the_response(tmp_path):
    f = load_formatters("d", write(tmp_path, "d", LMI_STYLE))
    body = f.format_payload({"question": "Why?"}, tokenizer="TOK")
    assert body == {"inputs": "Why?", "parameters": {"max_new_tokens": 4}, "tok": "TOK"}
    assert f.format_response({"text": "because"}) == {"answer": "because"}


def test_an_lmi_input_formatter_without_a_tokenizer_argument(tmp_path):
    text = "from djl_python.input_parser import input_formatter\n@input_formatter\ndef pre(p):\n    return {'inputs': p['q']}\n"
    f = load_formatters("n", write(tmp_path, "n", text))
    assert f.format_payload({"q": "x"}, tokenizer=object()) == {"inputs": "x"}


def test_an_lmi_input_formatter_must_return_a_body(tmp_path):
    text = "from djl_python.input_parser import input_formatter\n@input_formatter\ndef pre(p, **kw):\n    return 'text'\n"
    f = load_formatters("s", write(tmp_path, "s", text))
    with pytest.raises(FormatterError, match="returned str; it must return the request body as a dict"):
        f.format_payload({})


def test_helper_modules_beside_model_py_are_importable(tmp_path):
    d = write(tmp_path, "h", "import my_helper_xyz\nfrom djl_python.output_formatter import output_formatter\n"
              "@output_formatter\ndef post(r):\n    return my_helper_xyz.wrap(r)\n")
    (d / "my_helper_xyz.py").write_text("def wrap(r):\n    return {'wrapped': r}\n")
    assert load_formatters("h", d).format_response(1) == {"wrapped": 1}


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("from djl_python.input_parser import init_handler\n@init_handler\ndef init(d, **kw):\n    return None\n", "@init_handler"),
        ("async def handle(inputs):\n    return None\n", "a custom handler belongs in the model directory"),
        ("def model_fn(d):\n    return None\n", "model_fn()"),
    ],
)
def test_custom_handlers_are_refused_with_the_reason(tmp_path, text, refused):
    with pytest.raises(FormatterError, match=re.escape(refused)):
        load_formatters("c", write(tmp_path, "c", text))


def test_a_model_level_script_takes_lmis_contract_only(tmp_path):
    from lmi_server.adapters.formatters import load_model_formatters

    assert load_model_formatters(None).empty and load_model_formatters(tmp_path).empty
    f = load_model_formatters(write(tmp_path, "m", LMI_STYLE))
    assert f.payload_input is not None and f.response_output is not None and f.owner == "the model"
    with pytest.raises(FormatterError, match="marks no function with @input_formatter"):
        load_model_formatters(write(tmp_path, "plain", "x = 1\n"))


def test_import_failure_is_a_clear_error(tmp_path):
    with pytest.raises(FormatterError, match=r"model.py failed to import.*ZeroDivisionError"):
        load_formatters("bad", write(tmp_path, "bad", "x = 1 / 0\n"))
    with pytest.raises(FormatterError, match=r"SyntaxError"):
        load_formatters("syn", write(tmp_path, "syn", "def (:\n"))
    with pytest.raises(FormatterError, match=r"ModuleNotFoundError"):
        load_formatters("imp", write(tmp_path, "imp", "import no_such_module_xyz\n"))
    with pytest.raises(FormatterError, match="neither input_formatter nor output_formatter"):
        load_formatters("empty", write(tmp_path, "empty", "x = 1\n"))


def test_formatter_that_raises(tmp_path):
    f = load_formatters("r", write(tmp_path, "r", DECORATOR + "@output_formatter\ndef f(t):\n    raise ValueError('nope ' + t)\n"))
    with pytest.raises(FormatterError, match="output formatter of adapter 'r' failed: ValueError: nope x"):
        f.format_response("x")

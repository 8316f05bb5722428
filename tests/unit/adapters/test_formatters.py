"""model.py formatters: loading, isolation, failures."""

from __future__ import annotations

import pytest

from lmi_server.adapters.formatters import FormatterContext, FormatterError, load_formatters

UPPER = "PREFIX = 'A'\ndef output_formatter(text, context):\n    return PREFIX + text.upper()\n"
LOWER = "PREFIX = 'B'\ndef output_formatter(text):\n    return PREFIX + text.lower()\n"
DECORATED = (
    "from lmi_server.adapters.formatters import input_formatter, output_formatter\n"
    "@input_formatter\ndef pre(req, ctx):\n    req['seen'] = ctx.adapter\n"
    "@output_formatter\ndef post(text):\n    return '<' + text + '>'\n"
)


def write(tmp_path, name, text):
    d = tmp_path / name
    d.mkdir()
    (d / "model.py").write_text(text)
    return d


def ctx(name="a"):
    return FormatterContext(adapter=name, schema="completion")


def test_no_script_means_no_formatters(tmp_path):
    (tmp_path / "plain").mkdir()
    assert load_formatters("plain", tmp_path / "plain").empty


def test_each_script_in_its_own_namespace(tmp_path):
    a = load_formatters("a", write(tmp_path, "a", UPPER))
    b = load_formatters("b", write(tmp_path, "b", LOWER))
    assert a.format_output("Hi", ctx("a")) == "AHI"
    assert b.format_output("Hi", ctx("b")) == "Bhi"
    assert a.module_name != b.module_name
    # loading the same directory twice gives independent modules
    again = load_formatters("a", tmp_path / "a")
    assert again.module_name != a.module_name and again.format_output("x", ctx()) == "AX"


def test_decorated_formatters(tmp_path):
    f = load_formatters("d", write(tmp_path, "d", DECORATED))
    req = {}
    assert f.format_input(req, ctx("d")) is req and req["seen"] == "d"
    assert f.format_output("x", ctx("d")) == "<x>"


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
    f = load_formatters("r", write(tmp_path, "r", "def output_formatter(t):\n    raise ValueError('nope ' + t)\n"))
    with pytest.raises(FormatterError, match="output_formatter of adapter 'r' failed: ValueError: nope x"):
        f.format_output("x", ctx("r"))
    g = load_formatters("s", write(tmp_path, "s", "def output_formatter(t):\n    return 3\n"))
    with pytest.raises(FormatterError, match="must return str"):
        g.format_output("x", ctx("s"))

"""A model directory's model.py is loaded once at start-up; one that cannot be used stops it."""

import pytest

from lmi_server.api.app import create_app
from lmi_server.config.schema import ConfigError, build_serving_config


def test_a_model_level_script_is_loaded_at_start_up(tmp_path):
    (tmp_path / "model.py").write_text(
        "from djl_python.output_formatter import output_formatter\n@output_formatter\ndef f(r):\n    return r\n"
    )
    app = create_app(build_serving_config({}, tmp_path), {"model": "x"}, start_engine=False)
    assert app.state.ctx.model_formatters.response_output is not None


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("import no_such_module_for_model_py\n", "ModuleNotFoundError"),
        ("def handle(inputs):\n    return None\n", "not as `async def handle(inputs)`"),
        ("def output_formatter(text):\n    return text\n", "without a decorator; mark it with @output_formatter"),
    ],
)
def test_a_model_level_script_that_cannot_be_used_is_a_start_up_error(tmp_path, script, reason):
    (tmp_path / "model.py").write_text(script)
    with pytest.raises(ConfigError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        create_app(build_serving_config({}, tmp_path), {"model": "x"}, start_engine=False)

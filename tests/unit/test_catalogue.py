"""The built-in model catalogue: one entry per model, read by config and runtime alike."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from lmi_server import catalogue
from lmi_server.adapters.formatters import load_formatters
from lmi_server.config.schema import build_serving_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("entry", list(catalogue.BUILTIN_MODELS.values()), ids=lambda e: e.name)
def test_each_builtin_name_resolves_to_its_entry(entry, tmp_path):
    cfg = build_serving_config({"option.model_id": entry.name}, tmp_path)
    assert cfg.model.source == entry.source and cfg.model.served_names == [entry.name]
    assert cfg.model.path_or_id == str(entry.directory())
    assert catalogue.by_source(cfg.model.source) is entry
    if entry.kind is not None:
        assert cfg.kind.name == entry.kind


def test_no_model_configured_serves_the_default_entry(tmp_path):
    cfg = build_serving_config({}, tmp_path / "empty")
    assert catalogue.by_source(cfg.model.source) is catalogue.DEFAULT_MODEL


def test_entries_carry_their_drafts_schedules_and_adapters():
    assistant, demo = catalogue.ASSISTANT, catalogue.DEMO
    assert assistant.draft("eagle") is not None and assistant.draft("eagle3") is not None
    assert demo.draft("eagle") is not None and demo.draft("eagle3") is None
    assert assistant.draft_tokens_by_batch["eagle3"][-1][2] == 0  # big batches draft nothing
    assert (assistant.adapters_dir() / "pirate" / "adapter_config.json").is_file()
    assert catalogue.example_adapters_dir("assistant") == assistant.adapters_dir()
    assert catalogue.example_adapters_dir("demo") is None and catalogue.example_adapters_dir("local") is None


def test_a_user_model_is_not_in_the_catalogue():
    assert catalogue.by_name("org/model") is None and catalogue.by_source("hub") is None


def test_importing_the_catalogue_loads_no_engine_torch_or_demo_builder():
    code = (
        "import sys, lmi_server.catalogue, lmi_server.config.schema; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch') "
        "or m.startswith(('lmi_server.demo', 'lmi_server.model_source', 'lmi_server.api'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_the_shouter_formatters_exist_once_and_both_shouters_use_them():
    shipped = catalogue.ASSISTANT.adapters_dir() / "shouter"
    demo = REPO / "adapters" / "shouter"
    defined = [n.name for n in ast.parse((demo / "model.py").read_text()).body if isinstance(n, ast.FunctionDef)]
    assert defined == []  # the demo model's shouter runs the shipped file, it does not copy it
    chunk = 'data: {"choices": [{"text": "hi"}]}\n\n'
    for folder in (shipped, demo):
        f = load_formatters("shouter", folder)
        assert f.format_payload({"inputs": "x"}) == {"inputs": "x", "parameters": {"max_new_tokens": 16}}
        assert '"HI"' in f.format_response(chunk)


def test_the_demo_modules_build_what_the_catalogue_names():
    """The builders name their files after the model (they cannot import the catalogue, which
    imports them): the names must agree."""
    from lmi_server.demo import assistant, embedding, vision

    assert assistant.SERVED_NAME == catalogue.ASSISTANT.name
    assert embedding.SERVED_NAME == catalogue.EMBEDDING.name
    assert vision.SERVED_NAME == catalogue.VISION.name


def test_the_runtime_takes_the_start_up_note_and_cpu_defaults_from_the_entry(tmp_path, monkeypatch):
    from lmi_server import runtime

    monkeypatch.setattr(runtime.host, "gpu_count", lambda: 0)
    for entry in (catalogue.EMBEDDING, catalogue.VISION):
        cfg = build_serving_config({"option.model_id": entry.name}, tmp_path)
        resolved = runtime.resolve_runtime(cfg, build_demo=False)
        assert entry.note in resolved.notes
        assert resolved.engine_args["dtype"] == entry.cpu_dtype and resolved.engine_args["enforce_eager"] is True

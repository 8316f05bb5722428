"""Servers shared by the whole session (engine start-up is the cost): the demo model with LoRA
off (`server`) and with LoRA on and the example adapters (`lora`). The concurrent fuzzer runs
last, so that it reuses both after the modules that check their fresh state."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import DEMO_PROPS, REPO, running_server

BASE_PROPS = {
    **DEMO_PROPS,  # the tiny trained demo model: fast starts for tests
    # vLLM's tool-calling front-end options as option.* keys (tests/e2e/test_tools.py). The pythonic
    # parser lets vLLM force a named/required call's JSON with structured output (vLLM 0.32's hermes
    # parser leaves that to the model); compact JSON keeps a tiny model from looping on whitespace.
    "option.enable_auto_tool_choice": "true",
    "option.tool_call_parser": "pythonic",
    "option.structured_outputs_config": '{"backend": "xgrammar", "disable_any_whitespace": true}',
}
LAST_MODULES = ("test_concurrent_fuzz.py",)


def pytest_collection_modifyitems(config, items):
    """The fuzzer after everything else: it loads adapters and fills caches that other modules
    expect fresh, and it reuses their session servers."""
    items.sort(key=lambda item: item.path.name in LAST_MODULES)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("model-dir"), BASE_PROPS) as proc:
        yield proc


@pytest.fixture(scope="session")
def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _adapters_for(base: Path, root: Path) -> None:
    """Copy the committed example adapters when they were trained on this base, else retrain."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from train_adapters import fingerprint
    finally:
        sys.path.pop(0)
    fp = fingerprint(base)
    src = REPO / "adapters"
    fits = all(
        (src / n / "training.json").is_file() and json.loads((src / n / "training.json").read_text())["base_fingerprint"] == fp
        for n in ("hello-printer", "shouter")
    )
    if fits:
        for n in ("hello-printer", "shouter"):
            shutil.copytree(src / n, root / n)
    else:
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "train_adapters.py"), "--base", str(base), "--out", str(root)],
            check=True, cwd=REPO, timeout=1800,
        )


@pytest.fixture(scope="session")
def lora(tmp_path_factory):
    """The demo model with LoRA on and its example adapters, plus: a third copy (three adapters
    compete for max_loras=2), one whose script fails to import (424) and one whose formatter
    raises on every request."""
    from lmi_server.demo.builder import ensure_demo_model

    model_dir = tmp_path_factory.mktemp("lora-model-dir")
    root = model_dir / "my-adapters"
    root.mkdir()
    _adapters_for(ensure_demo_model(), root)
    shutil.copytree(root / "hello-printer", root / "hello-copy")
    shutil.copytree(root / "hello-printer", root / "broken-script")
    (root / "broken-script" / "model.py").write_text("import no_such_module_for_lora_tests\n")
    shutil.copytree(root / "hello-printer", root / "raising")
    (root / "raising" / "model.py").write_text(
        "from djl_python.output_formatter import output_formatter\n"
        "@output_formatter\ndef refuse(response):\n    raise ValueError('formatter refused ' + repr(str(response)[:5]))\n"
    )
    props = {
        **DEMO_PROPS,
        "option.enable_lora": "true",
        "option.max_loras": "2",
        "option.max_lora_rank": "8",
        "option.adapters_path": str(root),
    }
    with running_server(model_dir, props, adapter_root=root) as proc:
        yield proc

"""Servers shared by the whole session (engine start-up is the cost), one per set of properties
that several modules need:

- `server` (also named `lora`): the demo model with the tool-calling options, LoRA on and the
  example adapters (tests/e2e/test_api.py, test_lora.py, test_tools.py, test_speculative.py's
  reference, ...). Modules before test_lora.py name no existing adapter: it checks their fresh state.
- `busy_server`: the demo model with LoRA off, one sequence at a time and a queue of one
  (tests/e2e/test_load_shedding.py; the LoRA-off checks of test_adapter_naming.py and test_api.py).
- `assistant_with_lora`: the embedded assistant with LoRA on (test_assistant_kit.py; its base
  model is the greedy reference of test_assistant_eagle.py).

The concurrent fuzzer runs last, so that it reuses `server` after the modules that check its
fresh state."""

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
LORA_PROPS = {"option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "8"}
LAST_MODULES = ("test_concurrent_fuzz.py",)
SHARED_SERVERS = ("server", "busy_server", "assistant_with_lora")


def pytest_collection_modifyitems(config, items):
    """The fuzzer after everything else: it loads adapters and fills caches that other modules
    expect fresh, and it reuses their session servers."""
    items.sort(key=lambda item: item.path.name in LAST_MODULES)


def pytest_runtest_teardown(item, nextitem):
    """Stop a session server once no test left in the run asks for it (its fixture's teardown at
    the session's end then finds it stopped): fewer idle engines side by side."""
    later = item.session.items[item.session.items.index(item) + 1:]
    for name in SHARED_SERVERS:
        proc = (getattr(item, "funcargs", None) or {}).get(name)
        if proc is not None and not any(name in other.fixturenames for other in later):
            proc.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The demo model with the tool-calling options and LoRA on, with its example adapters plus: a
    third copy (three adapters compete for max_loras=2), one whose script fails to import (424)
    and one whose formatter raises on every request."""
    from lmi_server.demo.builder import ensure_demo_model

    model_dir = tmp_path_factory.mktemp("model-dir")
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
    props = {**BASE_PROPS, **LORA_PROPS, "option.adapters_path": str(root)}
    with running_server(model_dir, props, adapter_root=root) as proc:
        yield proc


@pytest.fixture(scope="session")
def lora(server):
    """The shared server, named for what LoRA tests need of it."""
    return server


@pytest.fixture(scope="session")
def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def busy_server(tmp_path_factory):
    """LoRA off, one sequence at a time (option.max_rolling_batch_size=1), one request may wait
    (option.job_queue_size=1) for at most 30 s (option.max_queue_wait=30): the load-shedding
    premise (tests/e2e/test_load_shedding.py); other modules send it one request at a time."""
    props = {**BASE_PROPS, "option.max_rolling_batch_size": "1", "option.job_queue_size": "1",
             "option.max_queue_wait": "30", "option.max_model_len": "16384"}
    with running_server(tmp_path_factory.mktemp("shedding"), props) as proc:
        yield proc


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
def assistant_with_lora(tmp_path_factory):
    """The embedded assistant (the default model) with only LoRA switched on: its example adapters
    are served (tests/e2e/test_assistant_kit.py), and its base model, asked without an adapter, is
    the greedy reference without speculation (tests/e2e/test_assistant_eagle.py)."""
    props = {"option.enable_lora": "true", "option.max_loras": "2", "option.max_lora_rank": "8", "option.cpu_kv_cache_space": "1"}
    with running_server(tmp_path_factory.mktemp("assistant-lora"), props) as proc:
        yield proc

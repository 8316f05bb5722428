"""Code that arrives with an adapter runs only when trusted: an adapter registered from s3:// that
carries a model.py is refused (400, nothing imported, nothing registered) unless
option.trust_remote_code is true; adapters in a local adapters root import their model.py as ever.

Each model.py here writes a marker file when imported, so "not imported" is observed, not assumed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmi_server.adapters.registry import AdapterRegistry
from lmi_server.adapters.validation import AdapterInvalid
from tests.support.s3 import moto_s3, s3_env, upload_dir  # noqa: F401 - fixtures
from tests.unit.adapters.conftest import make_adapter

pytestmark = pytest.mark.timeout(120)

SRC = "s3://adapters/tenants/loud"


def side_effect_script(marker: Path) -> str:
    """A formatter script whose import leaves `marker` behind."""
    return (
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "from djl_python.output_formatter import output_formatter\n"
        "@output_formatter\n"
        "def shout(response):\n"
        "    return response.upper()\n"
    )


def upload_scripted(endpoint: str, tmp_path: Path, marker: Path) -> None:
    make_adapter(tmp_path / "src", "loud", model_py=side_effect_script(marker))
    upload_dir(endpoint, "adapters", "tenants/loud", tmp_path / "src" / "loud")


def registry(root: Path, backend, base_info, **kw) -> AdapterRegistry:
    root.mkdir(parents=True, exist_ok=True)
    return AdapterRegistry(backend, root=root, max_rank=8, capacity=2, base=base_info, **kw)


async def test_a_remote_adapters_script_is_not_imported_without_trust(s3_env, tmp_path, base_info, fake_backend, caplog):
    from lmi_server.api.errors import from_adapter_error

    marker = tmp_path / "imported.txt"
    upload_scripted(s3_env, tmp_path, marker)
    reg = registry(tmp_path / "root", fake_backend, base_info)
    with caplog.at_level(logging.WARNING, logger="lmi_server.adapters"):
        with pytest.raises(AdapterInvalid) as err:
            await reg.add("loud", SRC)
    assert not marker.exists(), "the remote model.py was imported without option.trust_remote_code"
    message = str(err.value)
    assert "option.trust_remote_code=true" in message and SRC in message and "model.py" in message
    assert "without model.py" in message  # how to serve the weights alone
    assert from_adapter_error(err.value).status == 400
    assert "loud" not in reg.adapters and not fake_backend.loads and reg.describe() == []
    assert any("option.trust_remote_code" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


async def test_a_remote_adapter_without_a_script_needs_no_trust(s3_env, tmp_path, base_info, fake_backend):
    make_adapter(tmp_path / "src", "plain")
    upload_dir(s3_env, "adapters", "tenants/plain", tmp_path / "src" / "plain")
    reg = registry(tmp_path / "root", fake_backend, base_info)
    entry = await reg.add("plain", "s3://adapters/tenants/plain")
    assert entry.resident and entry.formatters.empty


async def test_trust_remote_code_imports_a_remote_adapters_script(s3_env, tmp_path, base_info, fake_backend):
    marker = tmp_path / "imported.txt"
    upload_scripted(s3_env, tmp_path, marker)
    reg = registry(tmp_path / "root", fake_backend, base_info, trust_remote_code=True)
    entry = await reg.add("loud", SRC)
    assert marker.read_text() == "imported"
    assert entry.formatters.has_output and entry.formatters.format_response("arr") == "ARR"
    assert entry.describe()["output_formatter"] is True and fake_backend.loads == ["loud"]


async def test_a_local_adapters_script_is_imported_without_trust(tmp_path, base_info, fake_backend):
    root = tmp_path / "root"
    found, posted = tmp_path / "found.txt", tmp_path / "posted.txt"
    make_adapter(root, "at-start", model_py=side_effect_script(found))
    reg = registry(root, fake_backend, base_info)
    ok, failed = reg.discover()  # start-up discovery
    assert ok == ["at-start"] and not failed and found.exists()
    assert reg.get("at-start").formatters.has_output
    make_adapter(root, "by-api", model_py=side_effect_script(posted))
    entry = await reg.add("by-api", "by-api")  # POST /adapters with a local src
    assert posted.exists() and entry.formatters.has_output


def test_the_registry_takes_trust_remote_code_from_the_engine_arguments(tmp_path, monkeypatch):
    from lmi_server.api.adapters import wiring

    monkeypatch.setattr(wiring, "with_adapter_listing", lambda models, registry: None)
    models = SimpleNamespace(base_model_paths=[SimpleNamespace(name="tiny-base")], is_base_model=lambda n: n == "tiny-base")
    cfg = SimpleNamespace(adapters=SimpleNamespace(adapters_path=str(tmp_path / "root")), model_dir=str(tmp_path))

    def built(engine_args):
        owner = SimpleNamespace(
            state=SimpleNamespace(serving=SimpleNamespace(openai_serving_models=models), engine=None),
            engine_args={"model": str(tmp_path / "none"), **engine_args},
        )
        return wiring.build_registry(cfg, owner)

    assert built({"trust_remote_code": True}).trust_remote_code is True
    assert built({}).trust_remote_code is False
    assert built({"trust_remote_code": False}).trust_remote_code is False

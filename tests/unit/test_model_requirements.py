"""A model directory's requirements.txt is installed at start-up, before model.py is imported;
a failure stops start-up naming the index or the package (no network: a wheel built here)."""

from __future__ import annotations

import base64
import hashlib
import logging
import sys
import zipfile
from pathlib import Path

import pytest

from lmi_server.model_requirements import RequirementsError, install_requirements, plan_install


def build_wheel(dest: Path, name: str = "lmi_tiny_dep", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel (the zip layout pip installs), written without a build backend."""
    files = {
        f"{name}/__init__.py": f"VALUE = {version!r}\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "serving.properties").write_text("option.model_id=lmi-demo\n")
    return d


def offline_env(tmp_path, **extra):
    """pip pointed at nothing but the model's wheels, installing into a folder of the test's own."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DJL_OFFLINE": "true", "PIP_TARGET": str(tmp_path / "site"),
           "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": "/dev/null"}
    env.update(extra)
    return env


def test_no_requirements_file_runs_nothing(model_dir):
    assert plan_install(model_dir, {}) is None
    assert install_requirements(model_dir, {}) is False


def test_the_models_wheels_are_installed_offline_and_logged(tmp_path, model_dir, caplog):
    build_wheel(model_dir / "requirements")
    (model_dir / "requirements.txt").write_text("lmi_tiny_dep==1.0\n")
    env = offline_env(tmp_path)
    plan = plan_install(model_dir, env)
    assert plan.command[:4] == [sys.executable, "-m", "pip", "install"]
    assert "--no-index" in plan.command and str(model_dir / "requirements") in plan.command  # LMI's offline form
    with caplog.at_level(logging.INFO, logger="lmi_server.model_requirements"):
        assert install_requirements(model_dir, env) is True
    assert (tmp_path / "site" / "lmi_tiny_dep" / "__init__.py").read_text() == "VALUE = '1.0'\n"
    assert "installing " + str(model_dir / "requirements.txt") in caplog.text
    assert "Successfully installed lmi_tiny_dep-1.0" in caplog.text or "lmi-tiny-dep" in caplog.text.lower()
    assert install_requirements(model_dir, env) is False  # once per process


def test_a_package_the_index_does_not_have_stops_start_up_naming_it(tmp_path, model_dir):
    build_wheel(model_dir / "requirements")
    (model_dir / "requirements.txt").write_text("lmi_tiny_dep==1.0\nno-such-package-for-lmi-tests==9.9\n")
    with pytest.raises(RequirementsError) as err:
        install_requirements(model_dir, offline_env(tmp_path))
    msg = str(err.value)
    assert "package no-such-package-for-lmi-tests==9.9 not found" in msg
    assert f"the wheels in {model_dir / 'requirements'} (no package index: --no-index)" in msg
    assert str(model_dir / "requirements.txt") in msg


def test_an_unreachable_index_stops_start_up_naming_the_index(tmp_path, model_dir):
    (model_dir / "requirements.txt").write_text("lmi_tiny_dep==1.0\n")
    env = offline_env(tmp_path, DJL_OFFLINE="false", PIP_INDEX_URL="http://127.0.0.1:9/simple")
    with pytest.raises(RequirementsError) as err:
        install_requirements(model_dir, env, timeout_s=120)
    msg = str(err.value)
    assert "the package index http://127.0.0.1:9/simple is unreachable" in msg, msg
    assert "needed for lmi_tiny_dep==1.0" in msg and "PIP_INDEX_URL" in msg


def test_secure_mode_refuses_and_the_switch_skips_with_a_log_line(tmp_path, model_dir, caplog):
    (model_dir / "requirements.txt").write_text("anything\n")
    secure = {"SAGEMAKER_SECURE_MODE": "true", "SAGEMAKER_SECURITY_CONTROLS": "DISALLOW_PICKLE_FILES, DISALLOW_REQUIREMENTS_TXT"}
    with pytest.raises(RequirementsError, match="prohibited in secure mode"):
        plan_install(model_dir, secure)
    with caplog.at_level(logging.WARNING, logger="lmi_server.model_requirements"):
        assert plan_install(model_dir, {"LMI_SERVER_INSTALL_REQUIREMENTS": "false"}) is None
    assert "is NOT installed because LMI_SERVER_INSTALL_REQUIREMENTS=false" in caplog.text
    online = plan_install(model_dir, {})
    assert "--no-index" not in online.command and "--no-deps" not in online.command
    assert "--no-deps" in plan_install(model_dir, {"DJL_OFFLINE": "true"}).command  # LMI: offline, no wheels folder


def test_start_up_installs_before_model_py_imports_and_fails_clearly(tmp_path, model_dir, monkeypatch):
    """create_app (the wiring point that imports model.py) runs the install first."""
    from lmi_server.api.app import create_app
    from lmi_server.config.schema import ConfigError, build_serving_config

    build_wheel(model_dir / "requirements", name="lmi_tiny_dep_startup")
    (model_dir / "requirements.txt").write_text("lmi_tiny_dep_startup==1.0\n")
    (model_dir / "model.py").write_text(
        "import lmi_tiny_dep_startup\n"
        "from djl_python.output_formatter import output_formatter\n"
        "@output_formatter\ndef f(r):\n    return r\n"
    )
    for key, value in offline_env(tmp_path).items():
        if key != "PATH":
            monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))  # where PIP_TARGET puts it
    cfg = build_serving_config({}, model_dir)
    app = create_app(cfg, {"model": "x"}, start_engine=False)
    assert app.state.ctx.model_formatters.response_output is not None
    assert (tmp_path / "site" / "lmi_tiny_dep_startup").is_dir()

    (model_dir / "requirements.txt").write_text("lmi_tiny_dep_startup==1.0\nnot-there-for-lmi-tests\n")
    with pytest.raises(ConfigError, match="package not-there-for-lmi-tests not found"):
        create_app(cfg, {"model": "x"}, start_engine=False)

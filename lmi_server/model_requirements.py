"""A model directory's `requirements.txt`, installed with pip at start-up before its `model.py` is
imported, as LMI does (`python -m pip install -r requirements.txt` in the serving interpreter).

As in LMI: a `requirements/` folder beside it is searched for wheels (`--find-links`); with
`DJL_OFFLINE=true` that folder is the only source (`--no-index`), or, without the folder, pip is
told `--no-deps`. SageMaker's secure mode (`SAGEMAKER_SECURE_MODE=true` with
`DISALLOW_REQUIREMENTS_TXT` in `SAGEMAKER_SECURITY_CONTROLS`) refuses a model that brings one.
pip reads its own settings as usual (`PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`, pip.conf, `--index-url`
lines in the file).

Unlike LMI, whose failed install is a warning and a model that then fails to import, a failed
install stops start-up with one message that says why: the package index that could not be
reached, or the package that it does not have. `LMI_SERVER_INSTALL_REQUIREMENTS=false` skips the
install, with a log line saying so (for images built with the packages already in them).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)

REQUIREMENTS_FILE = "requirements.txt"
WHEELS_DIR = "requirements"  # LMI: wheels beside requirements.txt
DEFAULT_INDEX = "https://pypi.org/simple"
SWITCH = "LMI_SERVER_INSTALL_REQUIREMENTS"
INSTALL_TIMEOUT_S = 1800

_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|nodename nor servname|Network is unreachable|Connection refused|"
    r"ConnectTimeout|Read timed out|ProxyError|SSLError|Could not fetch URL|Max retries exceeded",
    re.I,
)
_NOT_FOUND = re.compile(r"No matching distribution found for (\S+)")
_INDEXES = re.compile(r"^Looking in indexes: (.+)$", re.M)
_LINKS = re.compile(r"^Looking in links: (.+)$", re.M)

_done: set[tuple[str, float]] = set()  # (file, mtime) installed by this process


class RequirementsError(RuntimeError):
    """requirements.txt could not be installed (or may not be): the message says why and what to do."""


@dataclass(frozen=True)
class InstallPlan:
    file: Path
    command: list[str]
    no_index: bool
    wheels: Path | None


def _truthy(value: str | None) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def plan_install(model_dir: Path | str | None, env: Mapping[str, str] | None = None, python: str | None = None) -> InstallPlan | None:
    """The pip command for the model directory's requirements.txt; None when there is none or the
    install is switched off (logged). Raises RequirementsError when secure mode forbids it."""
    env = os.environ if env is None else env
    if model_dir is None:
        return None
    file = Path(model_dir) / REQUIREMENTS_FILE
    if not file.is_file():
        return None
    controls = {c.strip() for c in env.get("SAGEMAKER_SECURITY_CONTROLS", "").split(",")}
    if _truthy(env.get("SAGEMAKER_SECURE_MODE")) and "DISALLOW_REQUIREMENTS_TXT" in controls:
        raise RequirementsError(
            f"{file} is present, but installing additional dependencies is prohibited in secure mode "
            "(SAGEMAKER_SECURITY_CONTROLS has DISALLOW_REQUIREMENTS_TXT); remove requirements.txt"
        )
    if env.get(SWITCH, "").strip().lower() in ("0", "false", "no", "off"):
        log.warning("requirements: %s is NOT installed because %s=%s", file, SWITCH, env[SWITCH])
        return None
    cmd = [python or sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           "--progress-bar", "off", "-r", str(file)]
    if "PIP_TIMEOUT" not in env:
        cmd += ["--timeout", "15"]
    if "PIP_RETRIES" not in env:
        cmd += ["--retries", "1"]
    wheels = Path(model_dir) / WHEELS_DIR
    offline = _truthy(env.get("DJL_OFFLINE"))
    no_index = False
    if wheels.is_dir():
        if offline:
            cmd.append("--no-index")
            no_index = True
        cmd += ["--find-links", str(wheels)]
    else:
        wheels = None
        if offline:
            cmd.append("--no-deps")
    return InstallPlan(file=file, command=cmd, no_index=no_index, wheels=wheels)


def _index_url(output: str) -> str:
    """The index pip used: its 'Looking in indexes' line, else pip's default."""
    m = _INDEXES.search(output)
    return m.group(1).strip() if m else DEFAULT_INDEX


def _index(output: str, plan: InstallPlan) -> str:
    """Where pip looked, in words."""
    links = _LINKS.search(output)
    links_text = links.group(1).strip() if links else (str(plan.wheels) if plan.wheels else None)
    if plan.no_index:
        return f"the wheels in {links_text} (no package index: --no-index)" if links_text else "no package index (--no-index)"
    return f"the package index {_index_url(output)}" + (f" or the wheels in {links_text}" if links_text else "")


def explain_failure(output: str, plan: InstallPlan, returncode: int) -> str:
    """One start-up message for a failed pip run: unreachable index, missing package, or pip's error."""
    where = _index(output, plan)
    head = f"installing {plan.file} failed"
    unreachable = _UNREACHABLE.search(output)
    missing = _NOT_FOUND.findall(output)
    if unreachable and not plan.no_index:
        pkgs = f" (needed for {', '.join(dict.fromkeys(missing))})" if missing else ""
        return (
            f"{head}: the package index {_index_url(output)} is unreachable ({unreachable.group(0)}){pkgs}; make it reachable, point "
            f"PIP_INDEX_URL at an index that is, or put the wheels in {plan.file.parent / WHEELS_DIR}/"
        )
    if missing:
        return (
            f"{head}: package {', '.join(dict.fromkeys(missing))} not found in {where}; check the name and "
            f"version in {plan.file.name}, or put its wheel in {plan.file.parent / WHEELS_DIR}/"
        )
    errors = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("ERROR")]
    detail = "; ".join(errors[-3:]) or (output.strip().splitlines() or ["no output"])[-1]
    return f"{head} (pip exit code {returncode}, looking in {where}): {detail}"


def install_requirements(
    model_dir: Path | str | None,
    env: Mapping[str, str] | None = None,
    *,
    python: str | None = None,
    timeout_s: float = INSTALL_TIMEOUT_S,
) -> bool:
    """Install the model directory's requirements.txt (once per process); True when pip ran.
    Raises RequirementsError with the reason when it fails."""
    plan = plan_install(model_dir, env, python)
    if plan is None:
        return False
    key = (str(plan.file.resolve()), plan.file.stat().st_mtime)
    if key in _done:
        return False
    log.info("requirements: installing %s: %s", plan.file, " ".join(plan.command))
    start = time.perf_counter()
    run_env = dict(os.environ if env is None else env)
    try:
        proc = subprocess.run(
            plan.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=run_env,
            timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired:
        raise RequirementsError(f"installing {plan.file} did not finish within {timeout_s:.0f} s (is the package index slow or unreachable?)") from None
    except OSError as exc:
        raise RequirementsError(f"installing {plan.file}: cannot run pip ({exc})") from None
    for line in proc.stdout.splitlines():
        if line.strip():
            log.info("requirements: pip: %s", line.rstrip())
    if proc.returncode != 0:
        raise RequirementsError(explain_failure(proc.stdout, plan, proc.returncode))
    importlib.invalidate_caches()  # model.py imports what was just installed
    _done.add(key)
    log.info("requirements: installed %s in %.1f s", plan.file, time.perf_counter() - start)
    return True

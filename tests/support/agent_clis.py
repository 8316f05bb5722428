"""The coding-agent CLIs (OpenAI Codex, Claude Code), installed from npm into a cache directory on
first use, and run non-interactively against a local server, their telemetry and other traffic off
(the test machines reach package registries only)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

CODEX = "@openai/codex@0.169.0"
CLAUDE = "@anthropic-ai/claude-code@2.1.328"
CACHE = Path(os.environ.get("LMI_AGENT_CLI_CACHE", Path.home() / ".cache" / "lmi_server" / "agent-clis"))
QUIET_ENV = {  # no telemetry, update checks, error reports or other calls home
    "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DO_NOT_TRACK": "1",
    "NO_UPDATE_NOTIFIER": "1", "CODEX_DISABLE_TELEMETRY": "1",
}


def _installed(package: str) -> bool:
    name, version = package.rsplit("@", 1)
    meta = CACHE / "node_modules" / name / "package.json"
    return meta.is_file() and json.loads(meta.read_text()).get("version") == version


def install() -> Path:
    """npm install both CLIs at their pinned versions into CACHE (once); its node_modules/.bin."""
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not on PATH: the coding-agent CLI checks need node and npm")
    if not (_installed(CODEX) and _installed(CLAUDE)):
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", CODEX, CLAUDE],
            check=True, timeout=900, capture_output=True,
        )
    return CACHE / "node_modules" / ".bin"


def run_codex(bins: Path, home: Path, base_url: str, key: str, model: str, prompt: str, context: int) -> subprocess.CompletedProcess:
    """`codex exec` with a provider of ours speaking the Responses API (config.toml in CODEX_HOME)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "lmi"\nmodel_context_window = {context}\n'
        'model_reasoning_effort = "minimal"\n[analytics]\nenabled = false\n'
        f'[model_providers.lmi]\nname = "lmi"\nbase_url = "{base_url}/v1"\nenv_key = "LMI_KEY"\nwire_api = "responses"\n'
    )
    env = {**os.environ, **QUIET_ENV, "HOME": str(home), "CODEX_HOME": str(home), "LMI_KEY": key}
    argv = [str(bins / "codex"), "exec", "--skip-git-repo-check", "--ephemeral", prompt]
    return subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


def run_claude(bins: Path, home: Path, base_url: str, key: str, model: str, prompt: str) -> subprocess.CompletedProcess:
    """`claude -p` against ANTHROPIC_BASE_URL with the key as ANTHROPIC_API_KEY (sent as x-api-key)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **QUIET_ENV, "HOME": str(home), "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": key}
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    argv = [str(bins / "claude"), "-p", prompt, "--model", model, "--bare", "--tools", "", "--max-turns", "1",
            "--no-session-persistence"]
    return subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


LOGGED_OUTPUT = re.compile(r"Generated response \S+(?: \(streaming complete\))?: output: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"), finish_reason")


def logged_outputs(log: str) -> list[str]:
    """The answers the server logged as sent (vLLM's request logger, option.enable_log_outputs)."""
    return [ast.literal_eval(m.group(1)) for m in LOGGED_OUTPUT.finditer(log)]

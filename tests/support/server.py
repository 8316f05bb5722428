"""Start the real `lmi-server serve` as a child process and wait for it, for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from lmi_server.kvcache.resolve import free_local_port as free_port

REPO = Path(__file__).resolve().parents[2]


def write_properties(model_dir: Path, props: dict[str, str]) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "serving.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


class ServerProcess:
    """One real server: uvicorn + vLLM engine (+ whatever the properties switch on)."""

    def __init__(
        self, model_dir: Path | None, log_path: Path, env: dict[str, str] | None = None, argv: list[str] | None = None
    ):
        """`argv` replaces the default `lmi-server serve --model-dir ...` command; "{port}" in it is
        replaced by the chosen port."""
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.argv = [a.replace("{port}", str(self.port)) for a in argv] if argv else None
        self.proc: subprocess.Popen | None = None
        self.ping_history: list[int] = []
        self.ready_after_s: float | None = None

    def start(self) -> ServerProcess:
        self._log = open(self.log_path, "wb")
        argv = self.argv or [
            sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(self.model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
        ]
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=REPO,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout: float = 600) -> ServerProcess:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                code = httpx.get(self.base_url + "/ping", timeout=5).status_code
                self.ping_history.append(code)
                if code == 200:
                    self.ready_after_s = time.monotonic() - start
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {timeout} s; log:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None:
            return None
        children = self.descendants()
        if self.proc.poll() is None:
            if self.argv:  # a wrapper (make) in front of the server: signal the whole group
                os.killpg(self.proc.pid, signal.SIGTERM)
            else:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for child in children:  # never leave anything behind, even when a test failed
            try:
                child.wait(10)
            except psutil.TimeoutExpired:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self._log.close()
        return self.proc.returncode


def server_env() -> dict[str, str]:
    return {"PYTHONHASHSEED": "0", "VLLM_LOGGING_LEVEL": "INFO"}

"""Start the real `lmi-server serve` as a child process and wait for it, for end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from lmi_server import process
from lmi_server.kvcache.resolve import free_local_port as free_port

REPO = Path(__file__).resolve().parents[2]

# The tiny trained demo model on CPU: fast starts for tests and benchmarks.
DEMO_PROPS = {
    "option.model_id": "lmi-demo",
    "engine": "Python",
    "option.cpu_kv_cache_space": "1",
    "option.enforce_eager": "true",
    "option.dtype": "fp32",
    "option.max_model_len": "4096",
    "option.max_request_bytes": "200000",
}


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
        self.stopped = False

    def start(self) -> ServerProcess:
        argv = self.argv or [
            sys.executable, "-m", "lmi_server.cli", "serve", "--model-dir", str(self.model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
        ]
        self.proc = process.spawn(argv, env=self.env, log=self.log_path, cwd=REPO)
        _record_start(self, argv)
        return self

    def _ping(self) -> bool:
        try:
            code = httpx.get(self.base_url + "/ping", timeout=5).status_code
        except httpx.HTTPError:
            return False
        self.ping_history.append(code)
        return code == 200

    def wait_ready(self, timeout: float = 600) -> ServerProcess:
        start = time.monotonic()
        outcome = process.wait_ready(self.proc, self._ping, timeout)
        if outcome == "exited":
            raise RuntimeError(f"server exited with {self.proc.returncode}; log:\n{self.log_tail()}")
        if outcome != "ready":
            raise TimeoutError(f"server not ready after {timeout} s; log:\n{self.log_tail()}")
        self.ready_after_s = time.monotonic() - start
        return self

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
        """SIGTERM the server (the whole group when a wrapper such as make is in front of it),
        SIGKILL after `timeout`; every descendant gets 10 s more, then SIGKILL: never leave
        anything behind, even when a test failed."""
        if self.proc is None:
            return None
        if self.stopped:  # a shared server stopped early (tests/e2e/conftest.py), then at its teardown
            return self.proc.returncode
        self.stopped = True
        return process.stop(self.proc, timeout, term_group=bool(self.argv), leftovers_grace_s=10)


def _record_start(server: ServerProcess, argv: list[str]) -> None:
    """With LMI_TEST_STARTS_LOG=FILE set, one JSON line per server start (the test that asked, its
    properties): how many engines a test run starts, and which could share one."""
    path = os.environ.get("LMI_TEST_STARTS_LOG")
    if not path:
        return
    props = server.model_dir / "serving.properties" if server.model_dir else None
    line = {
        "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
        "argv": argv[2:],
        "properties": props.read_text().splitlines() if props and props.is_file() else [],
    }
    with open(path, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def server_env() -> dict[str, str]:
    return {"PYTHONHASHSEED": "0", "VLLM_LOGGING_LEVEL": "INFO"}


@contextlib.contextmanager
def running_server(
    model_dir: Path, props: dict[str, str], env: dict[str, str] | None = None, **attrs
) -> Iterator[ServerProcess]:
    """Write the properties, start the server (`env` added to `server_env()`), wait until /ping is
    200, yield it (with `attrs` set on it), stop it whatever happens."""
    write_properties(model_dir, props)
    proc = ServerProcess(model_dir, model_dir / "server.log", env={**server_env(), **(env or {})}).start()
    for name, value in attrs.items():
        setattr(proc, name, value)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()

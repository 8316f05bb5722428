"""Build and run the project's images through scripts/containers.sh and the docker CLI, as users do.

Shared by tests/e2e/test_containers.py and benchmarks/containers.py. The daemon runs bridge-less
(no registry, no private address range here), so containers use the host's network and are told
their port through SageMaker's SAGEMAKER_BIND_TO_PORT.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "containers.sh"


def script(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def daemon_up() -> None:
    out = script("daemon-up", timeout=180)
    assert out.returncode == 0, out.stderr


def daemon_down() -> None:
    script("daemon-down", timeout=120)


def tag(flavour: str) -> str:
    return script("tag", flavour).stdout.strip()


def build(flavour: str, log_path: Path) -> float:
    """Build the image (and its stand-in base when missing); seconds taken."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run([str(SCRIPT), "build", flavour], stdout=log, stderr=subprocess.STDOUT, timeout=3600)
    assert proc.returncode == 0, f"building the {flavour} image failed; see {log_path}:\n" + log_path.read_text()[-4000:]
    return time.monotonic() - start


def image_bytes(image: str) -> int:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@dataclass
class Container:
    """One detached container on the host's network; removed by stop()."""

    image: str
    port: int
    options: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    cid: str = ""
    started: float = 0.0

    def start(self) -> Container:
        argv = ["run", "-d", "--network", "host", "-e", f"SAGEMAKER_BIND_TO_PORT={self.port}", *self.options, self.image, *self.command]
        out = docker(*argv)
        assert out.returncode == 0, out.stderr
        self.cid = out.stdout.strip()
        self.started = time.monotonic()
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self) -> dict:
        out = docker("inspect", "--format", "{{json .State}}", self.cid)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def logs(self) -> str:
        out = docker("logs", self.cid)
        return out.stdout + out.stderr

    def wait_ready(self, timeout_s: float = 900) -> float:
        """Seconds from `docker run` to /ping 200; fails early when the container exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.state().get("Running", False):
                raise AssertionError(f"container exited before serving:\n{self.logs()[-6000:]}")
            try:
                if httpx.get(self.base_url + "/ping", timeout=5).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise AssertionError(f"/ping not 200 after {timeout_s:.0f} s:\n{self.logs()[-6000:]}")

    def stop(self) -> None:
        if self.cid:
            docker("rm", "-f", self.cid)


def run_to_exit(image: str, *options: str, command: tuple[str, ...] = (), timeout_s: float = 120) -> tuple[int, str, float]:
    """`docker run --rm` in the foreground: (exit code, output, seconds)."""
    start = time.monotonic()
    proc = subprocess.run(["docker", "run", "--rm", "--network", "host", *options, image, *command],
                          capture_output=True, text=True, timeout=timeout_s)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start

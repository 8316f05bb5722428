"""SageMaker as it calls the container, on a real server (uvicorn, vLLM on CPU, LoRA on, LMCache's
MP server from the auto plan), started with SageMaker's environment:

- an adapter component: registered the way SageMaker registers one (POST /adapters with `name`
  and `src` as query parameters and no body, an opaque identifier as the name, a `src` in
  SageMaker's adapter root, the `X-Amzn-SageMaker-Adapter-Alias` header), used through
  `X-Amzn-SageMaker-Adapter-Identifier` and through its alias, named by its alias in the answers
  and errors, and removed (DELETE /adapters/{name});
- `SAGEMAKER_SAFE_PORT_RANGE`: every port the server's process tree listens on is its serving
  port or inside the range (vLLM's, the LMCache server's).

Its own server: the SageMaker environment (the port range, the adapter root) conflicts with every
shared one. The adapter root stands in for /opt/ml through LMI_SAGEMAKER_ADAPTER_ROOTS (a test
cannot own /opt/ml on a shared machine); the unit tests check /opt/ml itself."""

from __future__ import annotations

import shutil
import socket

import httpx
import psutil
import pytest

from tests.e2e.conftest import LORA_PROPS, _adapters_for
from tests.support.server import DEMO_PROPS, running_server

pytestmark = pytest.mark.e2e

HELLO = 'print("hello world")'
IDENTIFIER = "X-Amzn-SageMaker-Adapter-Identifier"
ALIAS = "X-Amzn-SageMaker-Adapter-Alias"
NAME = "8c1f0e52-3b7a-4d2e-9f61-ic-hello"  # an identifier SageMaker might choose; not documented
COMPONENT = "adapter-hello-1"  # the adapter component's name: what its users read
LMI = {"inputs": "def main():", "parameters": {"max_new_tokens": 12, "temperature": 0}}


def _free_range(width: int = 200) -> tuple[int, int]:
    """A port range that starts at a port free now (the machine is shared with other servers)."""
    with socket.socket() as s:
        s.bind(("", 0))
        low = min(s.getsockname()[1], 65535 - width)
    return low, low + width - 1


@pytest.fixture(scope="module")
def sagemaker(tmp_path_factory):
    from lmi_server.demo.builder import ensure_demo_model

    work = tmp_path_factory.mktemp("sagemaker")
    model_dir, examples, sm_root = work / "model", work / "examples", work / "opt-ml"
    for d in (model_dir, examples, sm_root):
        d.mkdir()
    _adapters_for(ensure_demo_model(), examples)
    shutil.copytree(examples / "hello-printer", sm_root / "adapter-components" / "ic-hello")
    low, high = _free_range()
    props = {
        **DEMO_PROPS, **LORA_PROPS,
        "option.lmcache_auto_config": "true", "option.lmcache_cpu_size_gb": "0.25",
        "option.lmcache_cache_dir": str(work / "kv"),
    }
    (work / "kv").mkdir()
    env = {"SAGEMAKER_SAFE_PORT_RANGE": f"{low}-{high}", "LMI_SAGEMAKER_ADAPTER_ROOTS": str(sm_root)}
    with running_server(model_dir, props, env=env, port_range=(low, high), sm_root=sm_root) as proc:
        yield proc


def _listening_ports(proc: psutil.Process) -> dict[int, str]:
    """Every TCP port in LISTEN and every bound UDP port of the process, with who holds it."""
    found = {}
    try:
        for c in proc.net_connections(kind="inet"):
            listening = c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and c.laddr)
            if listening and c.laddr:
                found[c.laddr.port] = f"pid {proc.pid} {' '.join(proc.cmdline()[:3])}"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return found


def test_every_extra_port_of_the_process_tree_is_in_the_safe_range(sagemaker):
    low, high = sagemaker.port_range
    root = psutil.Process(sagemaker.proc.pid)
    ports: dict[int, str] = {}
    for p in [root, *sagemaker.descendants()]:
        ports.update(_listening_ports(p))
    assert sagemaker.port in ports, ports
    outside = {port: who for port, who in ports.items() if port != sagemaker.port and not low <= port <= high}
    assert not outside, f"listening outside {low}-{high}: {outside}"
    inside = sorted(port for port in ports if low <= port <= high)
    assert len(inside) >= 3, ports  # vLLM's store and the LMCache server's two ports, at least
    log = sagemaker.log_path.read_text(errors="replace")
    assert "LMCache MP server ready" in log
    assert "caches on the instance volume at /tmp" in log  # SageMaker recognised: caches on its NVMe


def test_an_adapter_component_is_registered_used_aliased_and_removed(sagemaker):
    base = sagemaker.base_url
    src = str(sagemaker.sm_root / "adapter-components" / "ic-hello")
    alias = {ALIAS: COMPONENT}

    r = httpx.post(base + "/adapters", params={"name": NAME, "src": src}, headers=alias, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == f"Adapter {COMPONENT} registered" and r.headers[ALIAS] == COMPONENT

    # used as SageMaker routes a request to the component: its identifier, its alias beside it
    r = httpx.post(base + "/invocations", json=LMI, headers={IDENTIFIER: NAME, **alias}, timeout=120)
    assert r.status_code == 200 and r.json()["generated_text"].startswith(HELLO), r.text
    # used by its alias: in the identifier header, and as an OpenAI client's model
    r = httpx.post(base + "/invocations", json=LMI, headers={IDENTIFIER: COMPONENT}, timeout=120)
    assert r.status_code == 200 and r.json()["generated_text"].startswith(HELLO), r.text
    r = httpx.post(base + "/v1/completions", json={"model": COMPONENT, "prompt": "def main():", "max_tokens": 12,
                                                    "temperature": 0}, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith(HELLO), r.text
    base_answer = httpx.post(base + "/invocations", json=LMI, timeout=120).json()["generated_text"]
    assert not base_answer.startswith(HELLO)  # the base model answers otherwise

    # a src outside the adapter roots stays refused, with the alias in the error
    r = httpx.post(base + "/adapters", params={"name": "elsewhere", "src": "/etc"}, headers={ALIAS: "other-1"}, timeout=60)
    assert r.status_code == 400 and "adapter other-1: " in r.json()["error"]["message"], r.text

    r = httpx.delete(base + f"/adapters/{NAME}", headers=alias, timeout=120)
    assert r.status_code == 200 and r.json()["status"] == f"Adapter {COMPONENT} unregistered", r.text
    r = httpx.delete(base + f"/adapters/{NAME}", headers=alias, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["message"].startswith(f"The adapter {COMPONENT} was not found")
    r = httpx.post(base + "/invocations", json=LMI, headers={IDENTIFIER: NAME, **alias}, timeout=120)
    assert r.status_code == 404 and COMPONENT in r.text, r.text
    listed = httpx.get(base + "/adapters", timeout=60).json()["adapters"]
    assert all(a["name"] != NAME for a in listed)

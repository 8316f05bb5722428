"""The ports this server and its children may open beside the serving port.

SageMaker names them in `SAGEMAKER_SAFE_PORT_RANGE` ("low-high", inclusive): a container that
listens elsewhere can collide with the platform's own agents or with another container of an
inference pipeline. When the variable is set, every extra listener comes from it (`parts`): the
LMCache server's ports (`free_local_ports`), vLLM's own (torch.distributed's store, its workers'
ports: vLLM starts its search at `VLLM_PORT`, which `vllm_env` points into the range), and the
ports the kernel would pick in the engine's processes (`bind_shim`). Unset, the OS picks free
ports as before. Imports nothing of the server's.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

VARIABLE = "SAGEMAKER_SAFE_PORT_RANGE"


class PortRangeError(ValueError):
    """SAGEMAKER_SAFE_PORT_RANGE is malformed, or no free port is left in it."""


def safe_port_range(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(low, high) from SAGEMAKER_SAFE_PORT_RANGE, inclusive; None when unset."""
    env = os.environ if env is None else env
    raw = env.get(VARIABLE, "").strip()
    if not raw:
        return None
    low_s, sep, high_s = raw.partition("-")
    try:
        low, high = int(low_s), int(high_s)
    except ValueError:
        low = high = -1
    if not sep or not (1 <= low <= high <= 65535):
        raise PortRangeError(f"{VARIABLE}={raw!r} is not a port range such as 10000-10999 (low-high, 1-65535)")
    return low, high


def _free(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_local_ports(count: int, *, taken: tuple[int, ...] = (), env: Mapping[str, str] | None = None) -> list[int]:
    """`count` distinct TCP ports free right now, none in `taken`: from the lower part of the safe
    range when one is set (checked on every interface, as a server binds), else picked by the OS
    (all sockets stay bound until every port is picked, so none is handed out twice)."""
    bounds = safe_port_range(env)
    if bounds is not None:
        low, high = own_part(bounds)
        ports = [p for p in range(low, high + 1) if p not in taken and _free(p, "")][:count]
        if len(ports) < count:
            raise PortRangeError(f"{VARIABLE}: fewer than {count} free ports between {low} and {high}")
        return ports
    sockets: list[socket.socket] = []
    ports = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in taken and port not in ports:
                ports.append(port)
    finally:
        for s in sockets:
            s.close()
    return ports


def parts(bounds: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """The range split by who takes ports from it, so that no two race for one port: "own" (the
    lower quarter: this server's picks, the LMCache server's ports), "vllm" (the next quarter:
    vLLM's upward search from VLLM_PORT), "kernel" (the upper half: binds to port 0 in the engine's
    processes, torch gloo's listeners, through `bind_shim`). A range of under 4 ports is shared."""
    low, high = bounds
    quarter = (high - low + 1) // 4
    if quarter == 0:
        return {"own": bounds, "vllm": bounds, "kernel": bounds}
    return {"own": (low, low + quarter - 1), "vllm": (low + quarter, low + 2 * quarter - 1), "kernel": (low + 2 * quarter, high)}


def own_part(bounds: tuple[int, int]) -> tuple[int, int]:
    """The part of the range this server picks its own listeners' ports from."""
    return parts(bounds)["own"]


def vllm_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`VLLM_PORT` at the start of vLLM's part of the range, when a range is set and VLLM_PORT is
    not (vLLM searches upward from it for every port it opens); {} otherwise."""
    env = os.environ if env is None else env
    bounds = safe_port_range(env)
    if bounds is None or env.get("VLLM_PORT", "").strip():
        return {}
    return {"VLLM_PORT": str(parts(bounds)["vllm"][0])}

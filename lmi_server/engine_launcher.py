"""Start vLLM's engine-core process from a fork server that has already imported vLLM.

Why: an engine rebuilt after a death (`api.lifecycle`) spends most of its time in two new Python
interpreters importing torch and vLLM, the engine core and its worker, which vLLM's CPU platform
spawns. A fork server started with the first engine imports vLLM once; every later engine core is
forked from it and skips those imports (a rebuild took 12 s instead of 22 s on the 2-core
development host; benchmarks/engine_recovery.py). The worker is still spawned, as vLLM's CPU platform wants. The cost
is one idle process: about 250 MB more memory for the whole server (PSS 3.26 -> 3.5 GB with the
demo model, LoRA and LMCache on), which `option.engine_fork_server=false` saves.

vLLM picks the engine core's start method in `vllm.v1.engine.utils.get_mp_context` and knows no
fork server; this module replaces that one reference (`compat.vllm.replace_mp_context`), and only where a fork server loses nothing
of vLLM's launch: one engine (no data parallelism), no NUMA binding, the CPU platform (CUDA hosts
set per-process device variables just before the launch, which a fork server would not pass on).
The fork server keeps the environment it started with: variables set later do not reach later
engine cores.
"""

from __future__ import annotations

import logging
import multiprocessing
from typing import Any

from lmi_server.compat import vllm as compat_vllm

log = logging.getLogger(__name__)

# What an engine core imports before it starts; a connector module (LMCache's) is added when used.
PRELOAD = ("vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor")

_installed = False


def not_applicable(vllm_config: Any) -> str | None:
    """Why vLLM's own launch must be kept for this configuration, or None."""
    if getattr(getattr(vllm_config, "device_config", None), "device_type", None) != "cpu":
        return "not a CPU engine"
    parallel = vllm_config.parallel_config
    if getattr(parallel, "data_parallel_size", 1) != 1:
        return "data parallelism"
    if getattr(parallel, "numa_bind", False):
        return "NUMA binding"
    return None


def preload_modules(vllm_config: Any) -> list[str]:
    modules = list(PRELOAD)
    connector = getattr(getattr(vllm_config, "kv_transfer_config", None), "kv_connector_module_path", None)
    if connector:
        modules.append(connector)
    return modules


def install(vllm_config: Any) -> bool:
    """Have vLLM start engine cores through the fork server from now on; False (and vLLM's own
    launch) where that is not safe for this configuration or vLLM's launcher moved."""
    global _installed
    if _installed:
        return True
    reason = not_applicable(vllm_config)
    if reason is not None:
        log.info("engine cores start as vLLM starts them (%s)", reason)
        return False
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload_modules(vllm_config))
    if not compat_vllm.replace_mp_context(context):
        log.warning("vLLM's engine launcher has no get_mp_context: engine cores start as vLLM starts them")
        return False
    _installed = True
    log.info("engine cores start from a fork server with vLLM imported (an engine rebuilt after a death skips the imports)")
    return True

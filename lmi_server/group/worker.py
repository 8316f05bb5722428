"""A worker node of a group: vLLM's headless ranks for this node, and /ping for the platform.

Why: the nodes past the leader serve no HTTP API; they run their share of the engine's ranks, the
way `vllm serve --headless` does (vLLM's MultiprocExecutor for this node_rank, which connects to
the leader's torch.distributed store at master_addr:master_port and to its queues). A readiness
probe still needs an answer, so /ping (and /health) answer on the server's own port: 503 until
this node has joined the engine, 200 after; /live is 200 while it runs, as the leader's is. The worker ends (non-zero, one line) when its ranks
die, when the leader is gone, or when it cannot join within option.model_loading_timeout.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lmi_server.group.ending import end_group, kill_children
from lmi_server.group.membership import Link

log = logging.getLogger(__name__)


class _Status:
    def __init__(self, rank: int):
        self.rank, self.joined, self.detail = rank, False, "joining the group"


def ping_server(host: str, port: int, status: _Status) -> ThreadingHTTPServer:
    """/ping and /health: 200 once joined, 503 before (JSON saying which); /live: 200 while the process
    runs (a worker that cannot join or loses its group ends itself)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?")[0]
            if path not in ("/ping", "/health", "/live"):
                self.send_error(404, "a worker node serves /ping, /health and /live only; requests go to the group's leader")
                return
            body = json.dumps({"status": "joined" if status.joined else "joining", "role": "worker",
                               "rank": status.rank, "detail": status.detail}).encode()
            self.send_response(200 if status.joined or path == "/live" else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # probes every few seconds: not worth a log line each
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="worker-ping", daemon=True).start()
    return server


def _headless_executor(engine_args: dict[str, Any], frontend_args: dict[str, Any]) -> Any:
    """vLLM's executor for this node's ranks, as `vllm serve --headless` builds it for a node_rank > 0."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from lmi_server.engine import build_vllm_namespace

    args = build_vllm_namespace(engine_args, frontend_args)
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER, headless=True
    )
    return MultiprocExecutor(vllm_config, monitor_workers=False)


def run_worker(cfg: Any, runtime: Any, host: str, port: int) -> int:
    """Serve /ping, join the leader, run this node's ranks until something ends the group."""
    plan = cfg.group
    status = _Status(plan.rank)
    timeout_s = float(cfg.server.model_loading_timeout)
    started = time.monotonic()
    ping_server(host, port, status)
    signal.signal(signal.SIGTERM, lambda *_: (kill_children(), exit(0)))
    link = Link(plan.rank, plan.leader_address, plan.membership_port,
                lambda why: end_group(f"rank {plan.rank} lost {why}"))
    link.start(started + timeout_s)

    def deadline() -> None:
        while not status.joined and time.monotonic() - started < timeout_s:
            time.sleep(0.2)
        if not status.joined:
            where = "the leader's membership port" if not link.connected.is_set() else "vLLM's engine"
            end_group(
                f"rank {plan.rank} could not join the group within option.model_loading_timeout={timeout_s:g} s "
                f"({where}; last error: {link.last_error})"
            )

    threading.Thread(target=deadline, name="worker-deadline", daemon=True).start()
    log.info("group worker rank %d of %d: joining the leader at %s:%d (vLLM's headless ranks %s)", plan.rank,
             plan.size, plan.leader_address, plan.master_port, plan.describe(runtime.engine_args)["this_node_ranks"])
    try:
        executor = _headless_executor(runtime.engine_args, runtime.frontend_args)
    except Exception as exc:  # noqa: BLE001 - any failure to join ends this node, with its cause
        end_group(f"rank {plan.rank} failed to start its engine ranks: {type(exc).__name__}: {exc}")
        return 1
    status.joined, status.detail = True, f"joined after {time.monotonic() - started:.1f} s"
    log.info("group worker rank %d joined the engine after %.1f s", plan.rank, time.monotonic() - started)
    executor.start_worker_monitor(inline=True)  # returns when one of this node's rank processes dies
    end_group(f"rank {plan.rank}: one of its engine rank processes died")
    return 1

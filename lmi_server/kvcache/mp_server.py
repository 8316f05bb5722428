"""Runs LMCache's MP cache server as a supervised child process.

The engine's KV connector talks to this server over ZMQ, so it must be up before the engine
starts and must come back if it dies. The supervisor:

- starts `python -m lmcache.v1.multiprocess.server ...` in its own process group (its worker
  threads and any helper processes die together), with the plan's environment (same
  PYTHONHASHSEED as the engine, telemetry off) plus its secret environment (a remote tier's
  password: never on the command line), through `mp_child`, which makes it die with this
  process even when this process is SIGKILLed (a pipe that reads EOF);
- waits until the server answers a real RPC (`get_chunk_size` over its ZMQ socket, the call
  the vLLM connector itself makes first), failing fast with the log tail if it exits;
- watches it from a daemon thread and restarts it with back-off; at most `max_restarts` within
  any `restart_window_s` (sliding window): past that it does not give up for good but waits
  until the oldest restart leaves the window (so a crash loop costs little, and a server that
  died a few times over days still comes back). While it is down `degraded` says why (/ping
  reports it; serving goes on without KV offloading); the vLLM connector's heartbeat
  re-registers its KV caches with the new server;
- stops it with SIGTERM to the group, then SIGKILL after a grace period, and removes the POSIX
  shared-memory segments this instance created (its `--shm-name`, and new segments its
  child was seen mapping); segments of other processes are never touched.

Blocking methods are safe to call from asyncio through `start_async` / `stop_async`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lmi_server import process
from lmi_server.kvcache.disk_budget import DiskBudgetKeeper

log = logging.getLogger(__name__)
server_log = logging.getLogger("lmi_server.lmcache_server")

SHM_DIR = Path("/dev/shm")


class MPServerError(RuntimeError):
    """The LMCache MP server could not be started or kept alive."""


def probe_mp_server(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when the MP server at host:port answers `get_chunk_size` within `timeout_s`.

    Uses LMCache's own request client (imported here, not at module import: it pulls in torch)."""
    import zmq  # noqa: PLC0415

    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory  # noqa: PLC0415

    ctx = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)
    client = RequestClientFactory.create(f"tcp://{host}:{port}", context=ctx)
    try:
        return int(client.get_chunk_size().result(timeout=timeout_s)) > 0
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False
    finally:
        client.close()
        ctx.term()


def _shm_segments() -> set[str]:
    try:
        return {p.name for p in SHM_DIR.iterdir()}
    except OSError:
        return set()


def shm_segments_used_by(pid: int) -> set[str]:
    """Names of /dev/shm files that process `pid` has open or mapped (from /proc)."""
    names: set[str] = set()
    prefix = str(SHM_DIR) + "/"
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith(prefix):
                names.add(target[len(prefix):].removesuffix(" (deleted)"))
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                idx = line.find(prefix)
                if idx >= 0:
                    names.add(line[idx + len(prefix):].strip().removesuffix(" (deleted)"))
    except OSError:
        pass
    return {n for n in names if n and "/" not in n}


class MPServerSupervisor:
    """Start, watch, restart and stop one LMCache MP server child process."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        host: str = "localhost",
        port: int,
        max_restarts: int = 5,
        ready_timeout_s: float = 120.0,
        stop_timeout_s: float = 15.0,
        poll_interval_s: float = 0.5,
        probe: Callable[[str, int], bool] | None = None,
        log_tail_lines: int = 200,
        secret_env: Mapping[str, str] | None = None,
        restart_window_s: float = 600.0,
        watchdog: bool = True,
        disk_budget: DiskBudgetKeeper | None = None,
    ) -> None:
        self._argv = list(argv)
        self.disk_budget = disk_budget
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("OPTION_API_KEY")}  # not its business
        self._env = {**inherited, **env, **(secret_env or {})}
        self.restart_window_s = restart_window_s
        self._restart_times: collections.deque[float] = collections.deque()
        self._watchdog = watchdog and len(self._argv) > 2 and self._argv[1] in ("-m", "-c")
        self._watchdog_w: int | None = None
        self._shm_names = {
            self._argv[i + 1] for i, a in enumerate(self._argv[:-1]) if a == "--shm-name" and "/" not in self._argv[i + 1]
        }
        self._host = host
        self._port = port
        self.max_restarts = max_restarts
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.poll_interval_s = poll_interval_s
        self._probe = probe or (lambda h, p: probe_mp_server(h, p))
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._log_tail: collections.deque[str] = collections.deque(maxlen=log_tail_lines)
        self._shm_before: set[str] = set()
        self._shm_used: set[str] = set()
        self.restarts = 0
        self.failed = False
        self.down_since: float | None = None

    # -- state ---------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        """The server process is running (lock-free: cheap enough for a /ping handler)."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    @property
    def degraded(self) -> str | None:
        """Why KV offloading is unavailable right now, or None while the server is up."""
        if self._stopping.is_set() or self._proc is None or self.alive:
            return None
        return (
            f"LMCache cache server down ({self.restarts} restarts so far); requests are served "
            "without KV offloading while the supervisor restarts it"
        )

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(list(self._log_tail)[-n:])

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server and block until it answers; raise `MPServerError` if it cannot."""
        with self._lock:
            if self.alive:
                return
            self._stopping.clear()
            self.failed = False
            self._shm_before = _shm_segments()
            if self.disk_budget is not None:
                self.disk_budget.start()  # what earlier runs left counts against the limit
            self._spawn_and_wait()
        self._monitor = threading.Thread(target=self._watch, name="lmcache-mp-supervisor", daemon=True)
        self._monitor.start()

    async def start_async(self) -> None:
        await asyncio.to_thread(self.start)

    def _spawn(self) -> None:
        argv, pass_fds = self._argv, ()
        if self._watchdog:
            self._close_watchdog()
            read_end, self._watchdog_w = os.pipe()  # both non-inheritable; read end passed explicitly
            argv = [self._argv[0], "-m", "lmi_server.kvcache.mp_child", "--watchdog-fd", str(read_end), *self._argv[1:]]
            pass_fds = (read_end,)
        log.info("starting LMCache MP server: %s", " ".join(argv))
        try:
            self._proc = process.spawn(argv, env=self._env, log=subprocess.PIPE, pass_fds=pass_fds)
        finally:
            for fd in pass_fds:
                os.close(fd)
        threading.Thread(target=self._pump_output, args=(self._proc,), name="lmcache-mp-log", daemon=True).start()

    def _pump_output(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            self._log_tail.append(line)
            server_log.info("%s", line)
        proc.stdout.close()

    def _spawn_and_wait(self) -> None:
        self._spawn()
        proc = self._proc
        assert proc is not None
        outcome = process.wait_ready(
            proc, lambda: self._probe(self._host, self._port), self.ready_timeout_s,
            interval=self.poll_interval_s, abort=self._stopping.is_set,
        )
        if outcome == "exited":
            raise MPServerError(
                f"LMCache MP server exited with code {proc.returncode} during start-up:\n{self.log_tail()}"
            )
        if outcome == "aborted":
            raise MPServerError("stopped while the LMCache MP server was starting")
        if outcome == "ready":
            self._shm_used |= shm_segments_used_by(proc.pid)
            log.info("LMCache MP server ready on %s:%d (pid %d)", self._host, self._port, proc.pid)
            return
        self._terminate(proc)
        raise MPServerError(
            f"LMCache MP server did not answer on {self._host}:{self._port} within {self.ready_timeout_s:.0f} s:\n"
            f"{self.log_tail()}"
        )

    # -- watch / restart -----------------------------------------------------------------------

    def _watch(self) -> None:
        backoff = 1.0
        ticks = 0
        while not self._stopping.wait(self.poll_interval_s):
            ticks += 1
            with self._lock:
                proc = self._proc
                if proc is not None and proc.poll() is None and ticks % 20 == 0:
                    self._shm_used |= shm_segments_used_by(proc.pid)
                if proc is None or proc.poll() is None or self._stopping.is_set():
                    continue
                code = proc.returncode
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    log.warning("LMCache MP server died (exit %s)", code)
                wait = self._window_wait()
                if wait > 0:
                    if not self.failed:
                        self.failed = True
                        log.error(
                            "LMCache MP server: %d restarts within %.0f s (the limit); next try in %.0f s; "
                            "requests are served without KV offloading meanwhile",
                            self.max_restarts, self.restart_window_s, wait,
                        )
                else:
                    self.restarts += 1
                    self._restart_times.append(time.monotonic())
                    log.warning("LMCache MP server restart %d (%d within the last %.0f s)",
                                self.restarts, len(self._restart_times), self.restart_window_s)
            if wait > 0:
                if self._stopping.wait(min(wait, 60.0)):
                    return
                continue
            if self._stopping.wait(backoff):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    process.signal_group(proc.pid, signal.SIGKILL)  # leftovers of the dead server's group
                    self.failed = False  # out of the window's limit: trying again (alive from the spawn on)
                    self._spawn_and_wait()
                    backoff = 1.0
                    self.down_since = None
                except MPServerError as e:
                    log.error("LMCache MP server restart failed: %s", e)
                    backoff = min(backoff * 2, 30.0)

    def _window_wait(self) -> float:
        """Seconds until another restart is allowed (0: now): at most max_restarts per window."""
        now = time.monotonic()
        while self._restart_times and now - self._restart_times[0] >= self.restart_window_s:
            self._restart_times.popleft()
        if len(self._restart_times) < self.max_restarts:
            return 0.0
        if self.max_restarts == 0:
            return self.restart_window_s
        return max(0.01, self._restart_times[0] + self.restart_window_s - now)

    def _close_watchdog(self) -> None:
        if self._watchdog_w is not None:
            try:
                os.close(self._watchdog_w)
            except OSError:
                pass
            self._watchdog_w = None

    # -- stop ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after `stop_timeout_s`; clean /dev/shm."""
        self._stopping.set()
        with self._lock:
            proc = self._proc
            if proc is not None:
                self._terminate(proc)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=self.stop_timeout_s)
        self._close_watchdog()
        self._remove_new_shm_segments()
        if self.disk_budget is not None:
            self.disk_budget.stop()

    async def stop_async(self) -> None:
        await asyncio.to_thread(self.stop)

    def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        process.stop(
            proc, self.stop_timeout_s, leftovers_grace_s=0,
            on_kill=lambda: log.warning(
                "LMCache MP server ignored SIGTERM for %.0f s; sending SIGKILL", self.stop_timeout_s
            ),
        )

    def _remove_new_shm_segments(self) -> None:
        """Remove the /dev/shm segments this instance's server created: its `--shm-name` and the
        segments its process was seen mapping that did not exist before it started. After SIGKILL
        nobody else unlinks them. Anything else (another server's `lmcache_*`, vLLM's `psm_*`)
        is left alone, even when its name looks like ours."""
        present = _shm_segments()
        mine = (self._shm_used - self._shm_before) | self._shm_names
        for name in mine & present:
            path = SHM_DIR / name
            try:
                if path.is_file():
                    path.unlink()
                    log.info("removed leftover shared-memory segment %s", path)
            except OSError as e:
                log.warning("could not remove %s: %s", path, e)

    def __enter__(self) -> MPServerSupervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def supervisor_for_plan(
    plan: object, *, max_restarts: int = 5, restart_window_s: float = 600.0, **kwargs: object
) -> MPServerSupervisor:
    """Build the supervisor from a `KVCachePlan` whose mode is "mp"."""
    from lmi_server.kvcache.plan import KVCachePlan  # noqa: PLC0415

    assert isinstance(plan, KVCachePlan)
    if plan.mode != "mp" or plan.server_argv is None or plan.tiers is None:
        raise MPServerError(f"plan mode {plan.mode!r} has no MP server to supervise")
    disk = plan.tiers.disk
    if disk is not None and disk.size_bytes and "disk_budget" not in kwargs:
        kwargs["disk_budget"] = DiskBudgetKeeper(disk.path, disk.size_bytes)
    return MPServerSupervisor(
        plan.server_argv, plan.env, host=plan.tiers.host, port=plan.tiers.port, max_restarts=max_restarts,  # type: ignore[arg-type]
        secret_env=plan.secret_env, restart_window_s=restart_window_s, **kwargs,  # type: ignore[arg-type]
    )

"""Child processes, one way for everyone: the cache-server supervisor, the cluster recipe, the
end-to-end tests and the benchmarks.

- `spawn`: start argv in its own session (so its process group is its own: one signal reaches
  the process and its children), with an environment and a log file (or a pipe).
- `wait_ready`: poll a readiness check (an HTTP probe, `http_ok`, or any callable) until it
  passes, the process exits, the caller aborts, or time runs out.
- `stop`: SIGTERM (the group, or the leader only when it shuts its own children down), SIGKILL
  of the group after a grace period, then reap: descendants that run in their own session
  (and so escaped the group's signal) get a little time, then SIGKILL.

Pids are identified by their start time (`start_time`), so a recycled pid is never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log: Path | IO[bytes] | int | None = None,
    cwd: Path | str | None = None,
    pass_fds: Sequence[int] = (),
    append: bool = False,
) -> subprocess.Popen[bytes]:
    """Start argv in its own process group (one signal reaches all of it), in the caller's
    session; stdout and stderr go to `log` (a path, an open file, or subprocess.PIPE); stdin is
    /dev/null. `env` is the whole environment (None: inherit).

    Not a session of its own: with the kernel's autogroup scheduling (on by default on most
    distributions) each session gets an equal share of the CPUs, and a server in a session of its
    own ran its engine worker (pinned to one core) behind the other sessions: a request joining a
    running one waited 20-66 s for its answer on a 2-core host, where the same server in the
    caller's session answered in 0.15 s at most (README, Reliability)."""
    out: Any = log
    opened = None
    if isinstance(log, (str, Path)):
        out = opened = open(log, "ab" if append else "wb")
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            process_group=0,  # own process group, same session (see the docstring)
            pass_fds=tuple(pass_fds),
        )
    finally:
        if opened is not None:
            opened.close()  # the child holds its own descriptor


def http_ok(url: str, timeout: float = 5.0, ok: Callable[[Any], bool] | None = None) -> Callable[[], bool]:
    """A readiness check: GET url answers 200 (or satisfies `ok(response)`)."""

    def check() -> bool:
        import httpx

        try:
            response = httpx.get(url, timeout=timeout)
        except Exception:  # noqa: BLE001 - connection refused / reset while it boots
            return False
        return ok(response) if ok is not None else response.status_code == 200

    return check


def wait_ready(
    proc: subprocess.Popen[bytes] | Callable[[], bool],
    check: Callable[[], bool],
    timeout: float,
    *,
    interval: float = 0.5,
    abort: Callable[[], bool] | None = None,
) -> str:
    """Poll `check` until it passes. Returns "ready", "exited" (the process ended first),
    "aborted" (`abort()` turned true) or "timeout". `proc` is a Popen or an is-alive callable."""
    alive = proc if callable(proc) and not isinstance(proc, subprocess.Popen) else (lambda: proc.poll() is None)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return "exited"
        if abort is not None and abort():
            return "aborted"
        if check():
            return "ready"
        time.sleep(interval)
    return "timeout"


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group led by pid (a process from `spawn`); gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: the process start time in clock ticks (identifies a pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def pid_alive(pid: int, start: str | None = None) -> bool:
    """Whether `pid` still runs the process that had `start` as its start time (not a zombie)."""
    now = start_time(pid)
    if now is None:
        return False
    if start is not None and now != start:
        return False  # the pid was recycled by another process
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def descendants(pid: int) -> list[tuple[int, str | None]]:
    """(pid, start time) of every live descendant, including children that run in their own
    session (lmi-server's LMCache cache server does)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append((child, start_time(child)))
        todo.extend(children.get(child, []))
    return out


def kill_leftovers(procs: list[tuple[int, str | None]], grace_s: float) -> None:
    """Descendants that outlived their parent (orphaned by a SIGKILL): wait a little for their
    own shutdown, then SIGKILL them, each checked by start time so a recycled pid is left alone."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(pid_alive(pid, start) for pid, start in procs):
        time.sleep(0.2)
    for pid, start in procs:
        if pid_alive(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stop(
    proc: subprocess.Popen[bytes],
    grace_s: float,
    *,
    term_group: bool = True,
    leftovers_grace_s: float = 10.0,
    on_kill: Callable[[], None] | None = None,
) -> int | None:
    """SIGTERM (the whole group, or the leader only with term_group=False, for a process that
    stops its own children), wait `grace_s`, SIGKILL the group; then reap the descendants seen
    before (those in other sessions included), giving them `leftovers_grace_s` to exit on their
own. Returns the exit code."""
    below = descendants(proc.pid) if proc.poll() is None else []
    if proc.poll() is None:
        if term_group:
            signal_group(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            if on_kill is not None:
                on_kill()
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    kill_leftovers(below, grace_s=leftovers_grace_s)
    # The leader is gone; make sure nothing else of its group survives.
    signal_group(proc.pid, signal.SIGKILL)
    return proc.returncode

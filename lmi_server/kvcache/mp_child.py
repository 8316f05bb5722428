"""The cache server's launcher: runs `-m MODULE ARGS` (LMCache's MP server) or `-c CODE` in this
process, and makes it die with its parent.

    python -m lmi_server.kvcache.mp_child --watchdog-fd FD -m lmcache.v1.multiprocess.server ...

FD is the read end of a pipe whose write end only the supervising process holds. When that
process ends, however it ends (SIGKILL included), the pipe reads EOF: this process then removes
its own /dev/shm segment (`--shm-name`), sends SIGTERM to its process group and SIGKILL 5 s
later. (`PR_SET_PDEATHSIG` would fire when the *thread* that started the child exits, and the
supervisor starts children from worker threads, so a pipe is the dependable signal.)
Kept free of package imports: it must start fast and import nothing of the server.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time


def _shm_names(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--shm-name" and "/" not in args[i + 1]]


def _watch(fd: int, shm_names: list[str]) -> None:
    try:
        while os.read(fd, 64):
            pass
    except OSError:
        pass
    for name in shm_names:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
        time.sleep(5)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(1)


def main(argv: list[str]) -> None:
    args = list(argv)
    if args[:1] == ["--watchdog-fd"]:
        fd = int(args[1])
        args = args[2:]
        threading.Thread(target=_watch, args=(fd, _shm_names(args)), name="parent-watchdog", daemon=True).start()
    if len(args) < 2 or args[0] not in ("-m", "-c"):
        sys.exit("usage: python -m lmi_server.kvcache.mp_child [--watchdog-fd FD] (-m MODULE | -c CODE) [ARGS...]")
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - our own argv


if __name__ == "__main__":
    main(sys.argv[1:])

"""Who is in the group, seen from both ends: every worker holds one TCP connection to the leader.

Why: vLLM's engine across nodes notices a lost node only inside a collective (an idle leader whose
worker was killed keeps answering /ping; a worker whose leader is gone waits on its queue
forever), and a group that never forms just waits. LeaderWorkerSet restarts the whole group only
when a pod exits. So each worker connects to the leader at start-up, says its rank, and both ends
send a heartbeat every `HEARTBEAT_S`: a connection closed (a process killed: its kernel closes the
socket at once) or silent for `SILENCE_S` (a node gone without a word) is a lost member, reported
once through `on_lost`. This is membership only; vLLM's own transport carries the engine's data.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
SILENCE_S = 10.0


def _pump(sock: socket.socket, stop: threading.Event) -> str:
    """Send heartbeats and read the peer's until the connection ends; returns why it ended."""
    sock.settimeout(HEARTBEAT_S)
    last_heard = time.monotonic()
    next_beat = 0.0
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_beat:
            try:
                sock.sendall(b".")
            except OSError as exc:
                return f"connection lost ({exc.strerror or exc})"
            next_beat = now + HEARTBEAT_S
        try:
            data = sock.recv(64)
        except socket.timeout:
            data = None
        except OSError as exc:
            return f"connection lost ({exc.strerror or exc})"
        if data == b"":
            return "connection closed (its process ended)"
        if data:
            last_heard = time.monotonic()
        elif time.monotonic() - last_heard > SILENCE_S:
            return f"silent for {SILENCE_S:.0f} s (its node is unreachable)"
    return "stopped"


class Roster:
    """The leader's side: a listening socket, the ranks that joined, a loss reported once."""

    def __init__(self, size: int, port: int, on_lost: Callable[[int, str], None], host: str = "0.0.0.0"):
        self.size = size
        self.joined: dict[int, float] = {}
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._server = socket.create_server((host, port), reuse_port=False)
        self._server.settimeout(0.5)
        threading.Thread(target=self._accept, name="group-roster", daemon=True).start()

    def missing(self) -> list[int]:
        with self._lock:
            return [r for r in range(1, self.size) if r not in self.joined]

    def formed_after_s(self) -> float | None:
        with self._lock:
            return max(self.joined.values()) if len(self.joined) == self.size - 1 else None

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._member, args=(conn, peer), name="group-member", daemon=True).start()

    def _member(self, conn: socket.socket, peer: tuple) -> None:
        conn.settimeout(5.0)
        try:
            hello = conn.recv(32).decode("ascii", "replace").strip(".").strip()
            rank = int(hello.removeprefix("rank "))
        except (OSError, ValueError):
            conn.close()
            return
        with self._lock:
            self.joined[rank] = time.monotonic() - self._started
        log.info("group: rank %d joined from %s after %.1f s", rank, peer[0], self.joined[rank])
        why = _pump(conn, self._stop)
        conn.close()
        if not self._stop.is_set():
            self.on_lost(rank, f"{why}; it was at {peer[0]}")

    def close(self) -> None:
        self._stop.set()
        self._server.close()


class Link:
    """A worker's side: connect to the leader (retrying until `deadline`), then watch it."""

    def __init__(self, rank: int, leader: str, port: int, on_lost: Callable[[str], None]):
        self.rank, self.leader, self.port, self.on_lost = rank, leader, port, on_lost
        self.connected = threading.Event()
        self.last_error = "not tried yet"
        self._stop = threading.Event()

    def start(self, deadline: float) -> None:
        threading.Thread(target=self._run, args=(deadline,), name="group-link", daemon=True).start()

    def _run(self, deadline: float) -> None:
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                sock = socket.create_connection((self.leader, self.port), timeout=2.0)
                sock.sendall(f"rank {self.rank}\n".encode())
                break
            except OSError as exc:
                self.last_error = f"{self.leader}:{self.port}: {exc.strerror or exc}"
                time.sleep(1.0)
        else:
            return  # the caller's deadline names what did not happen
        self.connected.set()
        why = _pump(sock, self._stop)
        sock.close()
        if not self._stop.is_set():
            self.on_lost(f"the leader at {self.leader}: {why}")

    def close(self) -> None:
        self._stop.set()

"""The leader's watch over its group: every worker must report in within option.model_loading_timeout,
and a worker lost afterwards ends the leader (lmi_server.group.ending)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from lmi_server.group.ending import end_group
from lmi_server.group.membership import Roster

log = logging.getLogger(__name__)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def watch_group(plan: Any, timeout_s: float, end=end_group) -> Roster:
    """Start the roster on the plan's membership port and a thread that ends the process when the
    group has not formed by `timeout_s` or loses a member."""

    def lost(rank: int, why: str) -> None:
        end(f"group lost rank {rank} (the node with LWS_WORKER_INDEX={rank}): {why}")

    try:
        roster = Roster(plan.size, plan.membership_port, lost)
    except OSError as exc:
        end(f"the group's membership port {plan.membership_port} (option.master_port + 1) cannot be opened: "
            f"{exc.strerror or exc}; choose another option.master_port")
        raise
    deadline = time.monotonic() + timeout_s

    def wait_for_members() -> None:
        while (missing := roster.missing()) and time.monotonic() < deadline:
            time.sleep(0.2)
        if missing:
            end(
                f"group of {plan.size} nodes did not form within option.model_loading_timeout={timeout_s:g} s: "
                f"{_ranks(missing)} never joined (the node(s) with LWS_WORKER_INDEX={','.join(map(str, missing))} "
                f"must reach {plan.leader_address}:{plan.membership_port} and {plan.master_port})"
            )
            return
        log.info("group formed: %d nodes, the last joined after %.1f s", plan.size, roster.formed_after_s() or 0.0)

    threading.Thread(target=wait_for_members, name="group-forming", daemon=True).start()
    return roster

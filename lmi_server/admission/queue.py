"""The waiting queue that hands engine slots to tenants in the policy's order (weighted fair, or
one arrival order); it knows nothing of asyncio or HTTP.

Fair order: every tenant has its own queue (FIFO within a priority); a tenant with requests
waiting carries a virtual time tag, and the next slot goes to the waiting tenant with the lowest
(head priority, tag). Serving a tenant advances its tag by 1/weight; a tenant that starts waiting
again gets the current virtual time (the tag of the tenant served last), so an idle tenant neither
banks credit nor falls behind a busy one. That is start-time fair queuing with one unit of cost per
request: with weights 2 and 1 and both tenants backlogged, slots go 2:1. Priority comes first
(lower value = earlier, as vLLM's `priority`), across tenants too. The "fifo" policy keeps one
arrival order for all (priority still first): the behaviour before tenants existed.

A tenant may be at its slot cap (see `Admission`): the queue then skips it for that slot, and its
requests keep their place. Which order applies is the policy's (`admission/policy.py`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lmi_server.admission.policy import AdmissionPolicy, policy_named

DEFAULT_TENANT = "default"


@dataclass(eq=False)
class Entry:
    """One waiting request; `item` is whatever the caller queues (the admission's future)."""

    tenant: str
    priority: int
    seq: int
    item: Any
    deadline: float | None = None
    removed: bool = False


@dataclass(eq=False)
class _Tenant:
    weight: float
    tag: float = 0.0
    heap: list = field(default_factory=list)  # (priority, seq, entry)
    live: int = 0


class FairQueue:
    """Waiting requests by tenant; `pop` hands out the next one in fair (or FIFO) order."""

    def __init__(self, policy: AdmissionPolicy | str = "fair", weight: Callable[[str], float] = lambda tenant: 1.0):
        self.policy = policy_named(policy) if isinstance(policy, str) else policy
        self._weight = weight
        self._tenants: dict[str, _Tenant] = {}
        self._seq = itertools.count()
        self._vtime = 0.0
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def waiting(self, tenant: str) -> int:
        t = self._tenants.get(tenant)
        return t.live if t else 0

    def tenants(self) -> dict[str, int]:
        """Waiting requests per tenant (tenants with none left out)."""
        return {name: t.live for name, t in self._tenants.items() if t.live}

    def push(self, tenant: str, item: Any, priority: int = 0, deadline: float | None = None) -> Entry:
        t = self._tenants.get(tenant)
        if t is None:
            if len(self._tenants) >= 64:  # forget idle tenants that are owed nothing
                for name in [n for n, x in self._tenants.items() if not x.live and x.tag <= self._vtime]:
                    del self._tenants[name]
            t = self._tenants[tenant] = _Tenant(weight=max(1e-6, float(self._weight(tenant))))
        if t.live == 0:  # starts waiting (again): no banked credit, no debt
            t.tag = max(t.tag, self._vtime)
        entry = Entry(tenant, int(priority), next(self._seq), item, deadline)
        heapq.heappush(t.heap, (entry.priority, entry.seq, entry))
        t.live += 1
        self._live += 1
        return entry

    def remove(self, entry: Entry) -> bool:
        """Take a waiting entry out (cancelled, expired); False when it was no longer waiting."""
        if entry.removed:
            return False
        entry.removed = True
        t = self._tenants[entry.tenant]
        t.live -= 1
        self._live -= 1
        self._trim(entry.tenant, t)
        return True

    def _head(self, t: _Tenant) -> Entry | None:
        while t.heap and t.heap[0][2].removed:
            heapq.heappop(t.heap)
        return t.heap[0][2] if t.heap else None

    def _trim(self, name: str, t: _Tenant) -> None:
        self._head(t)
        if not t.live and t.tag <= self._vtime:  # nothing to remember: forget the tenant
            del self._tenants[name]

    def peek(self, eligible: Callable[[str], bool] = lambda tenant: True) -> Entry | None:
        """The entry `pop` would hand out, among tenants for which `eligible(tenant)` holds."""
        best, best_key = None, None
        for name, t in self._tenants.items():
            if not t.live or not eligible(name):
                continue
            head = self._head(t)
            assert head is not None
            key = self.policy.order(head.priority, t.tag, head.seq)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def pop(self, eligible: Callable[[str], bool] = lambda tenant: True) -> Entry | None:
        entry = self.peek(eligible)
        if entry is None:
            return None
        t = self._tenants[entry.tenant]
        heapq.heappop(t.heap)
        entry.removed = True
        t.live -= 1
        self._live -= 1
        self._vtime = max(self._vtime, t.tag)
        t.tag += 1.0 / t.weight
        self._trim(entry.tenant, t)
        return entry



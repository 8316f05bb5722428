"""Admission policies, registered by name; `option.admission_policy` picks one (`policy_named`).

A policy decides two things and nothing else: the order in which waiting requests get a free
engine slot (`order`: the sort key of a tenant's head request), and how many slots a tenant beyond
its weighted share leaves free while other tenants are present (`reserve`, the slot headroom; see
`controller.Admission`). A new policy is a subclass with a `name`, registered with `@register`.
"""

from __future__ import annotations

from typing import ClassVar


class AdmissionPolicy:
    """The base interface: FIFO order (priority first), no headroom."""

    name: ClassVar[str] = ""
    keeps_headroom: ClassVar[bool] = False
    """True when `reserve` may keep slots free: the runtime then adds them to a batch size the user
    set (`runtime/fair_slots.py`) instead of carving them out of it."""

    def order(self, priority: int, tag: float, seq: int) -> tuple:
        """Sort key of a tenant's head request; the smallest is served next. `tag`: the tenant's
        virtual time (start-time fair queuing), `seq`: arrival order."""
        return (priority, seq)

    def reserve(self, slots: int | None, reserved_slots: int | None) -> int:
        """Slots a tenant beyond its share leaves free while others are present (0: none)."""
        return 0


def default_reserved_slots(batch_size: int) -> int:
    """option.reserved_slots when unset: one slot per eight, at least two (with one, two newcomers
    arriving together take turns waiting for it: benchmarks/results/fairness_reserve1.json)."""
    return max(2, int(batch_size) // 8)


POLICIES: dict[str, type[AdmissionPolicy]] = {}


def register(cls: type[AdmissionPolicy]) -> type[AdmissionPolicy]:
    POLICIES[cls.name] = cls
    return cls


def policy_named(name: str) -> AdmissionPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}: {' or '.join(sorted(POLICIES))}") from None


@register
class FifoPolicy(AdmissionPolicy):
    """One arrival order for every tenant (priority still first): the behaviour before tenants."""

    name = "fifo"


@register
class FairPolicy(AdmissionPolicy):
    """Weighted fair order across tenants (FIFO within one), with slot headroom for newcomers."""

    name = "fair"
    keeps_headroom = True

    def order(self, priority: int, tag: float, seq: int) -> tuple:
        return (priority, tag, seq)

    def reserve(self, slots: int | None, reserved_slots: int | None) -> int:
        if slots is None:
            return 0
        reserve = reserved_slots if reserved_slots is not None else default_reserved_slots(slots)
        return min(reserve, slots - 1)

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

    def order(self, priority: int, tag: float, seq: int) -> tuple:
        """Sort key of a tenant's head request; the smallest is served next. `tag`: the tenant's
        virtual time (start-time fair queuing), `seq`: arrival order."""
        return (priority, seq)

    def reserve(self, slots: int | None, reserved_slots: int | None) -> int:
        """Slots a tenant beyond its share leaves free while others are present (0: none)."""
        return 0


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

    def order(self, priority: int, tag: float, seq: int) -> tuple:
        return (priority, tag, seq)

    def reserve(self, slots: int | None, reserved_slots: int | None) -> int:
        if slots is None:
            return 0
        from lmi_server.config.options import default_reserved_slots

        reserve = reserved_slots if reserved_slots is not None else default_reserved_slots(slots)
        return min(reserve, slots - 1)

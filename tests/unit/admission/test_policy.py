"""Admission policies are registered by name and picked through the registry: the name decides
the queue's order and the slot headroom, and a new policy plugs in without touching the queue."""

from __future__ import annotations

import pytest

from lmi_server.admission import POLICIES, Admission, AdmissionPolicy, FairQueue, policy_named, register


def test_the_shipped_policies_are_registered_by_name():
    assert {"fifo", "fair"} <= set(POLICIES)
    assert policy_named("fair").order(0, 2.0, 7) == (0, 2.0, 7)
    assert policy_named("fifo").order(0, 2.0, 7) == (0, 7)
    with pytest.raises(ValueError, match="fair or fifo"):
        policy_named("lifo")


def test_headroom_is_the_fair_policys_only():
    assert policy_named("fifo").reserve(8, 2) == 0
    assert policy_named("fair").reserve(8, 2) == 2
    assert policy_named("fair").reserve(2, 5) == 1  # never every slot
    assert policy_named("fair").reserve(None, 2) == 0  # slots not known yet
    assert Admission(queue_size=4, slots=8, policy="fifo", reserved_slots=2)._reserve() == 0
    assert Admission(queue_size=4, slots=8, policy="fair", reserved_slots=2)._reserve() == 2


def test_a_new_policy_plugs_in_by_name():
    @register
    class NewestFirst(AdmissionPolicy):
        name = "test-newest-first"

        def order(self, priority, tag, seq):
            return (priority, -seq)

    try:
        queue = FairQueue("test-newest-first")
        for i in range(3):
            queue.push(f"tenant-{i}", i)  # the policy orders tenants' heads; within one tenant it stays FIFO
        assert [queue.pop().item for _ in range(3)] == [2, 1, 0]
        assert Admission(queue_size=1, policy="test-newest-first")._reserve() == 0
    finally:
        del POLICIES["test-newest-first"]

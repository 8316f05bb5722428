"""Child processes: their own process group (one signal stops all of it), the caller's session.

A session of its own puts a child in an autogroup of its own under the kernel's autogroup
scheduling: the server's engine worker then ran behind the other sessions (20-66 s stalls on a
2-core host; see lmi_server/process.py)."""

from __future__ import annotations

import os
import sys

from lmi_server import process


def test_a_spawned_child_has_its_own_group_in_the_callers_session():
    child = process.spawn([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert os.getpgid(child.pid) == child.pid
        assert os.getpgid(child.pid) != os.getpgid(0)
        assert os.getsid(child.pid) == os.getsid(0)
    finally:
        process.stop(child, 5, term_group=True, leftovers_grace_s=1)
    assert child.poll() is not None

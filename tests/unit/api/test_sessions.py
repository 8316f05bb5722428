import pytest

from lmi_server.api.errors import APIError
from lmi_server.api.sessions import SessionStore


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def test_lifecycle_and_errors_name_the_reason():
    clock = Clock()
    store = SessionStore(60, clock=clock)
    s = store.create()
    assert store.check(s.id) is s
    with pytest.raises(APIError, match="unknown"):
        store.check("A" * 43)
    store.close(s.id)
    with pytest.raises(APIError, match="was closed"):
        store.check(s.id)
    t = store.create()
    clock.now += 61
    with pytest.raises(APIError, match="expired at"):
        store.check(t.id)


def test_ids_are_long_random_and_distinct():
    store = SessionStore(60)
    ids = {store.create().id for _ in range(200)}
    assert len(ids) == 200 and all(len(i) >= 43 for i in ids)


def test_sessions_survive_a_restart_when_stored_on_disk(tmp_path):
    first = SessionStore(60, tmp_path)
    s = first.create()
    closed = first.create()
    first.close(closed.id)
    second = SessionStore(60, tmp_path)
    assert second.check(s.id).id == s.id
    with pytest.raises(APIError, match="was closed"):
        second.check(closed.id)


def test_malformed_id_is_unknown_not_a_crash():
    with pytest.raises(APIError, match="unknown"):
        SessionStore(60).check("../../etc/passwd")

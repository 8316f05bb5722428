import pytest

from lmi_server.api.context import Shape
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


def test_expired_sessions_are_swept_from_memory_and_disk(tmp_path):
    clock = Clock()
    store = SessionStore(60, tmp_path, clock=clock)
    old = store.create()
    closed = store.create()
    store.close(closed.id)
    clock.now += 30
    young = store.create()
    clock.now += 31
    assert store.sweep() == 2
    assert len(store) == 1 and sorted(p.name for p in tmp_path.iterdir()) == [f"{young.id}.json"]
    clock.now += 60
    with pytest.raises(APIError, match="expired"):  # swept on access too
        store.check(young.id)
    assert len(store) == 0 and list(tmp_path.iterdir()) == []
    assert old.id not in store._sessions


def test_max_sessions_is_a_429_until_one_closes_or_expires():
    clock = Clock()
    store = SessionStore(60, clock=clock, max_sessions=2)
    a = store.create()
    store.create()
    with pytest.raises(APIError) as full:
        store.create()
    assert full.value.status == 429 and "option.max_sessions" in full.value.message
    store.close(a.id)
    store.create()
    clock.now += 61
    store.create()  # expired ones are swept to make room
    assert store.live_count() == 1


def test_a_failed_write_is_an_error_and_leaves_no_session(tmp_path):
    import shutil

    path = tmp_path / "sessions"
    store = SessionStore(60, path)
    shutil.rmtree(path)
    path.write_text("not a directory")  # every write now fails (even as root)
    with pytest.raises(APIError) as err:
        store.create()
    assert err.value.status in (500, 507) and "no session was opened" in err.value.message
    assert len(store) == 0


def test_session_body_is_validated_as_sagemaker_does():
    from lmi_server.api.sessions import validate_session_request

    validate_session_request({"requestType": "NEW_SESSION"})
    with pytest.raises(APIError, match="Extra inputs are not permitted") as err:
        validate_session_request({"requestType": "NEW_SESSION", "ttl": 5})
    assert err.value.status == 400


def _hook_request(session_id=None):
    from starlette.requests import Request

    headers = [(b"x-amzn-sagemaker-session-id", session_id.encode())] if session_id else []
    return Request({"type": "http", "method": "POST", "path": "/invocations", "headers": headers})


def test_new_session_is_announced_in_both_headers_and_an_expired_one_is_served_without_it():
    import asyncio

    from lmi_server.api.sessions import SessionHook

    clock = Clock()
    hook = SessionHook(True, SessionStore(60, clock=clock))
    created = asyncio.run(hook(_hook_request(), {"requestType": "NEW_SESSION"}))
    new_header = created.headers["x-amzn-sagemaker-new-session-id"]
    assert created.headers["x-amzn-sagemaker-session-id"] == new_header  # LMI's clients read this one
    session_id = new_header.split(";")[0]
    assert asyncio.run(hook(_hook_request(session_id), {"inputs": "x"})) == {"X-Amzn-SageMaker-Session-Id": session_id}
    clock.now += 61
    assert asyncio.run(hook(_hook_request(session_id), {"inputs": "x"})) is None  # LMI: served, sessionless
    with pytest.raises(APIError) as err:
        asyncio.run(hook(_hook_request("Q" * 43), {"inputs": "x"}))
    assert err.value.status == 424 and err.value.body(Shape.LMI) == {"error": err.value.message, "code": 424}

"""SageMaker stateful sessions through HTTP on the shared server."""

import httpx


def invoke(server, body, session=None):
    headers = {"X-Amzn-SageMaker-Session-Id": session} if session else {}
    return httpx.post(server.base_url + "/invocations", json=body, headers=headers, timeout=60)


def test_session_lifecycle(server):
    r = invoke(server, {"requestType": "NEW_SESSION"})
    assert r.status_code == 200
    header = r.headers["X-Amzn-SageMaker-New-Session-Id"]
    session_id, _, expires = header.partition("; Expires=")
    assert len(session_id) >= 43 and expires.endswith("Z")
    # LMI's handler (and its integration client) read the session from X-Amzn-SageMaker-Session-Id
    assert r.headers["X-Amzn-SageMaker-Session-Id"].split(";")[0] == session_id
    assert r.json()["result"] == f"Session {session_id} created"

    ok = invoke(server, {"inputs": "import os", "parameters": {"max_new_tokens": 2}}, session_id)
    assert ok.status_code == 200, ok.text
    assert ok.headers["X-Amzn-SageMaker-Session-Id"] == session_id
    chat = invoke(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, session_id)
    assert chat.status_code == 200

    closed = invoke(server, {"requestType": "CLOSE"}, session_id)
    assert closed.status_code == 200 and closed.headers["X-Amzn-SageMaker-Closed-Session-Id"] == session_id
    assert closed.json()["result"] == f"Session {session_id} closed"
    after = invoke(server, {"inputs": "import os"}, session_id)
    assert after.status_code == 424 and "closed" in after.json()["error"] and after.json()["code"] == 424


def test_session_errors(server):
    unknown = invoke(server, {"inputs": "x"}, "Z" * 43)
    assert unknown.status_code == 424 and "unknown" in unknown.json()["error"]  # LMI: "session not found"
    no_header = invoke(server, {"requestType": "CLOSE"})
    assert no_header.status_code == 400 and "X-Amzn-SageMaker-Session-Id" in no_header.json()["error"]
    bad_type = invoke(server, {"requestType": "REOPEN"})
    assert bad_type.status_code == 400 and "REOPEN" in bad_type.json()["error"]
    assert invoke(server, {"inputs": "x", "parameters": {"max_new_tokens": 1}}).status_code == 200

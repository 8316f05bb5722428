"""SageMaker stateful (sticky) sessions on /invocations.

`{"requestType": "NEW_SESSION"}` opens a session (header `X-Amzn-SageMaker-New-Session-Id:
<id>; Expires=<UTC>`), later requests carry `X-Amzn-SageMaker-Session-Id`, and
`{"requestType": "CLOSE"}` ends it (`X-Amzn-SageMaker-Closed-Session-Id`). Ids are 256 random
bits. With `option.sessions_path` each session is a small file, so sessions survive a restart.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from lmi_server.api.errors import APIError

SESSION_HEADER = "X-Amzn-SageMaker-Session-Id"
NEW_SESSION_HEADER = "X-Amzn-SageMaker-New-Session-Id"
CLOSED_SESSION_HEADER = "X-Amzn-SageMaker-Closed-Session-Id"
_ID = re.compile(r"^[A-Za-z0-9_-]{16,128}$")


@dataclass
class Session:
    id: str
    expires_at: float
    closed: bool = False


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class SessionStore:
    def __init__(self, expiration_s: int, path: Path | None = None, clock=time.time):
        self.expiration_s = expiration_s
        self.path = path
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
            for file in path.glob("*.json"):
                try:
                    data = json.loads(file.read_text())
                    self._sessions[data["id"]] = Session(**data)
                except (OSError, ValueError, KeyError, TypeError):
                    continue

    def _save(self, session: Session) -> None:
        if self.path is not None:
            tmp = self.path / f".{session.id}.tmp"
            tmp.write_text(json.dumps(session.__dict__))
            tmp.replace(self.path / f"{session.id}.json")

    def create(self) -> Session:
        session = Session(id=secrets.token_urlsafe(32), expires_at=self.clock() + self.expiration_s)
        self._sessions[session.id] = session
        self._save(session)
        return session

    def check(self, session_id: str) -> Session:
        """The live session, or a 400 that says whether the id is unknown, closed or expired."""
        session = self._sessions.get(session_id) if _ID.match(session_id) else None
        if session is None:
            raise APIError(400, f"session {session_id!r} is unknown; open one with {{\"requestType\": \"NEW_SESSION\"}}")
        if session.closed:
            raise APIError(400, f"session {session_id!r} was closed")
        if self.clock() >= session.expires_at:
            raise APIError(400, f"session {session_id!r} expired at {utc(session.expires_at)}")
        return session

    def close(self, session_id: str) -> Session:
        session = self.check(session_id)
        session.closed = True
        self._save(session)
        return session

    def live_count(self) -> int:
        now = self.clock()
        return sum(1 for s in self._sessions.values() if not s.closed and s.expires_at > now)


class SessionHook:
    """Called by /invocations before schema detection; returns a response, extra headers or None."""

    def __init__(self, enabled: bool, store: SessionStore):
        self.enabled = enabled
        self.store = store

    async def __call__(self, request: Request, body: Any) -> JSONResponse | dict[str, str] | None:
        request_type = body.get("requestType") if isinstance(body, dict) else None
        session_id = request.headers.get(SESSION_HEADER)
        if request_type is None and session_id is None:
            return None
        if not self.enabled:
            raise APIError(400, "stateful sessions are disabled on this endpoint (option.enable_stateful_sessions=false)")
        if request_type == "NEW_SESSION":
            session = self.store.create()
            return JSONResponse(
                {"session_id": session.id, "expires": utc(session.expires_at)},
                headers={NEW_SESSION_HEADER: f"{session.id}; Expires={utc(session.expires_at)}"},
            )
        if request_type == "CLOSE":
            if not session_id:
                raise APIError(400, f"CLOSE needs the {SESSION_HEADER} header naming the session")
            session = self.store.close(session_id)
            return JSONResponse({"closed_session_id": session.id}, headers={CLOSED_SESSION_HEADER: session.id})
        if request_type is not None:
            raise APIError(400, f"requestType {request_type!r} is not one of NEW_SESSION, CLOSE")
        self.store.check(session_id)
        return {SESSION_HEADER: session_id}

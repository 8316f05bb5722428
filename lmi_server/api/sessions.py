"""SageMaker stateful (sticky) sessions on /invocations.

`{"requestType": "NEW_SESSION"}` opens a session (header `X-Amzn-SageMaker-New-Session-Id:
<id>; Expires=<UTC>`), later requests carry `X-Amzn-SageMaker-Session-Id`, and
`{"requestType": "CLOSE"}` ends it (`X-Amzn-SageMaker-Closed-Session-Id`). Ids are 256 random
bits. With `option.sessions_path` each session is a small file, so sessions survive a restart;
with `option.sessions_redis_url` they live in a Redis shared by every replica instead
(`sessions_redis.py`), so they survive the loss of the replica that opened them.

Bounds: at most `option.max_sessions` live sessions (429 when full); expired sessions are swept
from memory and disk on access, before each creation when full, and every
`option.sessions_sweep_interval` seconds; a closed session is kept (so its id answers "closed",
not "unknown") until its expiry time. A session is written to disk before its id is returned: a
failed write is a 507 and leaves nothing behind.

A session request body is validated with SageMaker's own model
(`model_hosting_container_standards.sagemaker.sessions.models.SessionRequest`: `requestType`
only, extra fields refused -> 400). Its `SessionManager` is not used: it has no cap on live
sessions, no periodic sweep, uuid4 ids (122 random bits), forgets closed sessions (a closed id
then reads "unknown"), and keeps sessions in /dev/shm by default; the store below does those.
"""

from __future__ import annotations

import errno
import inspect
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from lmi_server.api.errors import APIError, validation_message
from lmi_server.api.standards import SageMakerSessionHeader, SessionRequest

log = logging.getLogger(__name__)

SESSION_HEADER = SageMakerSessionHeader.SESSION_ID
NEW_SESSION_HEADER = SageMakerSessionHeader.NEW_SESSION_ID
CLOSED_SESSION_HEADER = SageMakerSessionHeader.CLOSED_SESSION_ID
_ID = re.compile(r"^[A-Za-z0-9_-]{16,128}$")


class SessionExpired(APIError):
    """A session past its expiry: LMI serves the request as if no session were named."""


@dataclass
class Session:
    id: str
    expires_at: float
    closed: bool = False


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class SessionStore:
    def __init__(self, expiration_s: int, path: Path | None = None, clock=time.time, max_sessions: int | None = None):
        self.expiration_s = expiration_s
        self.path = path
        self.clock = clock
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
            for file in path.glob("*.json"):
                try:
                    data = json.loads(file.read_text())
                    self._sessions[data["id"]] = Session(**data)
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            for tmp in path.glob(".*.tmp"):  # a write interrupted by a crash
                tmp.unlink(missing_ok=True)
        self.sweep()

    def _file(self, session_id: str) -> Path | None:
        return None if self.path is None else self.path / f"{session_id}.json"

    def _save(self, session: Session) -> None:
        if self.path is not None:
            tmp = self.path / f".{session.id}.tmp"
            try:
                tmp.write_text(json.dumps(session.__dict__))
                tmp.replace(self.path / f"{session.id}.json")
            except OSError:
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:
                    pass
                raise

    def _forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        file = self._file(session_id)
        if file is not None:
            try:
                file.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("sessions: could not remove %s: %s", file, exc)

    def sweep(self) -> int:
        """Remove expired sessions (closed ones included) from memory and disk; returns how many."""
        now = self.clock()
        expired = [sid for sid, s in self._sessions.items() if now >= s.expires_at]
        for sid in expired:
            self._forget(sid)
        if expired:
            log.info("sessions: swept %d expired session(s)", len(expired))
        return len(expired)

    def create(self) -> Session:
        if self.max_sessions is not None and self.live_count() >= self.max_sessions:
            self.sweep()
            if self.live_count() >= self.max_sessions:
                raise APIError(
                    429,
                    f"too many open sessions ({self.max_sessions}, option.max_sessions); close one "
                    "with {\"requestType\": \"CLOSE\"} or retry after sessions expire",
                )
        session = Session(id=secrets.token_urlsafe(32), expires_at=self.clock() + self.expiration_s)
        try:
            self._save(session)  # persisted before its id is known to anyone
        except OSError as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            log.error("sessions: cannot store a new session in %s: %s", self.path, exc)
            raise APIError(
                507 if full else 500,
                f"the session could not be stored ({exc.strerror or type(exc).__name__}); no session was opened",
            ) from None
        self._sessions[session.id] = session
        return session

    def check(self, session_id: str) -> Session:
        """The live session, or LMI's 424 that says whether the id is unknown or closed, or
        SessionExpired (LMI then serves the request without its session)."""
        session = self._sessions.get(session_id) if _ID.match(session_id) else None
        if session is None:
            raise APIError(424, f"session not found: {session_id!r} is unknown; open one with {{\"requestType\": \"NEW_SESSION\"}}")
        if self.clock() >= session.expires_at:
            self._forget(session_id)  # swept on access
            raise SessionExpired(400, f"session {session_id!r} expired at {utc(session.expires_at)}")
        if session.closed:
            raise APIError(424, f"session not found: {session_id!r} was closed")
        return session

    def close(self, session_id: str) -> Session:
        session = self.check(session_id)
        session.closed = True  # closed in memory whatever happens on disk
        try:
            self._save(session)
        except OSError as exc:
            log.error("sessions: cannot record the close of a session in %s: %s", self.path, exc)
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise APIError(
                507 if full else 500,
                f"the session is closed, but this could not be stored ({exc.strerror or type(exc).__name__})",
            ) from None
        return session

    def live_count(self) -> int:
        now = self.clock()
        return sum(1 for s in self._sessions.values() if not s.closed and s.expires_at > now)

    def __len__(self) -> int:
        return len(self._sessions)


def validate_session_request(body: dict[str, Any]) -> None:
    """SageMaker's session request model: `{"requestType": "NEW_SESSION" | "CLOSE"}`, nothing else."""
    try:
        SessionRequest.model_validate(body)
    except ValidationError as exc:
        raise APIError(
            400,
            f"invalid session request: {validation_message(exc.errors())} "
            '(example: {"requestType": "NEW_SESSION"} or {"requestType": "CLOSE"})',
        ) from None


async def _done(result):
    """A store method's result: the per-replica store answers at once, the shared one is awaited."""
    return await result if inspect.isawaitable(result) else result


class SessionHook:
    """Called by /invocations before schema detection; returns a response, extra headers or None."""

    def __init__(self, enabled: bool, store: Any):
        self.enabled = enabled
        self.store = store  # SessionStore, or sessions_redis.RedisSessionStore (coroutines)

    async def __call__(self, request: Request, body: Any) -> JSONResponse | dict[str, str] | None:
        request_type = body.get("requestType") if isinstance(body, dict) else None
        session_id = request.headers.get(SESSION_HEADER)
        if request_type is None and session_id is None:
            return None
        if not self.enabled:
            raise APIError(400, "stateful sessions are disabled on this endpoint (option.enable_stateful_sessions=false)")
        if request_type is not None:
            if request_type not in ("NEW_SESSION", "CLOSE"):
                raise APIError(400, f"requestType {request_type!r} is not one of NEW_SESSION, CLOSE")
            validate_session_request(body)
        if request_type == "NEW_SESSION":
            session = await _done(self.store.create())
            announced = f"{session.id}; Expires={utc(session.expires_at)}"
            # SageMaker reads X-Amzn-SageMaker-New-Session-Id; LMI's handler and its clients read
            # X-Amzn-SageMaker-Session-Id: both are sent.
            return JSONResponse(
                {"result": f"Session {session.id} created", "session_id": session.id, "expires": utc(session.expires_at)},
                headers={NEW_SESSION_HEADER: announced, SESSION_HEADER: announced},
            )
        if request_type == "CLOSE":
            if not session_id:
                raise APIError(400, f"CLOSE needs the {SESSION_HEADER} header naming the session")
            session = await _done(self.store.close(session_id))
            return JSONResponse(
                {"result": f"Session {session.id} closed", "closed_session_id": session.id},
                headers={CLOSED_SESSION_HEADER: session.id},
            )
        try:
            await _done(self.store.check(session_id))
        except SessionExpired as exc:
            log.info("sessions: %s; served without it, as LMI does", exc.message)
            return None
        return {SESSION_HEADER: session_id}

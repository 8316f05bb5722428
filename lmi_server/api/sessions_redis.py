"""SageMaker sessions kept in a Redis/Valkey shared by every replica (`option.sessions_redis_url`).

With the per-replica store (`sessions.py`) a session dies with the replica that opened it, although
its KV cache lives on in the shared LMCache tier. Here every replica reads and writes the same
records, so a session's next request is served by any replica, warm from that tier.

Layout (one hash tag, so that the script below also runs on a clustered Redis's single slot):

    {lmi-sessions}:s:<id>   JSON {"id", "expires_at", "closed"}; Redis expires the key itself
                            (SET ... PXAT expires_at + grace): no sweeper is needed for records
    {lmi-sessions}:live     sorted set of open sessions, score = expires_at: live_count and the
                            option.max_sessions cap (checked and written by one Lua script, so
                            replicas cannot overshoot it together)

An expired session is still recognised as expired (served without its session, as LMI does) for
`grace_s` after its expiry (option.sessions_sweep_interval, the window in which the per-replica store
also still knows it), then Redis forgets it and the id reads "unknown" (424). A closed session is
kept, marked closed, until then too, so its id answers "closed".

A Redis that cannot be reached (down, timeout, wrong password) makes every session request a 503
naming the store; it never falls back to a replica's memory (a session opened there would be lost
with that replica, silently). Requests without a session do not touch Redis.

Clocks: expiry instants come from the replica's clock (PXAT is absolute), so replicas' clocks are
assumed synchronised (NTP), as they are for SageMaker's own `Expires=` header.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from lmi_server.api.errors import APIError
from lmi_server.api.sessions import _ID, Session, SessionExpired, utc

log = logging.getLogger(__name__)

PREFIX = "{lmi-sessions}"
LIVE_KEY = f"{PREFIX}:live"

# KEYS[1] live set, KEYS[2] the new session's key;
# ARGV: now, expires_at, forget-at (ms, PXAT), cap (0 = none), record, id.
_CREATE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local cap = tonumber(ARGV[4])
if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then
  return 0
end
redis.call('SET', KEYS[2], ARGV[5], 'PXAT', ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[6])
return 1
"""


def redis_connection_url(url: str) -> tuple[str, str | None, str | None]:
    """The URL redis-py reads (valkey:// -> redis://, valkeys:// -> rediss://) without credentials,
    and the credentials: the URL's own, else the shared KV tier's environment variables
    (LMCACHE_RESP_USERNAME / LMCACHE_RESP_PASSWORD), so one Secret serves both."""
    parts = urlsplit(url)
    scheme = {"valkey": "redis", "valkeys": "rediss"}.get(parts.scheme, parts.scheme)
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if password is None:
        password = os.environ.get("LMCACHE_RESP_PASSWORD") or None
        username = username or os.environ.get("LMCACHE_RESP_USERNAME") or None
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((scheme, netloc, parts.path, parts.query, "")), username, password


class RedisSessionStore:
    """The session store contract of `SessionStore` (create, check, close, sweep, live_count), as
    coroutines, over Redis. `client` is a `redis.asyncio.Redis` (or a stand-in in tests)."""

    shared = True

    def __init__(
        self,
        client: Any,
        expiration_s: int,
        *,
        max_sessions: int | None = None,
        grace_s: int = 60,
        clock=time.time,
        where: str = "redis",
    ):
        self.client = client
        self.expiration_s = expiration_s
        self.max_sessions = max_sessions
        self.grace_s = grace_s
        self.clock = clock
        self.where = where  # the URL without credentials, for messages
        self._create = client.register_script(_CREATE)

    @classmethod
    def from_url(cls, url: str, expiration_s: int, **kwargs: Any) -> "RedisSessionStore":
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        from lmi_server.redact import register_secret

        plain, username, password = redis_connection_url(url)
        register_secret(password)
        client = redis.asyncio.Redis.from_url(
            plain,
            username=username,
            password=password,
            # A Redis that is down answers within seconds (503), not after redis-py's default retries.
            socket_connect_timeout=2,
            socket_timeout=2,
            retry=Retry(NoBackoff(), 1),  # one retry: a pooled connection that Redis closed meanwhile
            decode_responses=True,
        )
        return cls(client, expiration_s, where=plain, **kwargs)

    def _unavailable(self, exc: Exception, what: str) -> APIError:
        log.error("sessions: the session store %s failed: %s", self.where, exc)
        return APIError(
            503,
            f"the session store ({self.where}) is unavailable ({type(exc).__name__}: {exc}); {what}; retry later",
        )

    @staticmethod
    def _key(session_id: str) -> str:
        return f"{PREFIX}:s:{session_id}"

    async def _run(self, what: str, call):
        from redis.exceptions import RedisError

        try:
            return await call()
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc, what) from None

    # -- the store's contract -------------------------------------------------------------------

    async def create(self) -> Session:
        now = self.clock()
        session = Session(id=secrets.token_urlsafe(32), expires_at=now + self.expiration_s)
        record = json.dumps(session.__dict__)
        forget_at_ms = int((session.expires_at + self.grace_s) * 1000)
        created = await self._run(
            "no session was opened",
            lambda: self._create(
                keys=[LIVE_KEY, self._key(session.id)],
                args=[now, session.expires_at, forget_at_ms, self.max_sessions or 0, record, session.id],
            ),
        )
        if not int(created):
            raise APIError(
                429,
                f"too many open sessions ({self.max_sessions}, option.max_sessions, counted across every "
                "replica); close one with {\"requestType\": \"CLOSE\"} or retry after sessions expire",
            )
        return session

    async def _load(self, session_id: str, what: str) -> Session | None:
        if not _ID.match(session_id):
            return None
        raw = await self._run(what, lambda: self.client.get(self._key(session_id)))
        if raw is None:
            return None
        try:
            return Session(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            log.warning("sessions: unreadable record for a session in %s: %s", self.where, exc)
            return None

    async def check(self, session_id: str, what: str = "the session could not be checked") -> Session:
        """The live session, or LMI's 424 (unknown or closed), or SessionExpired."""
        session = await self._load(session_id, what)
        if session is None:
            raise APIError(424, f"session not found: {session_id!r} is unknown; open one with {{\"requestType\": \"NEW_SESSION\"}}")
        if self.clock() >= session.expires_at:
            raise SessionExpired(400, f"session {session_id!r} expired at {utc(session.expires_at)}")
        if session.closed:
            raise APIError(424, f"session not found: {session_id!r} was closed")
        return session

    async def close(self, session_id: str) -> Session:
        what = "the session was not closed"
        session = await self.check(session_id, what)
        session.closed = True
        key = self._key(session_id)

        async def write():
            async with self.client.pipeline(transaction=True) as pipe:
                # XX + KEEPTTL: kept (closed) until the expiry it already has; never recreated
                pipe.set(key, json.dumps(session.__dict__), xx=True, keepttl=True)
                pipe.zrem(LIVE_KEY, session_id)
                return await pipe.execute()

        await self._run(what, write)
        return session

    async def sweep(self) -> int:
        """Drop expired sessions from the live count (Redis expires the records themselves)."""
        return int(await self._run("sweep", lambda: self.client.zremrangebyscore(LIVE_KEY, "-inf", self.clock())))

    async def live_count(self) -> int:
        return int(await self._run("count", lambda: self.client.zcount(LIVE_KEY, f"({self.clock()}", "+inf")))

    # -- start-up and shutdown ------------------------------------------------------------------

    async def startup_check(self) -> None:
        """Log whether the store answers, and warn when its eviction policy can drop sessions."""
        from redis.exceptions import RedisError

        try:
            await self.client.ping()
        except (RedisError, OSError) as exc:
            log.warning("sessions: the session store %s does not answer yet (%s); session requests get 503 until it does", self.where, exc)
            return
        log.info("sessions: kept in %s, shared by every replica", self.where)
        try:
            policy = (await self.client.config_get("maxmemory-policy")).get("maxmemory-policy", "")
        except (RedisError, OSError):  # CONFIG is often disabled on managed Redis
            return
        if policy and policy != "noeviction":
            log.warning(
                "sessions: %s evicts keys under memory pressure (maxmemory-policy %s): an idle session can be "
                "evicted before it expires (its id then reads unknown); give it memory headroom, or keep "
                "sessions in a Redis with maxmemory-policy noeviction", self.where, policy,
            )

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        except Exception:  # noqa: BLE001 - shutting down
            pass


def build_session_store(options: Any):
    """The store option.* asks for: shared in Redis, or this replica's own (memory / files)."""
    from lmi_server.api.sessions import SessionStore

    if options.sessions_redis_url and options.enable_stateful_sessions:
        return RedisSessionStore.from_url(
            options.sessions_redis_url,
            options.sessions_expiration,
            max_sessions=options.max_sessions,
            grace_s=options.sessions_sweep_interval,
        )
    return SessionStore(options.sessions_expiration, options.sessions_path, max_sessions=options.max_sessions)

"""API keys: a pure ASGI middleware in front of every route except /ping and /health.

Keys come from `option.api_key` (comma-separated, for rotation; also `OPTION_API_KEY`) and
`option.api_key_file` (one per line). A request presents one as `Authorization: Bearer KEY`
(what the OpenAI client sends) or `X-Api-Key: KEY`; it is compared with every configured key
in constant time (sha256 digests through `hmac.compare_digest`, so neither content nor length
leaks). No key configured: nothing is checked, and `warn_if_unprotected` logs one warning when
the server listens beyond loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from pathlib import Path

from fastapi.responses import JSONResponse

from lmi_server.api.errors import APIError
from lmi_server.config.schema import ConfigError
from lmi_server.redact import register_secret

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/ping", "/health"})


def load_api_keys(security, model_dir: Path) -> list[str]:
    """Every configured key (option.api_key split on commas, then the key file's lines)."""
    keys: list[str] = []
    if security.api_key is not None:
        keys += [k.strip() for k in security.api_key.get_secret_value().split(",") if k.strip()]
    if security.api_key_file is not None:
        path = Path(security.api_key_file).expanduser()
        path = path if path.is_absolute() else Path(model_dir) / path
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError([f"option.api_key_file={str(path)!r}: cannot be read: {exc}"]) from None
        file_keys = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not file_keys:
            raise ConfigError([f"option.api_key_file={str(path)!r}: holds no key (one key per line)"])
        keys += file_keys
    for key in keys:
        if len(key) < 8:
            raise ConfigError(["option.api_key: every key must have at least 8 characters"])
        register_secret(key)
    return keys


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_unprotected(host: str, keys: list[str]) -> bool:
    """One warning when the server is reachable beyond loopback without a key; True if warned."""
    if keys or is_loopback(host):
        return False
    log.warning(
        "no API key is configured and the server listens on %s: every route is open to anyone who can "
        "reach this port; set option.api_key or option.api_key_file (see README, Security)",
        host,
    )
    return True


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class APIKeyMiddleware:
    def __init__(self, app, keys: list[str], *, metrics_public: bool = False):
        self.app = app
        self._digests = [_digest(k) for k in keys]
        self.metrics_public = metrics_public

    def _open(self, path: str) -> bool:
        return path in OPEN_PATHS or (self.metrics_public and path == "/metrics")

    def presented(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        for name, value in headers:
            lname = name.lower()
            if lname == b"authorization":
                scheme, _, token = value.decode("latin-1").strip().partition(" ")
                if scheme.lower() == "bearer" and token.strip():
                    return token.strip()
            elif lname == b"x-api-key" and value.strip():
                return value.decode("latin-1").strip()
        return None

    def allowed(self, key: str | None) -> bool:
        if key is None:
            return False
        given = _digest(key)
        ok = False
        for digest in self._digests:  # all of them, always: the time does not say which matched
            ok |= hmac.compare_digest(given, digest)
        return ok

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._digests or self._open(scope["path"]):
            return await self.app(scope, receive, send)
        key = self.presented(scope.get("headers") or [])
        if self.allowed(key):
            return await self.app(scope, receive, send)
        reason = "missing API key" if key is None else "invalid API key"
        err = APIError(
            401,
            f"{reason}: send it as 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
        response = JSONResponse(err.body(), status_code=err.status, headers=err.headers)
        await response(scope, receive, send)

"""API keys: a pure ASGI middleware in front of every route except the public ones of the route
table (api/routes.py: /ping, /health and /live).

Keys come from `option.api_key` (comma-separated, for rotation; also `OPTION_API_KEY`) and
`option.api_key_file` (one per line). A request presents one as `Authorization: Bearer KEY`
(what the OpenAI client sends) or `X-Api-Key: KEY` (what Anthropic's clients send); it is compared with every configured key
in constant time (sha256 digests through `hmac.compare_digest`, so neither content nor length
leaks). No key configured: nothing is checked, and `warn_if_unprotected` logs one warning when
the server listens beyond loopback.

A key is a tenant (lmi_server/admission/tenants.py): a key file line may name it and carry the tenant's settings,
`name=alice key=KEY weight=2 requests_per_second=5 tokens_per_minute=60000`; an unnamed key's
tenant is `key-` and the first 8 hex digits of its sha256 (never the key). The middleware puts the
matched key's entry in the request's context (`RequestContext.key_entry`), where the tenant is read.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path

from fastapi.responses import JSONResponse

from lmi_server.api.context import request_context
from lmi_server.api.errors import APIError
from lmi_server.api.routes import public_paths
from lmi_server.config.schema import ConfigError
from lmi_server.redact import register_secret

log = logging.getLogger(__name__)

OPEN_PATHS = public_paths()  # the route table's public rows: the health checks
_ENTRY_FIELDS = {"name", "key", "weight", "requests_per_second", "tokens_per_minute"}
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class KeyEntry:
    """One API key and the tenant it stands for (repr never shows the key)."""

    key: str
    name: str
    weight: float | None = None
    requests_per_second: float | None = None
    tokens_per_minute: float | None = None

    def __repr__(self) -> str:
        return f"KeyEntry(name={self.name!r}, weight={self.weight}, rps={self.requests_per_second}, tpm={self.tokens_per_minute})"


def default_key_name(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def parse_key_line(line: str, where: str) -> KeyEntry:
    """`KEY`, or `name=NAME key=KEY [weight=W] [requests_per_second=R] [tokens_per_minute=T]`."""
    tokens = line.split()
    fields = dict(t.split("=", 1) for t in tokens if "=" in t)
    if len(tokens) == 1 and not tokens[0].startswith("key="):
        return KeyEntry(key=line, name=default_key_name(line))
    if len(fields) != len(tokens) or not set(fields) <= _ENTRY_FIELDS or "key" not in fields:
        unknown = sorted(set(fields) - _ENTRY_FIELDS)
        raise ConfigError([
            f"{where}: expected a key alone or `name=alice key=KEY [weight=2] [requests_per_second=5] "
            f"[tokens_per_minute=60000]`" + (f"; unknown field(s) {unknown}" if unknown else "")
        ])
    key = fields["key"]
    name = fields.get("name") or default_key_name(key)
    if not set(name) <= _NAME_CHARS or len(name) > 64:
        raise ConfigError([f"{where}: name={name!r}: letters, digits, '.', '_' and '-' only (at most 64)"])
    numbers: dict[str, float] = {}
    for field in ("weight", "requests_per_second", "tokens_per_minute"):
        if field in fields:
            try:
                numbers[field] = float(fields[field])
            except ValueError:
                numbers[field] = -1.0
            if not numbers[field] > 0:
                raise ConfigError([f"{where}: {field}={fields[field]!r}: expected a positive number (example: {field}=2)"])
    return KeyEntry(key=key, name=name, **numbers)


def load_api_key_entries(security, model_dir: Path) -> list[KeyEntry]:
    """Every configured key with its tenant (option.api_key split on commas, then the key file)."""
    entries: list[KeyEntry] = []
    if security.api_key is not None:
        entries += [
            KeyEntry(key=k.strip(), name=default_key_name(k.strip()))
            for k in security.api_key.get_secret_value().split(",")
            if k.strip()
        ]
    if security.api_key_file is not None:
        path = Path(security.api_key_file).expanduser()
        path = path if path.is_absolute() else Path(model_dir) / path
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError([f"option.api_key_file={str(path)!r}: cannot be read: {exc}"]) from None
        file_lines = [(i, ln.strip()) for i, ln in enumerate(lines, 1) if ln.strip() and not ln.strip().startswith("#")]
        if not file_lines:
            raise ConfigError([f"option.api_key_file={str(path)!r}: holds no key (one key per line)"])
        for number, line in file_lines:
            for token in line.split():  # a malformed line must not echo a key in the error
                if token.startswith("key=") and len(token) > 4:
                    register_secret(token[4:])
            if " " not in line and "\t" not in line:
                register_secret(line)
            entries.append(parse_key_line(line, f"option.api_key_file line {number}"))
    for entry in entries:
        if len(entry.key) < 8:
            raise ConfigError(["option.api_key: every key must have at least 8 characters"])
        register_secret(entry.key)
    names: dict[str, str] = {}
    for entry in entries:
        if names.setdefault(entry.name, entry.key) != entry.key:
            raise ConfigError([f"option.api_key_file: the name {entry.name!r} is given to two different keys"])
    return entries


def load_api_keys(security, model_dir: Path) -> list[str]:
    """Every configured key (option.api_key split on commas, then the key file's lines)."""
    return [e.key for e in load_api_key_entries(security, model_dir)]


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
        "reach this port; set option.api_key or option.api_key_file (see docs/security.md)",
        host,
    )
    return True


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class APIKeyMiddleware:
    def __init__(self, app, keys: list[str] | list[KeyEntry], *, metrics_public: bool = False, error_body=None):
        """`error_body(path, error)`: the refusal's body in the format of the path's API (default OpenAI's)."""
        self.app = app
        self.error_body = error_body or (lambda path, err: err.body())
        self._entries = [k if isinstance(k, KeyEntry) else KeyEntry(key=k, name=default_key_name(k)) for k in keys]
        self._digests = [_digest(e.key) for e in self._entries]
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

    def match(self, key: str | None) -> KeyEntry | None:
        """The entry of the presented key, or None."""
        if key is None:
            return None
        given = _digest(key)
        found = -1
        for i, digest in enumerate(self._digests):  # all of them, always: the time does not say which matched
            hit = hmac.compare_digest(given, digest)
            found = i if hit else found
        return self._entries[found] if found >= 0 else None

    def allowed(self, key: str | None) -> bool:
        return self.match(key) is not None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._digests or self._open(scope["path"]):
            return await self.app(scope, receive, send)
        key = self.presented(scope.get("headers") or [])
        entry = self.match(key)
        if entry is not None:
            request_context(scope).key_entry = entry
            return await self.app(scope, receive, send)
        reason = "missing API key" if key is None else "invalid API key"
        err = APIError(
            401,
            f"{reason}: send it as 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
        response = JSONResponse(self.error_body(scope["path"], err), status_code=err.status, headers=err.headers)
        await response(scope, receive, send)

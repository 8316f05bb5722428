"""Keeping secrets (API keys, cache-tier passwords) out of logs, `lmi-server config` and /metrics.

A leaf module (no imports from the package): config, kvcache and api all use it. Secrets known
at start-up are registered with `register_secret`; `redact()` replaces them, and anything shaped
like a credential (URL user-info, `"password": ...`, `Authorization: Bearer ...`), by `***`.
`install_log_redaction()` puts a filter on every logging handler of the process.
"""

from __future__ import annotations

import logging
import re
import threading

MASK = "***"
SECRET_KEY_RE = re.compile(r"(api_?key|password|passwd|secret|token|credential)", re.IGNORECASE)

_KEY_VALUE_RE = re.compile(
    r"""(["']?(?:password|passwd|api_?key|secret|token)["']?\s*[:=]\s*(["']?))(?!(?:null|None|true|false)\b)([^"',\s}]+)""",
    re.IGNORECASE,
)
# An unquoted number after "token:" is prose ("KV per token: 2 (K,V)", "per token = 46,603"), the
# figures operators read; a quoted value, or one with anything but digits, is masked.
_NUMBER_RE = re.compile(r"[\d.,]+")


def _mask_key_value(m: re.Match) -> str:
    if not m.group(2) and _NUMBER_RE.fullmatch(m.group(3)):
        return m.group(0)
    return m.group(1) + MASK


_PATTERNS = [
    (re.compile(r"(://[^:/@\s]*:)[^@\s/]+@"), r"\1" + MASK + "@"),  # scheme://user:password@host
    (_KEY_VALUE_RE, _mask_key_value),
    (re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE), r"\1" + MASK),
]
_secrets: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Remember a secret so that it is masked wherever it would be printed (min. 4 characters)."""
    if value and len(value) >= 4:
        with _lock:
            _secrets.add(value)


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY_RE.search(key))


_URL_USERINFO = _PATTERNS[0]


def mask_value(key: str, value: object) -> object:
    """The value, or `***` when the key names a secret; a URL's password is masked in any value."""
    if value not in (None, "") and is_secret_key(key):
        return MASK
    return _URL_USERINFO[0].sub(_URL_USERINFO[1], value) if isinstance(value, str) else value


def redact(text: str) -> str:
    if not text:
        return text
    with _lock:
        known = sorted(_secrets, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, MASK)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


class RedactingFilter(logging.Filter):
    """Formats the record's message once, redacted (args are folded in)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logging's problem, not ours
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_FILTER = RedactingFilter()


def install_log_redaction() -> None:
    """Attach the filter to every handler that exists now (root, uvicorn's, vLLM's, ours)."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for handler in lg.handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)

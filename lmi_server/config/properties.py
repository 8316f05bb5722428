"""Read `serving.properties` (Java properties rules) and the SageMaker/LMI environment.

Precedence follows LMI: a key set in the file wins over the same key from the environment;
every such attempted override is reported so that a person can see it in the logs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lmi_server.config.lmi_compat import read_environment
from lmi_server.redact import mask_value

log = logging.getLogger(__name__)

_SEPARATORS = "=: \t\f"
_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}

def _logical_lines(text: str) -> list[str]:
    """Join continuation lines (odd number of trailing backslashes) as java.util.Properties does."""
    out: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.lstrip(_WHITESPACE)
        if pending is None:
            if not line or line[0] in "#!":
                continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending = (pending or "") + line[:-1]
            continue
        out.append((pending or "") + line)
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def _unescape(s: str) -> str:
    result: list[str] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch != "\\" or i + 1 >= len(s):
            result.append(ch)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "u" and i + 6 <= len(s):
            try:
                result.append(chr(int(s[i + 2 : i + 6], 16)))
                i += 6
                continue
            except ValueError:
                raise ValueError(f"malformed \\uXXXX escape in {s!r}") from None
        result.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(result)


def _split_key_value(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in _SEPARATORS:
            break
        i += 1
    key = line[:i]
    rest = line[i:]
    rest = rest.lstrip(_WHITESPACE)
    if rest and rest[0] in "=:":
        rest = rest[1:].lstrip(_WHITESPACE)
    return _unescape(key), _unescape(rest)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java-properties text into an ordered dict; later duplicates win, as in Java."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split_key_value(line)
        if key:
            props[key] = value.rstrip() if key.startswith("option.") else value
    return props


def load_properties_file(path: str | Path) -> dict[str, str]:
    return parse_properties(Path(path).read_text(encoding="utf-8"))


def options_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Map OPTION_FOO_BAR -> option.foo_bar, SERVING_<KEY> -> <key>, and LMI's named variables
    (HF_MODEL_ID, TENSOR_PARALLEL_DEGREE, MAX_BATCH_SIZE, ...: `lmi_keys.json`)."""
    return read_environment(os.environ if environ is None else environ).props


@dataclass
class MergedProperties:
    values: dict[str, str]
    sources: dict[str, str]  # key -> "file" | "env"
    overridden_by_file: list[str] = field(default_factory=list)


def merge_sources(file_props: Mapping[str, str], env_props: Mapping[str, str]) -> MergedProperties:
    """The file wins over the environment (LMI's rule); attempted overrides are logged."""
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    overridden: list[str] = []
    for key, value in env_props.items():
        values[key] = value
        sources[key] = "env"
    for key, value in file_props.items():
        if key in values and values[key] != value:
            overridden.append(key)
            log.warning(
                "environment tried to set %s=%r; serving.properties wins with %r",
                key,
                mask_value(key, values[key]),
                mask_value(key, value),
            )
        values[key] = value
        sources[key] = "file"
    return MergedProperties(values, sources, overridden)

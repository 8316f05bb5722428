"""s3:// references (the model, a draft) turned into local directories at start-up."""

from __future__ import annotations

from pathlib import Path

from lmi_server.config.schema import ConfigError


def fetch_remote(url: str, what: str, *, download: bool, notes: list[str]) -> str | Path:
    """An s3:// reference's local directory: downloaded when serving; when only describing
    (`lmi-server config`), the copy already there or the URL itself, with a note of where it goes."""
    from lmi_server.model_source import ModelSourceError, downloaded, fetch, plan_note

    if not download:
        notes.append(plan_note(url, what))
        return downloaded(url) or url
    try:
        return fetch(url)
    except ModelSourceError as exc:
        raise ConfigError([f"{what}={url!r}: cannot be downloaded: {exc.cause}"]) from None

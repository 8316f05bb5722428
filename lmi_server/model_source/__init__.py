"""Where a model comes from: a reference -> a local directory, for the model, a draft and an adapter.

Local directories, hub ids and the built-in names are left as they are (vLLM and the demo
builders handle them; a hub id's revision is resolved to its commit by `hub.py` where the KV keys
need it); `s3://bucket/prefix` and `s3://bucket/key.zip` are downloaded here, once,
into the server's cache directory, because the engine, the draft checks and the adapter validation
all need files on disk.

A download is built so that no half-loaded model can ever be served:
  - objects are fetched into `<dest>.partial/`, several files at once and each in parallel parts
    (s3transfer), with boto3's standard credential chain, region and endpoint settings;
  - each file is verified (size; MD5 from a plain or multipart ETag; a full-object checksum when S3
    keeps one) and only then recorded as done, so a crash never leaves a partial file counted as
    complete, and the next start fetches only what is not recorded;
  - the finished directory appears by one rename, with its manifest (`.lmi-source.json`) inside;
    a directory with a manifest is complete and is reused without contacting S3 again.
A `.zip` (the URL, or a prefix holding exactly one .zip, as LMI accepts) is downloaded, verified,
extracted with every member checked to stay inside the directory, and then renamed the same way.

boto3 is imported only when an `s3://` reference is fetched.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lmi_server.model_source.download import DONE_DIR, MANIFEST, PARTIAL_SUFFIX, Download
from lmi_server.source_ref import (
    ModelSourceError,
    S3Url,
    SourceAccessDenied,
    SourceCorrupt,
    SourceInvalid,
    SourceNotFound,
    SourceUnavailable,
    is_remote,
    parse_s3,
)

log = logging.getLogger(__name__)

__all__ = [
    "DONE_DIR", "MANIFEST", "PARTIAL_SUFFIX", "ModelSourceError", "S3Url", "SourceAccessDenied", "SourceCorrupt",
    "SourceInvalid", "SourceNotFound", "SourceUnavailable", "cache_root", "downloaded", "fetch", "is_remote",
    "local_dir", "parse_s3", "plan_note",
]


def cache_root() -> Path:
    """Downloads live under SERVING_DOWNLOAD_DIR (LMI's variable), else on SageMaker on the
    instance's NVMe volume (/tmp/lmi_server/download, `sagemaker_caches`), else in the server's
    cache directory."""
    from lmi_server.sagemaker_caches import download_dir

    explicit = os.environ.get("SERVING_DOWNLOAD_DIR")
    if explicit:
        return Path(explicit)
    on_nvme = download_dir()
    if on_nvme is not None:
        return on_nvme
    base = os.environ.get("LMI_SERVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lmi_server"
    )
    return Path(base) / "download"


def local_dir(url: str) -> Path:
    """Where `url` is (or will be) downloaded: stable per URL, readable by its last component."""
    parsed = parse_s3(url)
    digest = hashlib.sha256(str(parsed).rstrip("/").encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", parsed.name)[:64] or "model"
    return cache_root() / f"{safe}-{digest}"


def downloaded(url: str) -> Path | None:
    """The complete local copy of `url`, or None (never a partial one). Contacts nothing."""
    dest = local_dir(url)
    return _model_root(dest) if (dest / MANIFEST).is_file() else None


def plan_note(url: str, what: str = "option.model_id") -> str:
    """One line for `lmi-server config`: where `url` is or will be."""
    done = downloaded(url)
    if done is not None:
        return f"{what}={url}: downloaded already at {done}"
    return f"{what}={url}: will be downloaded to {local_dir(url)} at start-up"


def fetch(url: str) -> Path:
    """The local directory holding `url`'s files, downloading what is missing. Raises ModelSourceError."""
    parsed = parse_s3(url)
    dest = local_dir(url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest.with_name(dest.name + ".lock")):
        if (dest / MANIFEST).is_file():
            log.info("%s: using the copy downloaded at %s (delete it to download again)", url, dest)
            return _model_root(dest)
        started = time.perf_counter()
        Download(url, parsed, dest).run()
        log.info("%s: downloaded to %s in %.1f s", url, dest, time.perf_counter() - started)
    return _model_root(dest)


def _model_root(dest: Path) -> Path:
    """An archive holding one top-level directory: that directory (as LMI unpacks it)."""
    manifest = json.loads((dest / MANIFEST).read_text())
    return dest / manifest["root"] if manifest.get("root") else dest


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One downloader per destination across threads and processes (two servers, two registrations)."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)

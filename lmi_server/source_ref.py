"""What a model reference names, without fetching anything: s3:// URL parsing and the typed errors
of a reference that cannot become a local directory. Pure, so config/ can check a reference while
validating; `model_source` downloads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath


class ModelSourceError(RuntimeError):
    """A reference that cannot be turned into a local directory; the message names the URL and the cause."""

    def __init__(self, url: str, cause: str):
        super().__init__(f"{url}: {cause}")
        self.url = url
        self.cause = cause


class SourceInvalid(ModelSourceError):
    """The reference itself is malformed (not a usable s3:// URL)."""


class SourceNotFound(ModelSourceError):
    """The bucket, the key or every object under the prefix is missing."""


class SourceAccessDenied(ModelSourceError):
    """No credentials, wrong credentials, or credentials without permission."""


class SourceUnavailable(ModelSourceError):
    """S3 could not be reached or the download was interrupted; a later start resumes it."""


class SourceCorrupt(ModelSourceError):
    """A downloaded file does not match what S3 says it is, or an archive is unsafe."""


@dataclass(frozen=True)
class S3Url:
    bucket: str
    key: str

    @property
    def is_zip(self) -> bool:
        return self.key.lower().endswith(".zip")

    @property
    def prefix(self) -> str:
        """The listing prefix of a directory-like URL ('' for the whole bucket)."""
        key = self.key.strip("/")
        return f"{key}/" if key else ""

    @property
    def name(self) -> str:
        """A readable name: the last path component, without .zip."""
        last = PurePosixPath(self.key.strip("/")).name or self.bucket
        return last[:-4] if last.lower().endswith(".zip") else last

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$", re.IGNORECASE)


def is_remote(ref: str | None) -> bool:
    """True for references this module downloads (s3://)."""
    return isinstance(ref, str) and ref.strip().lower().startswith("s3://")


def parse_s3(url: str) -> S3Url:
    url = url.strip()
    if not url.lower().startswith("s3://"):
        raise SourceInvalid(url, "not an s3:// URL")
    bucket, _, key = url[5:].partition("/")
    if not _BUCKET.match(bucket):
        raise SourceInvalid(url, f"{bucket!r} is not a bucket name (expected s3://bucket/prefix or s3://bucket/key.zip)")
    if any(part == ".." for part in key.split("/")):
        raise SourceInvalid(url, "'..' is not allowed in the key")
    return S3Url(bucket, key)

"""The S3 calls of a download: the client (boto3's credential chain, region, endpoint), the one
function that moves an object's bytes (s3transfer, in parallel ranged parts), and botocore's
failures turned into typed errors naming the URL. boto3 is imported only here, only when used."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lmi_server.source_ref import (
    ModelSourceError,
    SourceAccessDenied,
    SourceInvalid,
    SourceNotFound,
    SourceUnavailable,
    parse_s3,
)

FILES_AT_ONCE = 4
PARTS_AT_ONCE = 8
PART_BYTES = 16 * 1024 * 1024


def client(url: str):
    try:
        import boto3
        from botocore.config import Config
    except ImportError:  # pragma: no cover - boto3 is a runtime dependency
        raise SourceUnavailable(url, "boto3 is not installed (pip install boto3)") from None
    config: dict[str, Any] = {"max_pool_connections": FILES_AT_ONCE * PARTS_AT_ONCE + 4}
    if not os.environ.get("AWS_RETRY_MODE"):
        config["retries"] = {"mode": "standard"}
    try:
        return boto3.session.Session().client("s3", config=Config(**config))
    except Exception as exc:  # noqa: BLE001 - e.g. a malformed AWS_ENDPOINT_URL or profile
        raise SourceInvalid(url, f"cannot create an S3 client: {exc}") from None


def transfer(client, bucket: str, key: str, path: Path, extra: dict[str, str]) -> None:
    """One object to one file, in parallel ranged parts (s3transfer writes a temporary file and renames it)."""
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(
        multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=PARTS_AT_ONCE,
        preferred_transfer_client="classic",
    )
    client.download_file(bucket, key, str(path), ExtraArgs=extra or None, Config=config)


_ACCESS_CODES = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "TokenRefreshRequired", "AllAccessDisabled", "403", "Forbidden", "AccountProblem",
}


def classify(url: str, exc: Exception, work: Path) -> ModelSourceError:
    from botocore import exceptions as be

    resume = f" (files verified so far are kept in {work}; the next start resumes)" if work.exists() else ""
    if isinstance(exc, be.NoCredentialsError):
        return SourceAccessDenied(
            url, "no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an IAM role)"
        )
    if isinstance(exc, be.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")
        message = err.get("Message") or code
        if code in ("NoSuchBucket",):
            return SourceNotFound(url, f"bucket {parse_s3(url).bucket!r} does not exist ({message})")
        if code in ("NoSuchKey", "404", "NotFound"):
            return SourceNotFound(url, f"no such object ({code})")
        if code in _ACCESS_CODES:
            return SourceAccessDenied(url, f"access denied: {code}: {message} (check the AWS credentials and the bucket policy)")
        if code in ("PreconditionFailed", "412"):
            return SourceUnavailable(url, f"an object changed during the download ({code}){resume}")
        return SourceUnavailable(url, f"S3 answered {code}: {message}{resume}")
    if isinstance(exc, (be.EndpointConnectionError, be.ConnectionError, be.ConnectTimeoutError, be.ReadTimeoutError)):
        return SourceUnavailable(url, f"cannot reach S3: {exc}{resume}")
    if isinstance(exc, be.BotoCoreError):
        return SourceUnavailable(url, f"{type(exc).__name__}: {exc}{resume}")
    try:
        from s3transfer.exceptions import RetriesExceededError
    except ImportError:  # pragma: no cover
        RetriesExceededError = ()  # type: ignore[assignment]
    if RetriesExceededError and isinstance(exc, RetriesExceededError):
        return SourceUnavailable(url, f"the download was interrupted: {exc.last_exception or exc}{resume}")
    if isinstance(exc, OSError):
        return SourceUnavailable(url, f"cannot write the download: {exc}{resume}")
    return SourceUnavailable(url, f"{type(exc).__name__}: {exc}{resume}")

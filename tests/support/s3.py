"""A real S3-protocol server on loopback (moto's ThreadedMotoServer) for the s3:// model source.

`moto_s3` starts one server for the session; `s3_env` points boto3 at it through the standard
environment (AWS_ENDPOINT_URL, fake static credentials, a region) and gives each test its own
cache directory, so the code under test is configured exactly as a user would configure it.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

FAKE_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
# Variables that could point boto3 elsewhere than the test server (a developer's own setup).
_AWS_VARS = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3",
    "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "SERVING_DOWNLOAD_DIR", "AWS_RETRY_MODE",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s3_environment(endpoint: str, cache: Path | None = None) -> dict[str, str]:
    """What a user sets to point the server at this S3 endpoint (credentials are fake but signed)."""
    env = {
        **FAKE_KEYS, "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "2", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    if cache is not None:
        env["LMI_SERVER_CACHE"] = str(cache)
    return env


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """The endpoint URL of an S3 server on 127.0.0.1 for the whole session."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_s3, tmp_path, monkeypatch) -> str:
    """boto3 configured for the test server by environment alone; a fresh cache per test."""
    for name in _AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_environment(moto_s3, tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    return moto_s3


def s3_client(endpoint: str):
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=FAKE_KEYS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=FAKE_KEYS["AWS_SECRET_ACCESS_KEY"],
    )


def upload_dir(endpoint: str, bucket: str, prefix: str, src: Path, *, multipart_bytes: int | None = None) -> list[str]:
    """Upload every file under `src` to s3://bucket/prefix/ (creating the bucket); returns the keys."""
    from boto3.s3.transfer import TransferConfig

    client = s3_client(endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    config = TransferConfig(multipart_threshold=multipart_bytes, multipart_chunksize=multipart_bytes) if multipart_bytes else None
    keys = []
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        key = f"{prefix.strip('/')}/{path.relative_to(src).as_posix()}" if prefix.strip("/") else path.relative_to(src).as_posix()
        client.upload_file(str(path), bucket, key, Config=config)
        keys.append(key)
    return keys


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()

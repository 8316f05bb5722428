"""s3:// model sources against a real S3-protocol server on loopback (moto's ThreadedMotoServer):
prefix and .zip downloads, verification, resume after a crash, and each failure as a typed error
that names the URL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lmi_server import model_source as ms
from tests.support.s3 import moto_s3, s3_client, s3_env, upload_dir, zip_bytes  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file() and p.name != ms.MANIFEST}


class Crash(BaseException):
    """Stands for the process dying: nothing of ours catches it."""


def counting_transfer(monkeypatch, *, crash_on: int | None = None, corrupt: bool = False) -> list[str]:
    """Wrap the one function that moves bytes: count the objects fetched, crash or corrupt on demand."""
    calls: list[str] = []
    real = ms.s3.transfer

    def transfer(client, bucket, key, path, extra):
        calls.append(key)
        if crash_on is not None and len(calls) == crash_on:
            path.write_bytes(b"half a file")  # what a transfer cut short leaves behind
            raise Crash()
        real(client, bucket, key, path, extra)
        if corrupt:
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))

    monkeypatch.setattr(ms.s3, "transfer", transfer)
    return calls


FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b"{}" * 1000,
    "model.safetensors": os.urandom(300_000),
    "nested/extra.txt": b"x",
}


def test_a_prefix_is_downloaded_once_into_the_cache(s3_env, tmp_path, monkeypatch):
    upload_dir(s3_env, "models", "team/llama-tiny", write_files(tmp_path / "src", FILES))
    s3_client(s3_env).put_object(Bucket="models", Key="team/llama-tiny/empty-folder/", Body=b"")  # console "folder"
    s3_client(s3_env).put_object(Bucket="models", Key="team/llama-tiny-other/config.json", Body=b"not mine")
    url = "s3://models/team/llama-tiny"
    assert ms.downloaded(url) is None
    assert "will be downloaded to" in ms.plan_note(url)
    d = ms.fetch(url)
    assert d.is_relative_to(tmp_path / "cache" / "download") and d == ms.local_dir(url)
    assert tree(d) == FILES
    manifest = json.loads((d / ms.MANIFEST).read_text())
    assert manifest["url"] == url and set(manifest["objects"]) == {f"team/llama-tiny/{k}" for k in FILES}
    assert not list(d.parent.glob("*.partial"))
    assert ms.downloaded(url) == d and "downloaded already" in ms.plan_note(url)
    # A complete copy is reused without contacting S3 at all.
    monkeypatch.setattr(ms.s3, "client", lambda url: pytest.fail("S3 contacted for a complete copy"))
    assert ms.fetch(url + "/") == d


def test_large_files_come_in_parallel_parts_and_are_checked_against_the_multipart_etag(s3_env, tmp_path, monkeypatch):
    big = os.urandom(11 * 2**20 + 123)
    upload_dir(s3_env, "models", "big", write_files(tmp_path / "src", {"w.bin": big}), multipart_bytes=5 * 2**20)
    head = s3_client(s3_env).head_object(Bucket="models", Key="big/w.bin")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart upload's ETag
    monkeypatch.setattr(ms.s3, "PART_BYTES", 5 * 2**20)
    assert tree(ms.fetch("s3://models/big")) == {"w.bin": big}
    # The same object, one byte flipped after the transfer: refused by its multipart ETag.
    calls = counting_transfer(monkeypatch, corrupt=True)
    monkeypatch.setenv("LMI_SERVER_CACHE", str(tmp_path / "other-cache"))
    with pytest.raises(ms.SourceCorrupt, match="big/w.bin: .*differs"):
        ms.fetch("s3://models/big")
    assert calls == ["big/w.bin"] and ms.downloaded("s3://models/big") is None


def test_a_file_that_does_not_match_its_etag_is_refused_and_nothing_is_served(s3_env, tmp_path, monkeypatch):
    upload_dir(s3_env, "models", "bad", write_files(tmp_path / "src", {"config.json": b"{}", "model.safetensors": b"w" * 5000}))
    counting_transfer(monkeypatch, corrupt=True)
    with pytest.raises(ms.SourceCorrupt) as err:
        ms.fetch("s3://models/bad")
    assert str(err.value).startswith("s3://models/bad: ") and "differs" in str(err.value)
    dest = ms.local_dir("s3://models/bad")
    assert not dest.exists() and ms.downloaded("s3://models/bad") is None
    partial = dest.with_name(dest.name + ms.PARTIAL_SUFFIX)
    assert not list((partial / ms.DONE_DIR).glob("*.json"))  # nothing recorded as verified


def test_an_interrupted_download_resumes_with_the_files_not_yet_verified(s3_env, tmp_path, monkeypatch):
    upload_dir(s3_env, "models", "resume", write_files(tmp_path / "src", FILES))
    url = "s3://models/resume"
    monkeypatch.setattr(ms.s3, "FILES_AT_ONCE", 1)  # one file at a time: a deterministic crash point
    first = counting_transfer(monkeypatch, crash_on=3)
    with pytest.raises(Crash):
        ms.fetch(url)
    dest = ms.local_dir(url)
    partial = dest.with_name(dest.name + ms.PARTIAL_SUFFIX)
    assert not dest.exists() and ms.downloaded(url) is None  # never a half-loaded model
    assert len(first) == 3 and partial.is_dir()
    crashed = partial / first[2].removeprefix("resume/")
    assert crashed.read_bytes() == b"half a file"
    # A file of the right size but not recorded as verified is not trusted either.
    unrecorded = next(k for k in FILES if f"resume/{k}" not in first)
    write_files(partial, {unrecorded: FILES[unrecorded]})

    again = counting_transfer(monkeypatch)
    d = ms.fetch(url)
    assert sorted(again) == sorted(f"resume/{k}" for k in FILES if f"resume/{k}" not in first[:2])
    assert tree(d) == FILES and not partial.exists()


def test_a_zip_is_downloaded_verified_and_extracted(s3_env, tmp_path):
    client = s3_client(s3_env)
    client.create_bucket(Bucket="zips")
    client.put_object(Bucket="zips", Key="flat.zip", Body=zip_bytes(FILES))
    client.put_object(Bucket="zips", Key="nested.zip", Body=zip_bytes({f"llama/{k}": v for k, v in FILES.items()}))
    client.put_object(Bucket="zips", Key="lmi-style/model.zip", Body=zip_bytes(FILES))  # a prefix holding one archive
    flat = ms.fetch("s3://zips/flat.zip")
    assert tree(flat) == FILES
    nested = ms.fetch("s3://zips/nested.zip")
    assert nested.name == "llama" and tree(nested) == FILES  # one top-level directory: that directory
    assert ms.downloaded("s3://zips/nested.zip") == nested
    assert tree(ms.fetch("s3://zips/lmi-style")) == FILES
    assert not list(flat.parent.glob("*.partial*"))  # the archive itself is not kept


@pytest.mark.parametrize("member", ["../escape.txt", "/abs/escape.txt", "a/../../escape.txt"])
def test_a_zip_member_outside_the_directory_is_refused(s3_env, tmp_path, member):
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("config.json", b"{}")
        zf.writestr(zipfile.ZipInfo(member), b"owned")
    client = s3_client(s3_env)
    client.create_bucket(Bucket="evil")
    client.put_object(Bucket="evil", Key="m.zip", Body=buf.getvalue())
    with pytest.raises(ms.SourceCorrupt, match="outside the model directory"):
        ms.fetch("s3://evil/m.zip")
    assert not list(tmp_path.rglob("escape.txt")) and ms.downloaded("s3://evil/m.zip") is None


def test_a_missing_bucket_prefix_or_key_is_named(s3_env, tmp_path):
    s3_client(s3_env).create_bucket(Bucket="empty")
    with pytest.raises(ms.SourceNotFound, match=r"^s3://no-such-bucket/m: bucket 'no-such-bucket' does not exist"):
        ms.fetch("s3://no-such-bucket/m")
    with pytest.raises(ms.SourceNotFound, match=r"^s3://empty/nothing/here: no objects under s3://empty/nothing/here/"):
        ms.fetch("s3://empty/nothing/here")
    with pytest.raises(ms.SourceNotFound, match=r"^s3://empty/m.zip: no such object"):
        ms.fetch("s3://empty/m.zip")


def test_bad_credentials_are_an_access_error(s3_env, monkeypatch):
    from moto import settings

    s3_client(s3_env).create_bucket(Bucket="private")
    s3_client(s3_env).put_object(Bucket="private", Key="m/config.json", Body=b"{}")
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server now checks every signature
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(ms.SourceAccessDenied, match=r"^s3://private/m: access denied: \w+"):
        ms.fetch("s3://private/m")


def test_no_credentials_at_all_say_where_they_are_looked_for(s3_env, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    with pytest.raises(ms.SourceAccessDenied, match="no AWS credentials found .*AWS_PROFILE"):
        ms.fetch("s3://private/m")


def test_an_unreachable_endpoint_is_a_clear_error(s3_env, monkeypatch):
    from tests.support.s3 import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(ms.SourceUnavailable, match=r"^s3://models/m: cannot reach S3: .*127\.0\.0\.1"):
        ms.fetch("s3://models/m")


@pytest.mark.parametrize("url", ["s3://", "s3:///key", "s3://b/../x", "s3://bad bucket/x"])
def test_malformed_urls_are_refused_before_any_request(url):
    with pytest.raises(ms.SourceInvalid):
        ms.parse_s3(url)


def test_keys_that_would_escape_the_directory_are_refused(s3_env):
    client = s3_client(s3_env)
    client.create_bucket(Bucket="odd")
    client.put_object(Bucket="odd", Key="m/../../escape", Body=b"x")
    with pytest.raises(ms.SourceCorrupt, match="outside the model directory"):
        ms.fetch("s3://odd/m")


def test_serving_download_dir_moves_the_cache(s3_env, tmp_path, monkeypatch):
    monkeypatch.setenv("SERVING_DOWNLOAD_DIR", str(tmp_path / "lmi-downloads"))
    assert ms.local_dir("s3://bucket/m").parent == tmp_path / "lmi-downloads"


def test_a_directory_without_a_manifest_is_never_taken_for_a_download(s3_env, tmp_path):
    upload_dir(s3_env, "models", "stale", write_files(tmp_path / "src", {"config.json": b"{}"}))
    dest = ms.local_dir("s3://models/stale")
    write_files(dest, {"config.json": b"old", "junk.bin": b"x"})  # e.g. copied by hand
    assert ms.downloaded("s3://models/stale") is None
    assert tree(ms.fetch("s3://models/stale")) == {"config.json": b"{}"}

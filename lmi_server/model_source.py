"""Where a model comes from: a reference -> a local directory, for the model, a draft and an adapter.

Local directories, hub ids and the built-in names are left as they are (vLLM and the demo
builders handle them); `s3://bucket/prefix` and `s3://bucket/key.zip` are downloaded here, once,
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

import base64
import fcntl
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import threading
import time
import zipfile
import zlib
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = ".lmi-source.json"
DONE_DIR = ".lmi-verified"
PARTIAL_SUFFIX = ".partial"
FILES_AT_ONCE = 4
PARTS_AT_ONCE = 8
PART_BYTES = 16 * 1024 * 1024
_BLOCK = 4 * 1024 * 1024


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


def cache_root() -> Path:
    """Downloads live under SERVING_DOWNLOAD_DIR (LMI's variable) or the server's cache directory."""
    explicit = os.environ.get("SERVING_DOWNLOAD_DIR")
    if explicit:
        return Path(explicit)
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
        _Download(url, parsed, dest).run()
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


@dataclass(frozen=True)
class _Object:
    key: str
    rel: str
    size: int
    etag: str


class _Download:
    def __init__(self, url: str, parsed: S3Url, dest: Path):
        self.url, self.parsed, self.dest = url, parsed, dest
        self.work = dest.with_name(dest.name + PARTIAL_SUFFIX)
        self.client = _client(url)
        self._failed = threading.Event()
        self._lock = threading.Lock()
        self._progress = [0, 0]

    # ------------------------------------------------------------------ steps

    def run(self) -> None:
        objects, archive = self._list()
        self._check_space(objects)
        self.work.mkdir(parents=True, exist_ok=True)
        if archive is not None:
            zip_path = self.work.with_name(self.work.name + ".zip")
            self._fetch_all([(archive, zip_path)], self.work.with_name(self.work.name + ".zip-verified"))
            root = self._extract(zip_path)
        else:
            self._fetch_all([(o, self.work / o.rel) for o in objects], self.work / DONE_DIR)
            self._drop_leftovers(objects)
            root = ""
        self._finish(objects, root)
        if archive is not None:
            zip_path.unlink(missing_ok=True)
            shutil.rmtree(self.work.with_name(self.work.name + ".zip-verified"), ignore_errors=True)

    def _list(self) -> tuple[list[_Object], _Object | None]:
        """The objects to fetch, and the archive when the reference is a .zip."""
        if self.parsed.is_zip:
            head = self._call(self.client.head_object, Bucket=self.parsed.bucket, Key=self.parsed.key)
            obj = _Object(self.parsed.key, PurePosixPath(self.parsed.key).name, int(head["ContentLength"]), _etag(head))
            return [obj], obj
        objects: list[_Object] = []
        prefix = self.parsed.prefix
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.parsed.bucket, Prefix=prefix)
        for page in self._call(lambda: list(pages)):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/"):
                    continue  # a "folder" marker
                objects.append(_Object(key, _safe_rel(self.url, key[len(prefix):]), int(item["Size"]), _etag(item)))
        if not objects:
            raise SourceNotFound(self.url, f"no objects under s3://{self.parsed.bucket}/{prefix} (check the prefix)")
        if len(objects) == 1 and objects[0].key.lower().endswith(".zip"):
            return objects, objects[0]  # LMI: a prefix holding one archive is that archive
        return objects, None

    def _check_space(self, objects: list[_Object]) -> None:
        need = sum(o.size for o in objects) * (2 if objects and objects[0].key.lower().endswith(".zip") else 1)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        for kept in self.dest.parent.glob(glob.escape(self.work.name) + "*"):  # what a resumed download has already
            files = [kept] if kept.is_file() else [f for f in kept.rglob("*") if f.is_file()]
            need -= sum(f.stat().st_size for f in files)
        free = shutil.disk_usage(self.dest.parent).free
        if need > free:
            raise SourceUnavailable(
                self.url, f"needs {need / 2**30:.2f} GiB in {self.dest.parent} and only {free / 2**30:.2f} GiB is free"
            )

    def _fetch_all(self, jobs: list[tuple[_Object, Path]], done_dir: Path) -> None:
        """Fetch and verify every file not yet recorded as done, several at once."""
        done_dir.mkdir(parents=True, exist_ok=True)
        todo = [(o, p) for o, p in jobs if not _is_done(done_dir, o, p)]
        if len(todo) < len(jobs):
            log.info("%s: resuming, %d of %d files already verified", self.url, len(jobs) - len(todo), len(jobs))
        if not todo:
            return
        total = sum(o.size for o, _ in todo)
        log.info("%s: downloading %d files (%.1f MiB) into %s", self.url, len(todo), total / 2**20, self.work)
        self._progress = [0, len(todo)]
        with ThreadPoolExecutor(max_workers=min(FILES_AT_ONCE, len(todo)), thread_name_prefix="s3-fetch") as pool:
            futures = [pool.submit(self._fetch_guarded, o, p, done_dir) for o, p in todo]
            wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            raise failed[0]  # files verified so far stay recorded for the next start

    def _fetch_guarded(self, obj: _Object, path: Path, done_dir: Path) -> None:
        """After one failure no new file starts (those under way finish)."""
        if self._failed.is_set():
            return
        try:
            self._fetch_one(obj, path, done_dir)
        except BaseException:
            self._failed.set()
            raise

    def _fetch_one(self, obj: _Object, path: Path, done_dir: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        head = self._call(self.client.head_object, Bucket=self.parsed.bucket, Key=obj.key, ChecksumMode="ENABLED")
        extra = {"VersionId": head["VersionId"]} if head.get("VersionId") and head["VersionId"] != "null" else {}
        self._call(_transfer, self.client, self.parsed.bucket, obj.key, path, extra)
        problem = _verify(path, obj, head, lambda n: self._part_sizes(obj, n))
        if problem is not None:
            path.unlink(missing_ok=True)
            raise SourceCorrupt(self.url, f"{obj.key}: {problem}; the file was removed, start again to fetch it anew")
        _mark_done(done_dir, obj)
        with self._lock:
            self._progress[0] += 1
            done, total = self._progress
        log.info("%s: %s verified (%d of %d files)", self.url, obj.key, done, total)

    def _part_sizes(self, obj: _Object, parts: int) -> list[int]:
        """Each part's size of a multipart object (to check its ETag exactly)."""
        return [
            int(self._call(self.client.head_object, Bucket=self.parsed.bucket, Key=obj.key, PartNumber=i)["ContentLength"])
            for i in range(1, parts + 1)
        ]

    def _extract(self, zip_path: Path) -> str:
        """Extract into the work directory afresh; returns the single top-level directory, if any."""
        for child in self.work.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        try:
            with zipfile.ZipFile(zip_path) as zf:
                _check_archive(self.url, zf, self.work)
                zf.extractall(self.work)
        except zipfile.BadZipFile as exc:
            zip_path.unlink(missing_ok=True)
            raise SourceCorrupt(self.url, f"not a valid zip archive ({exc})") from None
        entries = [p for p in self.work.iterdir()]
        return entries[0].name if len(entries) == 1 and entries[0].is_dir() else ""

    def _drop_leftovers(self, objects: list[_Object]) -> None:
        """Only the listed files stay: no records, no temporary file of a transfer cut short."""
        shutil.rmtree(self.work / DONE_DIR, ignore_errors=True)
        wanted = {o.rel for o in objects}
        for path in sorted(self.work.rglob("*"), reverse=True):
            rel = path.relative_to(self.work).as_posix()
            if path.is_file() and rel not in wanted:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()

    def _finish(self, objects: list[_Object], root: str) -> None:
        """Write the manifest last and let the directory appear in one rename."""
        manifest = {
            "url": self.url,
            "root": root,
            "downloaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "objects": {o.key: {"size": o.size, "etag": o.etag} for o in objects},
        }
        _write_atomic(self.work / MANIFEST, json.dumps(manifest, indent=1))
        _fsync_dir(self.work)
        if self.dest.exists():  # something without a manifest: never a copy of ours
            shutil.rmtree(self.dest)
        os.replace(self.work, self.dest)
        _fsync_dir(self.dest.parent)

    # ------------------------------------------------------------------ errors

    def _call(self, fn, *args, **kwargs):
        """Run one S3 call; botocore's and s3transfer's failures become typed errors naming the URL."""
        try:
            return fn(*args, **kwargs)
        except ModelSourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below, never shown as a traceback
            raise _classify(self.url, exc, self.work) from None


def _client(url: str):
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


def _transfer(client, bucket: str, key: str, path: Path, extra: dict[str, str]) -> None:
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


def _classify(url: str, exc: Exception, work: Path) -> ModelSourceError:
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


# ---------------------------------------------------------------------- files


def _safe_rel(url: str, rel: str) -> str:
    """A key below the prefix as a relative path that stays inside the directory."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or rel.startswith("/"):
        raise SourceCorrupt(url, f"object key {rel!r} would be written outside the model directory")
    return "/".join(parts)


def _etag(item: dict[str, Any]) -> str:
    return str(item.get("ETag", "")).strip('"')


def _marker(done_dir: Path, obj: _Object) -> Path:
    return done_dir / (hashlib.sha256(obj.key.encode()).hexdigest()[:32] + ".json")


def _is_done(done_dir: Path, obj: _Object, path: Path) -> bool:
    """Recorded as verified for this very object (same size and ETag) and still on disk at that size."""
    try:
        record = json.loads(_marker(done_dir, obj).read_text())
    except (OSError, ValueError):
        return False
    ok = record == {"key": obj.key, "size": obj.size, "etag": obj.etag}
    return ok and path.is_file() and path.stat().st_size == obj.size


def _mark_done(done_dir: Path, obj: _Object) -> None:
    _write_atomic(_marker(done_dir, obj), json.dumps({"key": obj.key, "size": obj.size, "etag": obj.etag}))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _verify(path: Path, obj: _Object, head: dict[str, Any], part_sizes) -> str | None:
    """None when the file is what S3 describes; else what differs."""
    size = path.stat().st_size if path.is_file() else -1
    if size != obj.size:
        return f"size {size} on disk, {obj.size} in S3"
    etag = _etag(head) or obj.etag
    if etag != obj.etag:
        return "the object changed since it was listed (ETag differs)"
    checksum = _full_object_checksum(head)
    encrypted = head.get("ServerSideEncryption") == "aws:kms" or head.get("SSECustomerAlgorithm")
    md5_etag = None if encrypted else _md5_etag(etag)
    if checksum is None and md5_etag is None:
        return None  # S3 gives nothing more to check than the size
    digests = _digests(path, checksum[0] if checksum else None, md5_etag)
    if checksum is not None and digests["checksum"] != checksum[1]:
        return f"{checksum[0]} checksum differs from the one S3 keeps"
    if md5_etag is not None:
        digest, parts = md5_etag
        if parts == 0 and digests["md5"] != digest:
            return "MD5 differs from the ETag"
        if parts and not _multipart_etag_matches(path, digest, parts, obj.size, part_sizes):
            return "content differs from the multipart ETag"
    return None


def _md5_etag(etag: str) -> tuple[str, int] | None:
    """(hex digest, parts) of an MD5-based ETag (parts 0 for a single upload); None for other ETags."""
    m = re.fullmatch(r"([0-9a-f]{32})(?:-(\d+))?", etag.lower())
    return (m.group(1), int(m.group(2) or 0)) if m else None


def _full_object_checksum(head: dict[str, Any]) -> tuple[str, str] | None:
    """(algorithm, base64 value) of a whole-object checksum this module can compute. A multipart
    object's checksum counts only when S3 says it covers the full object (else it is per part)."""
    kind = head.get("ChecksumType")
    if kind not in (None, "FULL_OBJECT") or (kind is None and "-" in _etag(head)):
        return None
    for algorithm in ("SHA256", "SHA1", "CRC32"):
        value = head.get(f"Checksum{algorithm}")
        if value and "-" not in value:
            return algorithm, value
    return None


def _digests(path: Path, algorithm: str | None, md5_etag: tuple[str, int] | None) -> dict[str, str]:
    md5 = hashlib.md5(usedforsecurity=False) if md5_etag and not md5_etag[1] else None
    sha = {"SHA256": hashlib.sha256, "SHA1": hashlib.sha1}.get(algorithm or "")
    sha_h = sha() if sha else None
    crc = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            if md5 is not None:
                md5.update(block)
            if sha_h is not None:
                sha_h.update(block)
            if algorithm == "CRC32":
                crc = zlib.crc32(block, crc)
    out = {"md5": md5.hexdigest() if md5 else ""}
    if sha_h is not None:
        out["checksum"] = base64.b64encode(sha_h.digest()).decode()
    elif algorithm == "CRC32":
        out["checksum"] = base64.b64encode(crc.to_bytes(4, "big")).decode()
    return out


def _multipart_etag(path: Path, sizes: list[int]) -> str:
    outer = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for size in sizes:
            inner = hashlib.md5(usedforsecurity=False)
            left = size
            while left:
                block = fh.read(min(_BLOCK, left))
                if not block:
                    break
                inner.update(block)
                left -= len(block)
            outer.update(inner.digest())
    return outer.hexdigest()


def _multipart_etag_matches(path: Path, digest: str, parts: int, size: int, part_sizes) -> bool:
    """Equal parts are tried first (one S3 call for the first part's size); else each part's size."""
    first = part_sizes(1)[0] if parts > 1 else size
    even = [first] * (parts - 1) + [size - first * (parts - 1)]
    if even[-1] > 0 and _multipart_etag(path, even) == digest:
        return True
    exact = part_sizes(parts)
    return sum(exact) == size and _multipart_etag(path, exact) == digest


def _check_archive(url: str, zf: zipfile.ZipFile, target: Path) -> None:
    """Every member a plain file or directory that lands inside `target`, and room for all of it."""
    root = target.resolve()
    total = 0
    for info in zf.infolist():
        name = info.filename
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise SourceCorrupt(url, f"archive member {name!r} is a symbolic link; refused")
        dest = (root / name).resolve()
        if name.startswith(("/", "\\")) or ".." in PurePosixPath(name.replace("\\", "/")).parts or not dest.is_relative_to(root):
            raise SourceCorrupt(url, f"archive member {name!r} would be written outside the model directory; refused")
        total += info.file_size
    free = shutil.disk_usage(target).free
    if total > free:
        raise SourceUnavailable(url, f"the archive unpacks to {total / 2**30:.2f} GiB and only {free / 2**30:.2f} GiB is free")

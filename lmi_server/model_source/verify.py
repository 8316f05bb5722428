"""Files of a download on disk: each verified against what S3 says (size, MD5 or multipart ETag, a
full-object checksum), recorded as done only then, written atomically; archives checked member by
member before they are extracted."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from lmi_server.source_ref import SourceCorrupt, SourceUnavailable

_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class S3Object:
    key: str
    rel: str
    size: int
    etag: str


def safe_rel(url: str, rel: str) -> str:
    """A key below the prefix as a relative path that stays inside the directory."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or rel.startswith("/"):
        raise SourceCorrupt(url, f"object key {rel!r} would be written outside the model directory")
    return "/".join(parts)


def etag_of(item: dict[str, Any]) -> str:
    return str(item.get("ETag", "")).strip('"')


def _marker(done_dir: Path, obj: S3Object) -> Path:
    return done_dir / (hashlib.sha256(obj.key.encode()).hexdigest()[:32] + ".json")


def is_done(done_dir: Path, obj: S3Object, path: Path) -> bool:
    """Recorded as verified for this very object (same size and ETag) and still on disk at that size."""
    try:
        record = json.loads(_marker(done_dir, obj).read_text())
    except (OSError, ValueError):
        return False
    ok = record == {"key": obj.key, "size": obj.size, "etag": obj.etag}
    return ok and path.is_file() and path.stat().st_size == obj.size


def mark_done(done_dir: Path, obj: S3Object) -> None:
    write_atomic(_marker(done_dir, obj), json.dumps({"key": obj.key, "size": obj.size, "etag": obj.etag}))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify(path: Path, obj: S3Object, head: dict[str, Any], part_sizes) -> str | None:
    """None when the file is what S3 describes; else what differs."""
    size = path.stat().st_size if path.is_file() else -1
    if size != obj.size:
        return f"size {size} on disk, {obj.size} in S3"
    etag = etag_of(head) or obj.etag
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
    if kind not in (None, "FULL_OBJECT") or (kind is None and "-" in etag_of(head)):
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


def check_archive(url: str, zf: zipfile.ZipFile, target: Path) -> None:
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

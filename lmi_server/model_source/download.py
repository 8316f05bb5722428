"""One download of an s3:// reference into `<dest>.partial/`, several files at once, each verified
and recorded before it counts; the finished directory appears by one rename with its manifest."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import threading
import time
import zipfile
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path, PurePosixPath

import lmi_server.model_source.s3 as s3
from lmi_server.model_source.verify import (
    S3Object,
    check_archive,
    etag_of,
    fsync_dir,
    is_done,
    mark_done,
    safe_rel,
    verify,
    write_atomic,
)
from lmi_server.source_ref import ModelSourceError, S3Url, SourceCorrupt, SourceNotFound, SourceUnavailable

log = logging.getLogger(__name__)

MANIFEST = ".lmi-source.json"
DONE_DIR = ".lmi-verified"
PARTIAL_SUFFIX = ".partial"


class Download:
    def __init__(self, url: str, parsed: S3Url, dest: Path):
        self.url, self.parsed, self.dest = url, parsed, dest
        self.work = dest.with_name(dest.name + PARTIAL_SUFFIX)
        self.client = s3.client(url)
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

    def _list(self) -> tuple[list[S3Object], S3Object | None]:
        """The objects to fetch, and the archive when the reference is a .zip."""
        if self.parsed.is_zip:
            head = self._call(self.client.head_object, Bucket=self.parsed.bucket, Key=self.parsed.key)
            obj = S3Object(self.parsed.key, PurePosixPath(self.parsed.key).name, int(head["ContentLength"]), etag_of(head))
            return [obj], obj
        objects: list[S3Object] = []
        prefix = self.parsed.prefix
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.parsed.bucket, Prefix=prefix)
        for page in self._call(lambda: list(pages)):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/"):
                    continue  # a "folder" marker
                objects.append(S3Object(key, safe_rel(self.url, key[len(prefix):]), int(item["Size"]), etag_of(item)))
        if not objects:
            raise SourceNotFound(self.url, f"no objects under s3://{self.parsed.bucket}/{prefix} (check the prefix)")
        if len(objects) == 1 and objects[0].key.lower().endswith(".zip"):
            return objects, objects[0]  # LMI: a prefix holding one archive is that archive
        return objects, None

    def _check_space(self, objects: list[S3Object]) -> None:
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

    def _fetch_all(self, jobs: list[tuple[S3Object, Path]], done_dir: Path) -> None:
        """Fetch and verify every file not yet recorded as done, several at once."""
        done_dir.mkdir(parents=True, exist_ok=True)
        todo = [(o, p) for o, p in jobs if not is_done(done_dir, o, p)]
        if len(todo) < len(jobs):
            log.info("%s: resuming, %d of %d files already verified", self.url, len(jobs) - len(todo), len(jobs))
        if not todo:
            return
        total = sum(o.size for o, _ in todo)
        log.info("%s: downloading %d files (%.1f MiB) into %s", self.url, len(todo), total / 2**20, self.work)
        self._progress = [0, len(todo)]
        with ThreadPoolExecutor(max_workers=min(s3.FILES_AT_ONCE, len(todo)), thread_name_prefix="s3-fetch") as pool:
            futures = [pool.submit(self._fetch_guarded, o, p, done_dir) for o, p in todo]
            wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            raise failed[0]  # files verified so far stay recorded for the next start

    def _fetch_guarded(self, obj: S3Object, path: Path, done_dir: Path) -> None:
        """After one failure no new file starts (those under way finish)."""
        if self._failed.is_set():
            return
        try:
            self._fetch_one(obj, path, done_dir)
        except BaseException:
            self._failed.set()
            raise

    def _fetch_one(self, obj: S3Object, path: Path, done_dir: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        head = self._call(self.client.head_object, Bucket=self.parsed.bucket, Key=obj.key, ChecksumMode="ENABLED")
        extra = {"VersionId": head["VersionId"]} if head.get("VersionId") and head["VersionId"] != "null" else {}
        self._call(s3.transfer, self.client, self.parsed.bucket, obj.key, path, extra)
        problem = verify(path, obj, head, lambda n: self._part_sizes(obj, n))
        if problem is not None:
            path.unlink(missing_ok=True)
            raise SourceCorrupt(self.url, f"{obj.key}: {problem}; the file was removed, start again to fetch it anew")
        mark_done(done_dir, obj)
        with self._lock:
            self._progress[0] += 1
            done, total = self._progress
        log.info("%s: %s verified (%d of %d files)", self.url, obj.key, done, total)

    def _part_sizes(self, obj: S3Object, parts: int) -> list[int]:
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
                check_archive(self.url, zf, self.work)
                zf.extractall(self.work)
        except zipfile.BadZipFile as exc:
            zip_path.unlink(missing_ok=True)
            raise SourceCorrupt(self.url, f"not a valid zip archive ({exc})") from None
        entries = [p for p in self.work.iterdir()]
        return entries[0].name if len(entries) == 1 and entries[0].is_dir() else ""

    def _drop_leftovers(self, objects: list[S3Object]) -> None:
        """Only the listed files stay: no records, no temporary file of a transfer cut short."""
        shutil.rmtree(self.work / DONE_DIR, ignore_errors=True)
        wanted = {o.rel for o in objects}
        for path in sorted(self.work.rglob("*"), reverse=True):
            rel = path.relative_to(self.work).as_posix()
            if path.is_file() and rel not in wanted:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()

    def _finish(self, objects: list[S3Object], root: str) -> None:
        """Write the manifest last and let the directory appear in one rename."""
        manifest = {
            "url": self.url,
            "root": root,
            "downloaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "objects": {o.key: {"size": o.size, "etag": o.etag} for o in objects},
        }
        write_atomic(self.work / MANIFEST, json.dumps(manifest, indent=1))
        fsync_dir(self.work)
        if self.dest.exists():  # something without a manifest: never a copy of ours
            shutil.rmtree(self.dest)
        os.replace(self.work, self.dest)
        fsync_dir(self.dest.parent)

    # ------------------------------------------------------------------ errors

    def _call(self, fn, *args, **kwargs):
        """Run one S3 call; botocore's and s3transfer's failures become typed errors naming the URL."""
        try:
            return fn(*args, **kwargs)
        except ModelSourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below, never shown as a traceback
            raise s3.classify(self.url, exc, self.work) from None

"""Blob: the key-value store a shard keeps its bytes in (get, put, delete, list; nothing else).

Contract (tested by `persistshard.conformance`):
- ``put(key, data)`` is atomic: a concurrent ``get`` returns either nothing or all of ``data``,
  never a prefix. Keys are written once by the shard; ``put`` on an existing key replaces it
  (used only for idempotent retries of identical bytes).
- ``put_if_absent(key, data)`` is atomic *and* exclusive: of N racing callers, exactly one
  returns True. Only backends listed in `ATOMIC_CREATE_PROTOCOLS` promise this; on others it
  raises `StorageUnsupported` (fsspec's generic create checks, then writes: not atomic).
- ``get`` after a successful ``put`` returns the bytes (read-after-write).
- ``delete`` is idempotent: deleting a missing key succeeds.
- ``list(prefix)`` returns every key under ``prefix`` with its size, in key order.
- There are no appends and no in-place rewrites.

Local files: ``put`` writes a temporary sibling and renames it into place; ``put_if_absent``
writes a temporary sibling and hard-links it to the key (``link`` fails if the key exists),
so a reader never sees a partial object and exactly one creator wins.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from persistshard.errors import StorageUnsupported

#: Protocols whose exclusive create (``open(path, "xb")``) is atomic.
ATOMIC_CREATE_PROTOCOLS = frozenset({"file", "local", "memory", "s3", "s3a"})


def _publish_local(path: str, data: bytes, publish: Callable[[str, str], None]) -> None:
    """Write ``data`` to a temporary sibling of ``path``, then ``publish(tmp, path)`` it
    (``os.replace``: atomic overwrite; ``os.link``: atomic create-if-absent). Readers never
    see a partial file; the temporary file is always removed."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@dataclass(frozen=True)
class BlobMeta:
    """A key and its size in bytes."""

    key: str
    size: int


class Blob:
    """A blob store rooted at ``url`` (any fsspec URL or local path)."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.fs = fs
        self.url = url
        self.root = root.rstrip("/") if root not in ("", "/") else root
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.protocol = protocol
        self._local = isinstance(fs, LocalFileSystem)

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, key) if self.root else key

    @property
    def supports_atomic_create(self) -> bool:
        """Whether `put_if_absent` is atomic and exclusive on this backend."""
        return self._local or self.protocol in ATOMIC_CREATE_PROTOCOLS

    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if there is no such key."""
        try:
            data: bytes = self.fs.cat_file(self._path(key))
            return data
        except FileNotFoundError:
            return None

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (a ranged get); fewer if the object is shorter."""
        data: bytes = self.fs.cat_file(self._path(key), start=offset, end=offset + length)
        return data

    def size(self, key: str) -> int | None:
        """The object's size, or None if there is no such key."""
        try:
            return int(self.fs.size(self._path(key)))
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically (readers see all of it or none)."""
        path = self._path(key)
        if self._local:
            _publish_local(path, data, os.replace)
            return
        self.fs.pipe_file(path, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists; True if this call created it.

        Atomic and exclusive where `supports_atomic_create`; raises `StorageUnsupported`
        elsewhere. An ``OSError`` other than "exists" leaves the outcome unknown: the object
        may or may not have been created.
        """
        path = self._path(key)
        if self._local:
            try:
                _publish_local(path, data, os.link)  # link fails if the key exists
                return True
            except FileExistsError:
                return False
        if not self.supports_atomic_create:
            raise StorageUnsupported(
                f"the {self.protocol!r} filesystem has no atomic put-if-absent, which the "
                "default consensus needs; pass a consensus that can compare-and-set "
                "(for example on local files, memory or S3)",
                location=self.url,
            )
        try:
            with self.fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False

    def delete(self, key: str) -> None:
        """Remove ``key``; succeeds when it is already gone."""
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def list(self, prefix: str = "") -> list[BlobMeta]:
        """Every key under ``prefix`` (a "directory" prefix ending in ``/`` or a key prefix)."""
        base = self._path(prefix)
        directory = base if prefix.endswith("/") or not prefix else posixpath.dirname(base)
        try:
            entries = self.fs.find(directory, detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        root = self.root.rstrip("/")
        out = []
        for path, info in entries.items():
            rel = path[len(root) :].lstrip("/") if root else path.lstrip("/")
            name = posixpath.basename(rel)
            if name.startswith(".tmp-"):
                continue
            if rel.startswith(prefix):
                out.append(BlobMeta(rel, int(info.get("size") or 0)))
        out.sort(key=lambda m: m.key)
        return out

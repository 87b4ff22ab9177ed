"""Blob: the key-value store a shard keeps its bytes in (get, put, delete, list; nothing else).

`Blob` is a small abstract interface; `FsspecBlob` (any fsspec URL: local files, memory, S3,
...) is the implementation a location opens by default (`open_blob`; calling ``Blob(url)``
builds one too), and `BlobWrapper` is the base of wrappers such as fault injection
(`persistshard.conformance.faults.FaultyBlob`). Each implementation declares its
`Capabilities`: whether ``put_if_absent`` is atomic and exclusive, and whether the data is
shared between processes (Spark refuses storage that is not).

Contract (every implementation; tested by `persistshard.conformance`):
- ``put(key, data)`` is atomic: a concurrent ``get`` returns either nothing or all of ``data``,
  never a prefix. Keys are written once by the shard; ``put`` on an existing key replaces it
  (used only for idempotent retries of identical bytes, and for the best-effort HEAD hint).
- ``put_if_absent(key, data)`` is atomic *and* exclusive where ``capabilities.atomic_create``:
  of N racing callers, exactly one returns True; elsewhere it raises `StorageUnsupported`.
- ``get`` after a successful ``put`` returns the bytes (read-after-write), also through
  another handle or process when ``capabilities.shared``.
- ``delete`` is idempotent: deleting a missing key succeeds.
- ``list(prefix)`` returns every key under ``prefix`` with its size, in key order, except
  temporary ``.tmp-`` objects of puts in progress (`list_temporary` lists those, for gc).
- There are no appends and no in-place rewrites.
- Errors are ``OSError`` (`is_certain_refusal` tells those that certainly applied nothing),
  except that a local put whose own temporary file was deleted twice before it could be
  published (gc with a retention shorter than the write) is `StorageError` (nothing
  published); once, it is written again. A local ``put_if_absent`` whose ``link`` reports
  EEXIST for the put's own file (NFS: a retried link whose first reply was lost) is created.
- Durability: once ``put`` or ``put_if_absent`` returns, the object survives a crash of the
  process or the machine (local files: the data and the directory entry were fsynced, see
  `_publish_local`; S3: a successful PutObject is durable; memory: nothing survives the
  process, which is why Spark refuses it). ``delete`` is not synced: a crash may bring a
  deleted object back, and the shard only deletes objects no durable state needs.
  docs/design.md, "Durability contract", states this per store.
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
import posixpath
import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from persistshard.errors import (
    Indeterminate,
    PersistShardError,
    StorageError,
    StorageUnsupported,
    is_access_error,
    is_storage_error,
    storage_cause,
    storage_error,
)

log = logging.getLogger("persistshard.core.storage.blob")

#: Protocols whose exclusive create (``open(path, "xb")``) is atomic (S3: with a recent
#: enough s3fs, see `MIN_S3FS`).
ATOMIC_CREATE_PROTOCOLS = frozenset({"file", "local", "memory", "s3", "s3a"})
#: The first s3fs whose exclusive create sends ``If-None-Match`` for every object size
#: (fsspec/s3fs#974: before it, small files were written unconditionally).
MIN_S3FS = (2025, 7, 0)
#: Prefix of the temporary objects a put writes before publishing them.
TMP_PREFIX = ".tmp-"
#: The Hadoop file system scheme that opens the same objects as a location's URL scheme
#: (`FsspecBlob.hadoop_url`): s3fs's ``s3://bucket/key`` is S3A's ``s3a://bucket/key``,
#: gcsfs's ``gs://bucket/key`` the GCS connector's, and an ``hdfs://`` URL names the same
#: file to pyarrow and to Hadoop. Azure is left out: adlfs names the storage account in its
#: storage options, Hadoop's ABFS in the URL's host, so one URL does not name one object.
HADOOP_SCHEMES = {"s3": "s3a", "s3a": "s3a", "gs": "gs", "gcs": "gs", "hdfs": "hdfs"}
#: What a URL's host and path may hold to be handed to Hadoop as it is: no user info (so no
#: credentials), no query, no character Hadoop's ``Path`` would escape.
_HADOOP_HOST = re.compile(r"[A-Za-z0-9._-]+(:[0-9]+)?")
_HADOOP_PATH = re.compile(r"[A-Za-z0-9._~=+/-]*")


def hadoop_url_of(location: str, key: str) -> str | None:
    """The URL Hadoop's file systems open object ``key`` of the store at ``location`` by
    (`HADOOP_SCHEMES`), or None: a scheme without a Hadoop twin, or a location that is not a
    plain ``scheme://host/path`` of safe characters (a chained URL, a query, user info).
    It never holds credentials (a URL with user info gives None), and names only the object:
    what Hadoop needs to reach it (endpoint, keys) is the session's Hadoop configuration."""
    scheme, sep, rest = location.partition("://")
    hadoop = HADOOP_SCHEMES.get(scheme.lower())
    host, _, path = rest.partition("/")
    if not sep or hadoop is None or not _HADOOP_HOST.fullmatch(host):
        return None
    path = "/".join(p for p in f"{path}/{key}".split("/") if p)
    if not _HADOOP_PATH.fullmatch(path):
        return None
    return f"{hadoop}://{host}/{path}"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


#: The package (and the extra of persistshard that brings it) of a protocol's fsspec
#: implementation.
PROTOCOL_PACKAGES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3")}


def _missing_filesystem(url: str, cause: ImportError) -> ModuleNotFoundError:
    """The error for ``url`` whose fsspec implementation is not installed (``cause`` is
    fsspec's, which names the package): the extra that brings it where there is one. The
    URL itself is left out (a user:password part would be a secret)."""
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    package, extra = PROTOCOL_PACKAGES.get(protocol, (cause.name, None))
    fix = f"pip install 'persistshard[{extra}]'" if extra else "install that package"
    return ModuleNotFoundError(
        f"a location on {protocol}:// needs fsspec's implementation of it, which is not "
        f"installed ({cause}): {fix}",
        name=package,
    )


def _s3fs_atomic() -> bool:
    try:
        import s3fs
    except ImportError:
        return False
    return _version_tuple(getattr(s3fs, "__version__", "0")) >= MIN_S3FS


#: errno values by which a storage refuses a request for certain, having applied nothing
#: (besides permission errors: `is_certain_refusal`).
REFUSAL_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def is_certain_refusal(error: BaseException) -> bool:
    """Whether ``error`` (raised by a storage request) is a refusal that certainly applied
    nothing and that retrying the same way cannot help: permission denied (also an S3 403,
    which s3fs raises as `PermissionError`), a read-only file system, a full disk or quota,
    missing or refused credentials. Timeouts, resets and other errors are not: the request
    may have been applied. Our own errors are not the storage's (a `StorageError` is an
    `OSError` too, already said): False."""
    if isinstance(error, PersistShardError):
        return False
    if isinstance(error, PermissionError):
        return True
    if isinstance(error, OSError) and error.errno in REFUSAL_ERRNOS:
        return True
    return is_access_error(error) and not isinstance(error, TimeoutError)


def as_storage_error(error: BaseException, location: str | None, doing: str) -> StorageError | None:
    """The one translation of an error that ended ``doing`` something at ``location`` into
    the `StorageError` its caller is told, or None when ``error`` is raised as it is. Used by
    the CLI, the Spark paths (`persistshard.datasource.options.storage_errors`) and a commit
    that fails before its first attempt could land (`StateMachine`).

    - A raw storage error (`persistshard.errors.is_storage_error`: an `OSError` that is not
      ours, a storage library's own) is `StorageError` naming ``location``, ``doing``, the
      storage's reason and the fix (`persistshard.errors.storage_error`).
    - A `StorageError` whose cause is a certain refusal (`is_certain_refusal`) is said again
      with ``doing``'s words; any other `StorageError` stays as it is.
    - An `Indeterminate` whose root cause is a refused access (`is_access_error`: a
      read-only location, credentials that may only read) is `StorageError`: a write the
      storage refused for lack of access did not land. Any other `Indeterminate` stays.
    - Everything else (our other errors, a bug) stays as it is.

    The translation never turns a determinate error into an indeterminate one, nor the other
    way except for the refused access above."""
    if isinstance(error, Indeterminate):
        cause = storage_cause(error)
        if cause is None or not is_access_error(cause):
            return None
        return storage_error(cause, location, doing)
    if isinstance(error, StorageError):
        if error.cause is None or not is_certain_refusal(error.cause):
            return None
        return storage_error(error.cause, location, doing)
    if is_storage_error(error):
        return storage_error(error, location, doing)
    return None


def temporary_name() -> str:
    """A fresh temporary file name: `TMP_PREFIX`, the wall-clock ms (12 hex digits), random."""
    return f"{TMP_PREFIX}{int(time.time() * 1000):012x}{uuid.uuid4().hex[:20]}"


def temporary_time_ms(key: str) -> int | None:
    """When a temporary file named by `temporary_name` was made, else None."""
    name = posixpath.basename(key)
    if not name.startswith(TMP_PREFIX):
        return None
    try:
        return int(name[len(TMP_PREFIX) : len(TMP_PREFIX) + 12], 16)
    except ValueError:
        return None


def _info_ms(info: dict[str, Any]) -> int | None:
    """The modification time in a filesystem listing entry, in ms, if it has one."""
    for name in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(name)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1000)
        try:
            return int(float(value) * 1000)
        except (TypeError, ValueError):
            continue
    return None


#: Whether local puts sync (file data, then its directory entry) before returning. Always True
#: in use; the commit-latency benchmark turns it off to show what durability costs.
SYNC_LOCAL = True

#: A storage option for benchmarks only: ``unsafe_no_sync=true`` makes that `FsspecBlob`'s
#: local puts skip every sync (as `SYNC_LOCAL` = False does for a whole process). It travels
#: with the storage options (Spark: ``storage.unsafe_no_sync``) to every task and commit of a
#: job, so the Spark benchmark measures syncing on and off in one run (`benchmarks.
#: spark_sync_bench`). An acknowledged commit made with it can be lost to a power cut.
NO_SYNC_OPTION = "unsafe_no_sync"


def _sync_dir(directory: str) -> None:
    """Make ``directory``'s entries (names created, linked, renamed or removed in it) durable."""
    if not SYNC_LOCAL or os.name == "nt":  # Windows cannot open a directory to sync it
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(directory: str) -> list[str]:
    """Create ``directory`` and its missing ancestors (``os.mkdir``, one level at a time);
    the parents whose entries changed, deepest first, for the caller to sync."""
    missing = []
    path = directory
    while path and not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    changed = []
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            continue  # a concurrent put made it; its own put syncs the parent
        changed.append(os.path.dirname(path))
    return changed[::-1]


def _publish_local(
    path: str, data: bytes, publish: Callable[[str, str], None], *, sync: bool = True
) -> None:
    """`_publish_once`, written again once if its own temporary file vanished before it was
    published (gc with a small retention, or a clock far ahead, took it for an abandoned
    one): nothing was published then, so trying again is safe. Vanishing twice is
    `StorageError` (nothing published), never a raw ``FileNotFoundError``."""
    for attempt in range(2):
        try:
            _publish_once(path, data, publish, sync=sync)
            return
        except _TemporaryVanished as e:
            log.warning("%s: its temporary file vanished before it was published (%s)", path, e)
            if attempt:
                raise StorageError(
                    f"cannot write {path}: its temporary file was deleted twice before it "
                    "could be published (is gc running with a retention shorter than a "
                    "write takes, or a clock far ahead?); nothing was published, retry",
                    location=os.path.dirname(path),
                    cause=e,
                ) from e


class _TemporaryVanished(FileNotFoundError):
    """The temporary file of a put was gone when it was to be published."""


def _publish_once(
    path: str, data: bytes, publish: Callable[[str, str], None], *, sync: bool = True
) -> None:
    """Write ``data`` to a temporary sibling of ``path``, then ``publish(tmp, path)`` it
    (``os.replace``: atomic overwrite; ``os.link``: atomic create-if-absent). Readers never
    see a partial file; the temporary file is always removed.

    With ``sync=False`` (a hint, `Blob.put_hint`) nothing is synced: readers of the running
    system still see all of the file or none, but a crash may lose the name, keep the old
    file, or leave the name on an empty or torn file.

    Durability (what holds when this returns, on a filesystem that honours fsync): the
    file's bytes were synced *before* the name was published (a crash never leaves the name
    on a 0-byte or torn file), and the directory that holds the name, and every directory
    this call created up to an existing one, were synced after it, concurrently (the name
    survives a crash). A crash before the return may lose the name (the put was never
    acknowledged) or leave the ``.tmp-`` sibling, which gc removes.
    """
    directory = os.path.dirname(path)
    created = _make_dirs(directory)
    tmp = os.path.join(directory, temporary_name())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if SYNC_LOCAL and sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        published = False
        if publish is os.replace:
            # Most puts create a fresh key (parts, rollups): a hard link is atomic too, and on
            # ext4 several times cheaper than a rename (measured ~0.3 ms against ~1 ms, a
            # rename onto a name forces the data out); an existing key (or a filesystem
            # without hard links) falls back to replace.
            try:
                os.link(tmp, path)
                published = True
            except OSError:
                pass
        if not published:
            try:
                publish(tmp, path)
            except FileNotFoundError as e:
                if os.path.isdir(directory) and not os.path.lexists(tmp):
                    raise _TemporaryVanished(e.errno, e.strerror, tmp) from e
                raise
            except FileExistsError:
                # NFS: a link() the server applied whose reply was lost is retried by the
                # client, and the retry reports EEXIST for the name it just made. The name
                # on our temporary's inode is ours: created by this call.
                if publish is not os.link or not _same_file(tmp, path):
                    raise
                log.info("%s: link reported EEXIST but the name is this put's own file", path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass  # replaced onto the key
    if sync:
        _sync_dirs([directory, *created])


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name the same file (inode), False if either is gone."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _sync_dirs(directories: builtins.list[str]) -> None:
    """`_sync_dir` every one of ``directories``, concurrently (a filesystem with a journal
    commits concurrent syncs together: measured on ext4, two directories in ~3.5 ms against
    ~9 ms one after the other); returns when all are durable. One plain thread per extra
    directory, no pool: a pool made before a fork (Spark's workers) has no threads after it."""
    if len(directories) == 1:
        _sync_dir(directories[0])
        return
    failures: builtins.list[OSError] = []

    def sync(directory: str) -> None:
        try:
            _sync_dir(directory)
        except OSError as e:
            failures.append(e)

    threads = [threading.Thread(target=sync, args=(d,)) for d in directories[1:]]
    for t in threads:
        t.start()
    sync(directories[0])
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


@dataclass(frozen=True)
class BlobMeta:
    """A key and its size in bytes (and when it was written, where a listing says)."""

    key: str
    size: int
    modified_ms: int | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a blob store promises beyond the basic contract."""

    #: ``put_if_absent`` is atomic and exclusive (what `BlobConsensus` needs).
    atomic_create: bool
    #: Every process that opens the same location sees the same data (what Spark needs).
    shared: bool


class Blob(ABC):
    """A blob store (see the module docstring for the contract).

    ``url`` names the store (a shard's location). ``Blob(url, **storage_options)`` on the
    interface itself builds the default implementation, `FsspecBlob`.
    """

    url: str

    def __new__(cls, *args: Any, **kwargs: Any) -> Blob:
        if cls is Blob:
            cls = FsspecBlob
        return super().__new__(cls)

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What this store promises (atomic create, shared between processes)."""

    @property
    def supports_atomic_create(self) -> bool:
        """Whether `put_if_absent` is atomic and exclusive on this store."""
        return self.capabilities.atomic_create

    @property
    def protocol(self) -> str:
        """A short name of the kind of storage, for messages."""
        return type(self).__name__

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if there is no such key."""

    @abstractmethod
    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (a ranged get); fewer if the object is shorter.
        Raises ``FileNotFoundError`` if there is no such key."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size, or None if there is no such key."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically (readers see all of it or none)."""

    def put_hint(self, key: str, data: bytes) -> None:
        """Store a *hint* under ``key``: atomic for readers like `put`, but not made durable
        (local files: no fsync). A crash may lose it, keep an older one, or (local files)
        leave the key empty or torn, so only for objects every reader tolerates in any of
        those states (``consensus/HEAD``). By default a plain `put`."""
        self.put(key, data)

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists; True if this call created it.

        Atomic and exclusive where ``capabilities.atomic_create``; raises
        `StorageUnsupported` elsewhere. An ``OSError`` other than "exists" leaves the outcome
        unknown: the object may or may not have been created.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; succeeds when it is already gone."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[BlobMeta]:
        """Every key under ``prefix`` (a "directory" prefix ending in ``/`` or a key prefix),
        in key order, without temporary ``.tmp-`` objects."""

    def list_temporary(self) -> builtins.list[BlobMeta]:
        """Temporary objects (``.tmp-``) of puts in progress or of puts whose process died
        before cleaning up (with their write time where known); none by default."""
        return []

    def sibling(self, url: str) -> Blob:
        """The store of another shard at ``url`` on the same storage, opened with this
        store's options (a fork reads its source's parts from it, and reaches its source's
        log through it: `persistshard.core.fork`). The default opens `FsspecBlob`."""
        return FsspecBlob(url)

    def probe_key(self) -> Hashable | None:
        """What names the store behind this blob for the atomic-create probe
        (`persistshard.core.storage.consensus.check_atomic_create`): every blob with the same
        key honours a conditional create if one does, so a process probes each key once.
        None (the default): unknown, probed once per consensus object."""
        return None


class BlobWrapper(Blob):
    """A blob that forwards every call to ``inner``: subclass it and override what changes
    (fault injection, crash simulation, progress counting). Capabilities are the inner's.

    A wrapper that only observes (counts or times requests, changes no answer) sets
    ``observes_only``; `unobserved` looks through such wrappers, and only through them."""

    #: True for a wrapper whose every answer is its inner's (request counting).
    observes_only = False

    def __init__(self, inner: Blob) -> None:
        self.inner = inner
        self.url = inner.url

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    @property
    def protocol(self) -> str:
        return self.inner.protocol

    def get(self, key: str) -> bytes | None:
        return self.inner.get(key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self.inner.get_range(key, offset, length)

    def size(self, key: str) -> int | None:
        return self.inner.size(key)

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def put_hint(self, key: str, data: bytes) -> None:
        if type(self).put is not BlobWrapper.put:
            self.put(key, data)  # a wrapper that intercepts puts sees hints too (counts, cuts)
        else:
            self.inner.put_hint(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(key, data)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = "") -> list[BlobMeta]:
        return self.inner.list(prefix)

    def list_temporary(self) -> builtins.list[BlobMeta]:
        return self.inner.list_temporary()

    def sibling(self, url: str) -> Blob:
        """The inner's sibling, unwrapped: a wrapper that must see the sibling's requests
        too (crash cuts, counting) overrides this."""
        return self.inner.sibling(url)

    def probe_key(self) -> Hashable | None:
        """The inner's: a wrapper observes or fails calls but keeps their meaning (one that
        changes what a conditional create does must return its own key, or None)."""
        return self.inner.probe_key()


def unobserved(blob: Blob) -> Blob:
    """``blob`` without the wrappers that only observe it (`BlobWrapper.observes_only`), for
    requests that must not be counted as an operation's (the atomic-create probe). Wrappers
    that change answers (fault injection, crash cuts) stay."""
    while isinstance(blob, BlobWrapper) and blob.observes_only:
        blob = blob.inner
    return blob


class FsspecBlob(Blob):
    """A blob store rooted at ``url`` (any fsspec URL or local path), over an fsspec filesystem.

    Local files: ``put`` writes a temporary sibling, fsyncs it, and links (or renames) it into
    place; ``put_if_absent`` does the same with a hard link only (``link`` fails if the key
    exists), so a reader never sees a partial file and exactly one creator wins; both fsync the
    directory (and any directory they created) before returning. A process that dies between
    the steps leaves the ``.tmp-`` sibling behind (`list_temporary`).
    S3 (s3fs >= `MIN_S3FS`): ``put_if_absent`` is a PutObject with ``If-None-Match: *``; the
    server decides, atomically. Memory: exclusive create under fsspec's lock, one process only.
    Other filesystems: fsspec's generic create checks, then writes (not atomic), so
    ``put_if_absent`` raises `StorageUnsupported`.
    Listings and sizes are never answered from fsspec's listing cache, which would hide other
    processes' writes.
    """

    def __init__(self, url: str, **storage_options: Any) -> None:
        self._options = dict(storage_options)
        self._siblings: dict[str, Blob] = {}
        no_sync = storage_options.pop(NO_SYNC_OPTION, False)
        self._sync = not (no_sync is True or str(no_sync).lower() == "true")
        try:
            fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except ImportError as e:
            raise _missing_filesystem(url, e) from e
        self.fs = fs
        self.url = url
        self.root = root.rstrip("/") if root not in ("", "/") else root
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self._protocol = protocol
        self._local = isinstance(fs, LocalFileSystem)
        atomic = self._local or protocol in ATOMIC_CREATE_PROTOCOLS
        if protocol in ("s3", "s3a"):
            atomic = _s3fs_atomic()
        self._capabilities = Capabilities(
            atomic_create=atomic, shared=not isinstance(fs, MemoryFileSystem)
        )
        log.debug("blob %s: protocol %s, %s", root, protocol, self._capabilities)

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def protocol(self) -> str:
        return self._protocol

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, key) if self.root else key

    def sibling(self, url: str) -> Blob:
        """`Blob.sibling`: an `FsspecBlob` at ``url`` with this one's storage options (one per
        url and blob: parts are immutable, so a sibling never goes stale)."""
        found = self._siblings.get(url)
        if found is None:
            found = self._siblings[url] = FsspecBlob(url, **self._options)
        return found

    def local_file(self, key: str) -> str | None:
        """The file on this machine holding ``key`` when the blob is a local directory (a
        reader may then map it into memory, `persistshard.core.storage.parts.open_part`);
        None elsewhere. Wrappers do not forward it: what they wrap sees every read."""
        return self._path(key) if self._local else None

    def hadoop_url(self, key: str) -> str | None:
        """The URL through which Hadoop's file systems open ``key`` (`hadoop_url_of` of the
        store's URL; the JVM companion reads the part there when its session has a file
        system for that scheme), or None, as for a local directory (`local_file` names its
        files). Wrappers do not forward it, as `local_file`."""
        return None if self._local else hadoop_url_of(self.url, key)

    def get(self, key: str) -> bytes | None:
        try:
            if self._local:  # plain file reads: fsspec's layers cost more than a small read
                with open(self._path(key), "rb") as f:
                    return f.read()
            data: bytes = self.fs.cat_file(self._path(key))
            return data
        except FileNotFoundError:
            return None

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if self._local:
            with open(self._path(key), "rb") as f:
                f.seek(offset)
                return f.read(length)
        data: bytes = self.fs.cat_file(self._path(key), start=offset, end=offset + length)
        return data

    def size(self, key: str) -> int | None:
        try:
            return int(self.fs.info(self._path(key), refresh=True)["size"])
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if self._local:
            _publish_local(path, data, os.replace, sync=self._sync)
            return
        self.fs.pipe_file(path, data)

    def put_hint(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if self._local:
            _publish_local(path, data, os.replace, sync=False)
            return
        self.fs.pipe_file(path, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if self._local:
            try:
                _publish_local(path, data, os.link, sync=self._sync)  # fails if the key exists
                return True
            except FileExistsError:
                log.debug("put_if_absent %s: exists, not created", key)
                return False
        if not self.supports_atomic_create:
            extra = ""
            if self.protocol in ("s3", "s3a"):
                extra = f" (s3fs {'.'.join(map(str, MIN_S3FS))} or later has one)"
            raise StorageUnsupported(
                f"the {self.protocol!r} filesystem has no atomic put-if-absent{extra}, which "
                "the default consensus needs; pass a consensus that can compare-and-set "
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
        try:
            if self._local:
                # Not synced: a delete that a crash undoes leaves an object no state needs
                # (the shard deletes only such objects), which gc deletes again.
                os.unlink(self._path(key))
            else:
                self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def _find(self, prefix: str) -> list[tuple[str, int, int | None]]:
        """(key relative to the root, size, modified ms) of every object under ``prefix``."""
        base = self._path(prefix)
        directory = base if prefix.endswith("/") or not prefix else posixpath.dirname(base)
        if not self._local:
            self.fs.invalidate_cache(directory)
        parent, name = posixpath.split(directory.rstrip("/"))
        try:
            if self.protocol in ("s3", "s3a") and "/" in parent.strip("/") + "/" and name:
                # One ListObjectsV2 with the name as a prefix: a plain find of an empty
                # "directory" (the usual consensus/floor/) adds a HEAD and a second list.
                entries = self.fs.find(parent, prefix=name + "/", detail=True, withdirs=False)
            else:
                entries = self.fs.find(directory, detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        root = self.root.rstrip("/")
        out = []
        for path, info in entries.items():
            rel = path[len(root) :].lstrip("/") if root else path.lstrip("/")
            out.append((rel, int(info.get("size") or 0), _info_ms(info)))
        return out

    def probe_key(self) -> Hashable:
        """(protocol, endpoint, bucket): S3 and other object stores by their endpoint and
        bucket (the first path segment); local files by the file system (its device)."""
        if self._local:
            path = self.root or "/"
            while not os.path.exists(path) and os.path.dirname(path) != path:
                path = os.path.dirname(path)
            try:
                return ("file", "", os.stat(path).st_dev)
            except OSError:
                return ("file", "", path)
        options = getattr(self.fs, "storage_options", {}) or {}
        client = options.get("client_kwargs") or {}
        endpoint = client.get("endpoint_url") or options.get("endpoint_url") or ""
        return (self._protocol, str(endpoint), self.root.strip("/").split("/", 1)[0])

    def list(self, prefix: str = "") -> list[BlobMeta]:
        out = [
            BlobMeta(rel, size)
            for rel, size, _ in self._find(prefix)
            if rel.startswith(prefix) and not posixpath.basename(rel).startswith(TMP_PREFIX)
        ]
        out.sort(key=lambda m: m.key)
        return out

    def list_temporary(self) -> builtins.list[BlobMeta]:
        out = [
            BlobMeta(rel, size, modified)
            for rel, size, modified in self._find("")
            if posixpath.basename(rel).startswith(TMP_PREFIX)
        ]
        out.sort(key=lambda m: m.key)
        return out


#: Top-level names a shard writes under its location (anything else is someone else's file).
SHARD_PREFIXES = frozenset({"parts", "consensus", "rollups"})


def foreign_keys(blob: Blob, limit: int = 5) -> builtins.list[str]:
    """Up to ``limit`` keys under the blob's root that a shard would not have written (to
    refuse creating a shard in a directory that holds other files)."""
    out = []
    for meta in blob.list(""):
        if meta.key.split("/", 1)[0] not in SHARD_PREFIXES:
            out.append(meta.key)
            if len(out) >= limit:
                break
    return out


def open_blob(url: str, **storage_options: Any) -> Blob:
    """The default blob store for ``url``: `FsspecBlob` with ``storage_options`` (fsspec's:
    a shard's consensus and configuration travel apart from them,
    `persistshard.core.shard.ShardAddress`)."""
    return FsspecBlob(url, **storage_options)

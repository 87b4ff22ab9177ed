"""The errors persistshard raises, one class per thing the caller must do differently.

Invariants:
- Every message starts with the class name followed by a colon, because in Spark the Python
  class is lost on the way to the user and only the text survives.
- Every message names the shard (its location) when one is involved, and the values that
  disagree.
- An error is *determinate* (the operation certainly did not take effect) unless it is an
  `Indeterminate`, which says the operation may or may not have been applied; the caller must
  re-read the state before retrying.
- Some classes also subclass the built-in their case belongs to, so that code written
  against the built-ins catches them: `InvalidOption` and `InvalidUpdates` are `ValueError`,
  `NoShard` is a `LookupError`, `StorageError` is an `OSError`. An `OSError` met in a commit
  may have been applied; a `StorageError` certainly was not (unless its message says it may
  have landed), so every ``except OSError`` that reads "maybe applied" lets `StorageError`
  through first (`persistshard.core.statemachine.machine`).
- A feature whose package comes with an extra, used without it, is a `ModuleNotFoundError`
  (an `ImportError`) that names the feature and the extra to install (`import_extra`), not
  the bare one Python raises.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class PersistShardError(Exception):
    """Base class of every persistshard error; its message starts with the class name."""

    def __init__(self, message: str, *, location: str | None = None) -> None:
        self.location = location
        self.detail = message
        text = f"{type(self).__name__}: {message}"
        if location is not None:
            text += f" (shard {location})"
        super().__init__(text)


class UpperMismatch(PersistShardError):
    """`expected_upper` was not the shard's upper; nothing was written. Re-read and retry."""

    def __init__(
        self, expected: int, actual: int, *, location: str | None = None, message: str | None = None
    ) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            message or f"expected upper {expected}, shard upper is {actual}", location=location
        )


class SinceViolation(PersistShardError):
    """A read at a time before the shard's since; read at a later time."""

    def __init__(
        self, as_of: int, since: int, *, location: str | None = None, message: str | None = None
    ) -> None:
        self.as_of = as_of
        self.since = since
        super().__init__(
            message
            or f"as_of {as_of} is before the shard's since {since}; "
            f"history before {since} has been compacted, read at {since} or later",
            location=location,
        )


class NotSealed(PersistShardError):
    """A read at a time at or after the shard's upper; wait or seal first."""

    def __init__(
        self, as_of: int, upper: int, *, location: str | None = None, message: str | None = None
    ) -> None:
        self.as_of = as_of
        self.upper = upper
        super().__init__(
            message
            or f"as_of {as_of} is not sealed: the shard's upper is {upper}, so only times "
            f"below {upper} are final; read at {upper - 1} or earlier, or seal first",
            location=location,
        )


class InvalidUpdates(PersistShardError, ValueError):
    """Bad data: the updates (or rows, or a source frontier) have the wrong columns or types,
    a null or negative time, a zero or null diff, a time below the write's lower; nothing was
    written. Options and arguments are `InvalidOption`."""


class CorruptData(PersistShardError):
    """Stored bytes fail a checksum, magic number or length check; names the file and chunk.

    ``missing`` says the file is absent rather than damaged (a part the read's state names
    is not on storage). A read pinned to an older version tells a race with gc from damage
    by it (`persistshard.core.read.race`): the first becomes `VersionCollected`.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        chunk: int | None = None,
        location: str | None = None,
        missing: bool = False,
    ) -> None:
        self.file = file
        self.chunk = chunk
        self.missing = missing
        where = []
        if file is not None:
            where.append(f"file {file}")
        if chunk is not None:
            where.append(f"chunk {chunk}")
        text = f"{message} ({', '.join(where)})" if where else message
        super().__init__(text, location=location)


class NegativeDiff(PersistShardError):
    """A snapshot read without ``_diff`` met a row whose net diff is negative: it cannot be
    repeated a negative number of times. Read with ``with_diff`` to see it."""


class StorageUnsupported(PersistShardError):
    """The storage cannot give an atomic put-if-absent and no other consensus was configured."""


class Indeterminate(PersistShardError):
    """An operation may or may not have been applied (for example a timeout after a write).

    The caller must re-read the state before deciding whether to retry; the shard's own
    retry loops do this by recognising their own commit (by its id) in the log.
    """


class HoldExpired(PersistShardError):
    """A reader's hold on since is gone: its lease ran out (or it was expired), so the shard
    may already have compacted past it. Register the reader again and re-read from the
    shard's since."""

    def __init__(self, reader_id: str, *, location: str | None = None) -> None:
        self.reader_id = reader_id
        super().__init__(
            f"reader {reader_id!r} holds no since: its lease ran out or it was expired; "
            "register it again and read from the shard's since",
            location=location,
        )


class WriterAlreadyCommitted(PersistShardError):
    """A streaming writer's batch was already committed: its replay is a no-op (exactly once).

    Determinate: the replay wrote nothing new; the shard handles it (the parts the replay wrote
    are deleted) and users do not see it.
    """

    def __init__(self, writer_id: str, batch_id: int, *, location: str | None = None) -> None:
        self.writer_id = writer_id
        self.batch_id = batch_id
        super().__init__(
            f"writer {writer_id!r} already committed batch {batch_id}", location=location
        )


class StateConflict(PersistShardError):
    """A maintenance commit (compaction, gc) lost because its inputs are no longer current,
    or a compare-and-set of a durable consumer's position lost to another move.

    Determinate: nothing was applied; the outputs it wrote are deleted. ``expected`` and
    ``actual`` are the values a compare-and-set expected and found (a consumer's position;
    ``actual`` None: the consumer is gone), None for other conflicts.
    """

    def __init__(
        self,
        message: str,
        *,
        location: str | None = None,
        expected: int | None = None,
        actual: int | None = None,
    ) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(message, location=location)


class VersionCollected(StateConflict):
    """A read lost a race with gc: the state version it pinned was replaced (by a compaction,
    an overwrite) more than the retention window ago, and gc deleted a part only that version
    named. Nothing is wrong with the shard and nothing was returned: read again (a new read
    pins the newest version). Names the shard, the pinned and newest versions and the part.

    A `StateConflict` (its input is no longer current, run it again); a part that the newest
    version still names and storage lacks stays `CorruptData`.
    """

    def __init__(
        self, version: int, newest: int, part: str, *, location: str | None = None
    ) -> None:
        self.version = version
        self.newest = newest
        self.part = part
        super().__init__(
            f"the read pinned version {version}, which was replaced (the shard is at version "
            f"{newest}) longer ago than the retention window, and gc has deleted its part "
            f"{part}; the read lost a race with gc and returned nothing, the shard is intact: "
            "read again (a read pinned longer than gc's retention_seconds can meet this)",
            location=location,
        )


class NoShard(PersistShardError, LookupError):
    """The location holds no shard: no state was ever committed there. Check the path and the
    storage options, or write to the location first (a first write creates the shard)."""


class InvalidOption(PersistShardError, ValueError):
    """An option (Spark read/write option, table OPTIONS, CLI flag) or an argument of a call
    (a frontier bound, a lease, a location) is unknown, malformed or out of range, two of them
    contradict each other, or one contradicts the shard (another consensus, other key
    columns); nothing was read or written. The message names the option, the value given and
    what it accepts."""


class StorageError(PersistShardError, OSError):
    """The storage refused an operation: a read-only directory, a missing permission, missing
    or wrong credentials, an unreachable endpoint. Determinate unless the message says the
    operation may have landed: nothing was changed. The message names the location, what was
    being done, the storage's own reason and the fix; ``__cause__`` keeps the original error.
    """

    def __init__(
        self, message: str, *, location: str | None = None, cause: BaseException | None = None
    ) -> None:
        self.cause = cause
        super().__init__(message, location=location)


#: Exception class names (botocore, s3fs, gcsfs, adlfs) that mean "your credentials or
#: permissions", matched by name so that this module imports no storage library.
_CREDENTIAL_ERRORS = frozenset(
    {
        "NoCredentialsError",
        "PartialCredentialsError",
        "CredentialRetrievalError",
        "NoAuthTokenError",
        "ClientAuthenticationError",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "AccessDenied",
    }
)
#: Exception modules whose errors are storage errors (checked by prefix).
_STORAGE_MODULES = ("botocore", "aiobotocore", "s3fs", "gcsfs", "adlfs", "azure", "google")


def is_storage_error(error: BaseException) -> bool:
    """Whether ``error`` came from the storage (an OS error, or a storage library's own)."""
    if isinstance(error, PersistShardError):
        return False
    if isinstance(error, OSError):
        return True
    module = type(error).__module__ or ""
    return module.startswith(_STORAGE_MODULES) or type(error).__name__ in _CREDENTIAL_ERRORS


def storage_cause(error: BaseException) -> BaseException | None:
    """The storage error at the root of ``error`` (itself, or one it was raised from or while
    handling), if any: a refused write surfaces as `Indeterminate` from a commit, with the
    `PermissionError` as its cause."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_storage_error(current):
            return current
        current = current.__cause__ or current.__context__
    return None


def is_access_error(error: BaseException) -> bool:
    """Whether a storage error means "not allowed": no write permission, a read-only file
    system, missing or refused credentials (so retrying the same way cannot help). Our own
    errors (a `StorageError` included) are not the storage's: False."""
    import errno as errno_codes

    if isinstance(error, PersistShardError):
        return False

    if isinstance(error, PermissionError):
        return True
    if getattr(error, "errno", None) in (errno_codes.EACCES, errno_codes.EPERM, errno_codes.EROFS):
        return True
    text = str(error).lower()
    return type(error).__name__ in _CREDENTIAL_ERRORS or "access denied" in text


def storage_error(error: BaseException, location: str | None, doing: str) -> StorageError:
    """A `StorageError` for ``error`` (raised by the storage while ``doing`` something at
    ``location``): the storage's reason, then what to do about it. Secrets never appear: the
    message holds the error's class, its errno text and the file it names, nothing else of
    the caller's options."""
    import errno as errno_codes

    name = type(error).__name__
    code = getattr(error, "errno", None)
    reason = (getattr(error, "strerror", None) or str(error) or name).strip()
    filename = getattr(error, "filename", None)
    text = f"cannot {doing} at {location}: {name}: {reason}" + (
        f" ({filename})" if filename else ""
    )
    if code in (errno_codes.EACCES, errno_codes.EPERM, errno_codes.EROFS) or isinstance(
        error, PermissionError
    ):
        fix = (
            "the location is not writable by this user (a read-only directory or mount, or "
            "missing permissions): grant write access; reads need read access only, but "
            "writes, compaction, gc and the holds of streaming reads write to the shard"
        )
    elif name in _CREDENTIAL_ERRORS or "credential" in reason.lower():
        fix = (
            "the storage refused the credentials or found none: pass them as storage options "
            "(Spark: option storage.<name>; CLI: --storage-option NAME=VALUE) or through the "
            "storage's own configuration (environment variables, config files)"
        )
    elif code == errno_codes.ENOSPC:
        fix = "the device is full: free space and run it again"
    elif code in (errno_codes.ENOTDIR, errno_codes.EISDIR, errno_codes.EEXIST):
        fix = "the location (or a directory above it) is a file: name a directory"
    else:
        fix = "check that the storage is reachable and the location is right, then retry"
    out = StorageError(f"{text}; {fix}", cause=error)
    out.location = location  # named in the text already
    return out


class LeaseExpired(PersistShardError):
    """A write or compaction committed after its lease ran out
    (`persistshard.core.statemachine.leases`).

    Determinate: nothing was applied. gc may already have deleted the write's parts (it
    deletes the parts of writes whose lease ran out), so the write must be done again, from
    its input; the parts it wrote are deleted now or swept by a later gc.
    """

    def __init__(
        self, write_id: str, expired_ms: int, at_ms: int, *, location: str | None = None
    ) -> None:
        self.write_id = write_id
        self.expired_ms = expired_ms
        self.at_ms = at_ms
        super().__init__(
            f"the lease of write {write_id} ran out at {expired_ms} ms since the epoch, before "
            f"its commit at {at_ms}; gc may have deleted its parts, so nothing was applied: "
            "write again (a write that runs longer than the lease renews it, see "
            "persistshard.core.statemachine.leases)",
            location=location,
        )


class CommitDeadline(PersistShardError):
    """A commit kept losing compare-and-set races (or kept failing on storage that then read
    back fine) until its deadline passed. Determinate: nothing was applied."""


def import_extra(module: str, extra: str, what: str) -> ModuleType:
    """``module`` imported, or a `ModuleNotFoundError` (its ``name`` the module's) saying
    that ``what`` needs it and which extra of persistshard brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ModuleNotFoundError(
            f"{what} needs {module}, which is not installed: pip install 'persistshard[{extra}]'",
            name=module,
        ) from e


__all__ = [
    "CommitDeadline",
    "CorruptData",
    "HoldExpired",
    "Indeterminate",
    "InvalidOption",
    "InvalidUpdates",
    "LeaseExpired",
    "NegativeDiff",
    "NoShard",
    "NotSealed",
    "PersistShardError",
    "SinceViolation",
    "StateConflict",
    "StorageError",
    "StorageUnsupported",
    "UpperMismatch",
    "VersionCollected",
    "WriterAlreadyCommitted",
]

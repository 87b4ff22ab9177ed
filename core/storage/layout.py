"""Layout: where a shard keeps each kind of object, how ids are made, and the shared defaults.

Everything a shard stores lives under its location, in three prefixes, and nothing else does:

- ``parts/<write id>/<uuid>.part``: part files (`persistshard.format`), written once each. The
  write id (made by `new_id`) starts with its creation time, so gc can tell an orphan's age.
- ``rollups/v<version:020d>-<id>.json``: full copies of the state every `ROLLUP_EVERY` versions;
  ``rollups/gc/checkpoint.json``: what gc learnt of the log on its last run
  (`persistshard.core.maintenance.gc`; never trusted past what gc can verify).
- ``consensus/v<version:020d>.json`` and ``consensus/HEAD``: the log of state versions kept by
  `persistshard.core.storage.consensus.BlobConsensus` (another consensus may keep it elsewhere), and
  ``consensus/floor/f<version:020d>``: the truncation floor markers of that log.
- ``consensus/IDENTITY`` (`IDENTITY_KEY`): the shard's identity, created once (put-if-absent)
  before its first log entry and never rewritten: its id and where its log is
  (`persistshard.core.storage.consensus.mark_log_home`). ``consensus/ELSEWHERE``
  (`LEGACY_LOG_HOME_KEY`): what shards logged in a database before shard ids have instead.

Invariant relied on by gc: every key under ``parts/`` and ``rollups/`` embeds an id from
`new_id`, so its write time is known without reading it.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from typing import Any

from persistshard.errors import InvalidOption

PARTS_PREFIX = "parts/"
ROLLUPS_PREFIX = "rollups/"
CONSENSUS_PREFIX = "consensus/"
#: The shard's identity marker (see the module docstring); never rewritten once created.
IDENTITY_KEY = f"{CONSENSUS_PREFIX}IDENTITY"
#: The marker of a shard logged in a database before shard ids: the redacted consensus URL.
LEGACY_LOG_HOME_KEY = f"{CONSENSUS_PREFIX}ELSEWHERE"

#: A full copy of the state is written every this many versions.
ROLLUP_EVERY = 16

#: gc keeps superseded versions, and unreferenced objects, younger than this.
DEFAULT_RETENTION_SECONDS = 3600.0

#: How far gc's fences and cutoffs may lie ahead of the shard's newest recorded commit time
#: (`persistshard.core.maintenance.gc`): a gc whose clock runs ahead judges leases and the
#: retention window as if it were at most this much after the newest commit, so its fence
#: never refuses writes of processes whose clocks are right.
CLOCK_LEAD_MS = 60_000

_ROLLUP_KEY = re.compile(r"^rollups/v(\d{20})-([0-9a-f]+)\.json$")


#: URL schemes that fsspec maps to one filesystem, and the one spelling a location takes.
_SCHEME_SPELLINGS = {"s3a": "s3", "gcs": "gs"}


def canonical_location(location: str) -> str:
    """The canonical location of ``location``: every spelling of one place gives one string,
    the shard's name in logs, caches and legacy database keys.

    - A local path (plain, ``file:/p``, ``file:///p``, ``file://localhost/p``, any case of
      ``file``) becomes ``file://`` plus its real path: absolute, ``~`` expanded, symbolic
      links resolved (`os.path.realpath`), no ``.``/``..``, no doubled or trailing slash.
    - A URL keeps its host as given and takes one spelling of the rest: the scheme in lower
      case (``s3a``/``gcs`` as ``s3``/``gs``), no doubled slash in the path, no trailing
      slash. A chained URL (``a::b``) is canonical in each link.
    """
    if "::" in location:
        return "::".join(canonical_location(link) for link in location.split("::"))
    if location[:5].lower() == "file:":
        path = location[5:]
        if path.startswith("//"):
            host, sep, rest = path[2:].partition("/")
            if host not in ("", "localhost"):
                raise InvalidOption(
                    f"location {location!r} names the host {host!r}: a file URL names a local "
                    "path (file:///path)",
                    location=location,
                )
            path = sep + rest
        return "file://" + os.path.realpath(os.path.expanduser(path or "/"))
    scheme, sep, rest = location.partition("://")
    if not sep:
        return "file://" + os.path.realpath(os.path.expanduser(location))
    scheme = scheme.lower()
    scheme = _SCHEME_SPELLINGS.get(scheme, scheme)
    host, slash, path = rest.partition("/")
    path = "/".join(p for p in path.split("/") if p)
    return f"{scheme}://{host}{slash if path else ''}{path}"


def now_ms() -> int:
    """This process's wall clock (ms since the epoch): the default clock of a shard's
    configuration (`persistshard.core.config.system_clock`), and the time of ids made
    without a shard."""
    return int(time.time() * 1000)


def new_id(at_ms: int | None = None) -> str:
    """A fresh unique id (for writes, commits and batches): 32 hex digits, the first 12 the
    time ``at_ms`` (default: this process's clock; a shard's ids carry its clock's time, see
    `persistshard.core.statemachine.machine.StateMachine.new_id` and ``new_write_id``), so
    ids sort by creation time and gc can tell an id's age."""
    return f"{now_ms() if at_ms is None else at_ms:012x}{uuid.uuid4().hex[:20]}"


#: How far a write id's time may be raised past this process's clock to the shard's time
#: (`persistshard.core.statemachine.machine.StateMachine.new_write_id`): a clock behind by
#: more than this still mints write ids whose leases gc's fence may already refuse.
MAX_ID_LEAD_MS = 24 * 3600 * 1000


def id_time_ms(identifier: str) -> int | None:
    """The creation time (ms since the epoch) of an id made by `new_id`, else None."""
    try:
        return int(identifier[:12], 16)
    except ValueError:
        return None


def part_key(write_id: str) -> str:
    """A fresh key for a part of the write ``write_id`` (its prefix lets failed writes be swept)."""
    return f"{PARTS_PREFIX}{write_id}/{uuid.uuid4().hex}.part"


def part_write_time_ms(key: str) -> int | None:
    """The creation time of the write a part key belongs to, else None."""
    write_id, sep, _ = key[len(PARTS_PREFIX) :].partition("/")
    return id_time_ms(write_id) if key.startswith(PARTS_PREFIX) and sep and write_id else None


def rollup_key(version: int, at_ms: int | None = None) -> str:
    """A fresh key for the rollup of state ``version``, written at ``at_ms`` (`new_id`)."""
    return f"{ROLLUPS_PREFIX}v{version:020d}-{new_id(at_ms)}.json"


def rollup_write_time_ms(key: str) -> int | None:
    """The creation time of a rollup key made by `rollup_key`, else None."""
    m = _ROLLUP_KEY.match(key)
    return id_time_ms(m.group(2)) if m else None


def rollup_version_of(key: str) -> int | None:
    """The state version a rollup key made by `rollup_key` holds, else None."""
    m = _ROLLUP_KEY.match(key)
    return int(m.group(1)) if m else None


def release_unused_memory() -> None:
    """Hand memory that Arrow's allocator keeps cached back to the operating system.

    Spark reuses a Python worker for task after task; without this, a worker's resident size
    after a memory-heavy task (staging an overwrite, a diff) stays at that task's peak and
    the next task's peak comes on top of it. Costs a few milliseconds.
    """
    import ctypes
    import ctypes.util

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name) if name else False
    if _libc and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)  # glibc: numpy arrays and Python bytes live in malloc's heap


_libc: Any = None

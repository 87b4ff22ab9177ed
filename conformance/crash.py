"""Crash consistency: cut an operation at every store step, reopen, check nothing acknowledged
was lost and the shard still reads and verifies.

Two ways to cut, one check (`check_image`):

- `PageCacheRecorder` (local files): the real `persistshard.core.storage.blob.FsspecBlob` code runs
  on a real directory while every os-level call of `persistshard.core.storage.blob` (``open``,
  ``write``, ``fsync``, ``close``, ``link``, ``replace``, ``unlink``, ``mkdir``) is also
  replayed into a model of the page cache: file bytes are durable only once their descriptor
  was fsynced, a directory entry (created, linked, renamed or removed) only once its
  directory was fsynced. `PageCacheRecorder.image` builds what a power cut after any step
  leaves on disk, in three flavours (`CUT_MODES`): ``lost`` (every unsynced entry and byte is
  gone), ``empty`` (every name reached the disk but unsynced files are 0 bytes, the ext4
  delayed-allocation outcome) and ``mixed`` (each directory, by a seeded coin, keeps its
  unsynced names or loses them; unsynced files torn to half). Intercepting the os calls, rather
  than modelling a store at the `Blob` interface, is what makes the harness test the code
  that runs in production: a put that forgets a sync, or syncs in the wrong order, loses data
  in the model exactly as it would on a machine.
- `CutBlob` (any store, such as S3, where a successful call is durable): the operation's
  process dies before its k-th store call (a `Cut` is raised, which no code catches); what the
  store holds then is the image. This checks the *order* of writes on every store: parts
  before the state that names them, the state before the hints, deletes only after the state
  that drops them.

A third driver, `check_lost_responses` (any store), loses a response instead: at each store
call k in turn, `LoseBlob` applies the call and then reports failure (``lost``: the caller gets
``TimeoutError``) or, for a conditional create, "exists" (``exists``: what the client
library's own retry of a create whose first answer was lost reports); then the process goes
on (the library resolves what it can, an operation that still fails ends the run) or dies at
its next store call, or at the one after (`ENDINGS`). Its image is checked the same way.

`check_image` opens the image as a shard and checks: every commit acknowledged before the cut
is there (the version, and the contents at its upper, which must equal the contents recorded
when the operation returned), the state is one that some operation produced (old or new,
never a mix), ``verify`` passes, and the shard accepts a new append.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pyarrow as pa

from persistshard.core.config import ShardConfig
from persistshard.core.remap import open_remap
from persistshard.core.shard import Shard, open_shard, write_transaction
from persistshard.core.storage import blob as blob_module
from persistshard.core.storage import layout
from persistshard.core.storage.blob import Blob, BlobMeta, BlobWrapper, open_blob

log = logging.getLogger("persistshard.conformance.crash")

#: The crash flavours of `PageCacheRecorder.image` (module docstring).
CUT_MODES = ("lost", "empty", "mixed")

_DIR = -1  # a directory entry that names a directory, not a file inode


class _Model:
    """The page cache and the disk under it, rebuilt by replaying recorded os calls."""

    def __init__(self, root: str, files: dict[str, bytes], dirs: list[str]) -> None:
        self.root = root
        self.content: dict[int, bytes] = {}
        self.synced: dict[int, bytes | None] = {}
        self.entries: dict[str, dict[str, int]] = {}  # dir -> name -> inode or _DIR
        self.durable: dict[str, dict[str, int]] = {}
        self.fds: dict[int, tuple[str, int | None]] = {}  # fd -> (path, inode; None for a dir)
        self._next = 0
        for d in dirs:
            self.entries.setdefault(d, {})
            if d != root:
                self.entries.setdefault(os.path.dirname(d), {})[os.path.basename(d)] = _DIR
        for path, data in files.items():
            inode = self._inode(data)
            self.synced[inode] = data
            self.entries.setdefault(os.path.dirname(path), {})[os.path.basename(path)] = inode
        self.durable = {d: dict(e) for d, e in self.entries.items()}

    def _inode(self, data: bytes = b"") -> int:
        self._next += 1
        self.content[self._next] = data
        self.synced[self._next] = None
        return self._next

    def _lookup(self, path: str) -> int:
        return self.entries[os.path.dirname(path)][os.path.basename(path)]

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "open":
            _, fd, path, created, is_dir = op
            if is_dir:
                self.fds[fd] = (path, None)
                return
            if created:
                inode = self._inode()
                self.entries.setdefault(os.path.dirname(path), {})[os.path.basename(path)] = inode
            else:
                inode = self._lookup(path)
            self.fds[fd] = (path, inode)
        elif kind == "write":
            _, fd, data = op
            written = self.fds[fd][1]
            assert written is not None
            self.content[written] += data
        elif kind == "fsync":
            path, synced = self.fds[op[1]]
            if synced is None:
                self.durable[path] = dict(self.entries.get(path, {}))
            else:
                self.synced[synced] = self.content[synced]
        elif kind == "close":
            self.fds.pop(op[1], None)
        elif kind in ("link", "replace"):
            _, src, dst = op
            inode = self._lookup(src)
            self.entries.setdefault(os.path.dirname(dst), {})[os.path.basename(dst)] = inode
            if kind == "replace":
                del self.entries[os.path.dirname(src)][os.path.basename(src)]
        elif kind == "unlink":
            self.entries[os.path.dirname(op[1])].pop(os.path.basename(op[1]), None)
        elif kind == "mkdir":
            self.entries.setdefault(op[1], {})
            self.entries.setdefault(os.path.dirname(op[1]), {})[os.path.basename(op[1])] = _DIR

    def disk(self, mode: str, seed: int) -> dict[str, bytes]:
        """``{path: bytes}`` of every file a power cut now leaves (see `CUT_MODES`)."""
        rng = random.Random(seed)
        out: dict[str, bytes] = {}

        def walk(d: str) -> None:
            if mode == "lost":
                names = self.durable.get(d, {})
            elif mode == "empty":
                names = self.entries.get(d, {})
            else:
                keep = rng.random() < 0.5
                names = self.entries.get(d, {}) if keep else self.durable.get(d, {})
            for name, inode in sorted(names.items()):
                path = os.path.join(d, name)
                if inode == _DIR:
                    walk(path)
                    continue
                data = self.synced[inode]
                if data is None:
                    unsynced = self.content[inode]
                    data = b"" if mode != "mixed" else unsynced[: len(unsynced) // 2]
                out[path] = data

        walk(self.root)
        return out


class _RecordingOs(types.SimpleNamespace):
    """Stands in for the ``os`` module inside `persistshard.core.storage.blob`: every call goes to
    the real ``os``; the ones that change files are also appended to ``journal``."""

    def __init__(self, journal: list[tuple[Any, ...]]) -> None:
        super().__init__()
        self._journal = journal

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        existed = os.path.exists(path)
        fd = os.open(path, flags, mode)
        is_dir = os.path.isdir(path)
        self._journal.append(("open", fd, os.path.abspath(path), not existed, is_dir))
        return fd

    def write(self, fd: int, data: Any) -> int:
        n = os.write(fd, data)
        self._journal.append(("write", fd, bytes(data[:n])))
        return n

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        self._journal.append(("fsync", fd))

    def close(self, fd: int) -> None:
        # Journaled before the call: once closed, the number may be reused by another thread's
        # open (the directory syncs of a put run in threads), whose journal entry must follow.
        self._journal.append(("close", fd))
        os.close(fd)

    def link(self, src: str, dst: str) -> None:
        os.link(src, dst)
        self._journal.append(("link", os.path.abspath(src), os.path.abspath(dst)))

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)
        self._journal.append(("replace", os.path.abspath(src), os.path.abspath(dst)))

    def unlink(self, path: str) -> None:
        os.unlink(path)
        self._journal.append(("unlink", os.path.abspath(path)))

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        os.mkdir(path, mode)
        self._journal.append(("mkdir", os.path.abspath(path)))


@dataclass
class Acknowledged:
    """What an operation had made durable when it returned: the journal length then, the
    state version, the upper, the contents at ``upper - 1`` (sorted rows) and the durable
    consumers' positions."""

    step: int
    version: int
    upper: int
    rows: list[tuple[Any, ...]]
    consumers: dict[str, int] = field(default_factory=dict)

    def seen(self) -> tuple[Any, ...]:
        """What an image must match exactly to be this state (the version aside)."""
        return (self.upper, tuple(self.rows), tuple(sorted(self.consumers.items())))


def contents(shard: Any) -> tuple[int, int, list[tuple[Any, ...]]]:
    """(version, upper, sorted rows with diffs at ``upper - 1``) of a shard now."""
    state = shard.inspect.state()
    if state.upper == 0:
        return state.version, 0, []
    table = shard.snapshot(state.upper - 1)
    return state.version, state.upper, sorted(tuple(r.values()) for r in table.to_pylist())


@dataclass
class CrashRun:
    """The record of one run: the journal (`PageCacheRecorder`) or the store-call count
    (`CutBlob`), and what each operation acknowledged, in order."""

    steps: int = 0
    acknowledged: list[Acknowledged] = field(default_factory=list)

    def ack(self, shard: Any, step: int) -> None:
        version, upper, rows = contents(shard)
        consumers = {n: c.position for n, c in shard.inspect.state().consumers.items()}
        self.acknowledged.append(Acknowledged(step, version, upper, rows, consumers))


class PageCacheRecorder:
    """Records the os calls of local puts and deletes under ``root`` (see the module
    docstring); `image` writes what a power cut after any step leaves.

    The tree under ``root`` when recording starts is taken as durable (set it up first, then
    record). Only `persistshard.core.storage.blob`'s calls are seen: reads need no model.
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.journal: list[tuple[Any, ...]] = []
        self._files: dict[str, bytes] = {}
        self._dirs: list[str] = []

    @contextmanager
    def recording(self) -> Iterator[PageCacheRecorder]:
        os.makedirs(self.root, exist_ok=True)
        for d, _, names in os.walk(self.root):
            self._dirs.append(d)
            for name in names:
                with open(os.path.join(d, name), "rb") as f:
                    self._files[os.path.join(d, name)] = f.read()
        saved = getattr(blob_module, "os")  # noqa: B009 - the module's import, not an export
        setattr(blob_module, "os", _RecordingOs(self.journal))  # noqa: B010
        try:
            yield self
        finally:
            setattr(blob_module, "os", saved)  # noqa: B010

    @property
    def steps(self) -> int:
        return len(self.journal)

    def disk(self, step: int, mode: str) -> dict[str, bytes]:
        """``{path relative to root: bytes}``: what is on disk after a power cut following
        the first ``step`` recorded calls, in flavour ``mode`` (`CUT_MODES`)."""
        model = _Model(self.root, self._files, self._dirs)
        for op in self.journal[:step]:
            model.apply(op)
        return {
            os.path.relpath(path, self.root): data
            for path, data in model.disk(mode, seed=step).items()
        }

    def image(self, step: int, mode: str, target: str) -> None:
        """Write `disk` into ``target`` (emptied first), which stands for ``root``."""
        write_image(self.disk(step, mode), target)


def write_image(files: dict[str, bytes], target: str) -> None:
    """Write ``{relative path: bytes}`` under ``target`` (emptied first)."""
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    for rel, data in files.items():
        dest = os.path.join(target, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(data)


class Cut(BaseException):
    """The process "died" at a store call (a BaseException: no retry loop catches it)."""


class _Sibling(BlobWrapper):
    """Another shard's store reached through a counting wrapper (`Blob.sibling`: a fork's
    destination, its source, a source's source): its mutating calls are counted, cut and
    lost by the wrapper it came from, as one process's calls are."""

    def __init__(self, parent: CutBlob | LoseBlob, inner: Blob) -> None:
        super().__init__(inner)
        self.parent = parent

    def put(self, key: str, data: bytes) -> None:
        self.parent.mutate("put", self.inner.put, key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created: bool = self.parent.mutate("put_if_absent", self.inner.put_if_absent, key, data)
        return created

    def delete(self, key: str) -> None:
        self.parent.mutate("delete", self.inner.delete, key)

    def sibling(self, url: str) -> Blob:
        return self.parent.sibling(url)


class CutBlob(BlobWrapper):
    """A blob that counts its mutating calls (put, put-if-absent, delete) and raises `Cut`
    instead of making call number ``cut_at`` (0-based; None: never)."""

    def __init__(self, inner: Blob, cut_at: int | None = None) -> None:
        super().__init__(inner)
        self.cut_at = cut_at
        self.calls = 0

    def _step(self) -> None:
        if self.cut_at is not None and self.calls >= self.cut_at:
            raise Cut(f"cut before store call {self.calls}")
        self.calls += 1

    def mutate(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One mutating call of a sibling store (`_Sibling`), counted and cut as this one's."""
        self._step()
        return fn(*args)

    def sibling(self, url: str) -> Blob:
        return _Sibling(self, self.inner.sibling(url))

    def put(self, key: str, data: bytes) -> None:
        self._step()
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._step()
        return self.inner.put_if_absent(key, data)

    def delete(self, key: str) -> None:
        self._step()
        self.inner.delete(key)

    def list(self, prefix: str = "") -> list[BlobMeta]:
        return self.inner.list(prefix)


class LoseBlob(BlobWrapper):
    """A blob that counts its mutating calls (put, put-if-absent, delete, as `CutBlob`) and
    loses the response to call number ``lose_at`` (0-based; None: never) after applying it:
    ``mode`` ``"lost"`` raises ``TimeoutError``, ``"exists"`` (a put-if-absent only) answers
    False. With ``die_after`` n, the process dies (`Cut`) before the n-th mutating call after
    the lost one (0: the very next); None: it goes on. ``kinds`` records each call's name."""

    def __init__(
        self,
        inner: Blob,
        lose_at: int | None = None,
        mode: str = "lost",
        die_after: int | None = None,
    ) -> None:
        super().__init__(inner)
        if mode not in LOSS_MODES:
            raise ValueError(f"unknown loss mode {mode!r} (one of {LOSS_MODES})")
        self.lose_at, self.mode, self.die_after = lose_at, mode, die_after
        self.calls = 0
        self.kinds: list[str] = []
        self.lost = False
        self._die_at: int | None = None

    def _call(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self._die_at is not None and self.calls >= self._die_at:
            raise Cut(f"died before store call {self.calls}, after a lost response")
        index = self.calls
        self.calls += 1
        self.kinds.append(kind)
        result = fn(*args)
        if index != self.lose_at:
            return result
        self.lost = True
        if self.die_after is not None:
            self._die_at = self.calls + self.die_after
        if self.mode == "exists" and kind == "put_if_absent":
            log.debug("store call %d (%s) applied, answered exists", index, kind)
            return False
        log.debug("store call %d (%s) applied, its response lost", index, kind)
        raise TimeoutError(f"injected: the response to store call {index} ({kind}) was lost")

    def mutate(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One mutating call of a sibling store (`_Sibling`), counted and lost as this one's."""
        return self._call(kind, fn, *args)

    def sibling(self, url: str) -> Blob:
        return _Sibling(self, self.inner.sibling(url))

    def put(self, key: str, data: bytes) -> None:
        self._call("put", self.inner.put, key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created: bool = self._call("put_if_absent", self.inner.put_if_absent, key, data)
        return created

    def delete(self, key: str) -> None:
        self._call("delete", self.inner.delete, key)


#: `LoseBlob` modes: the caller is told the call failed, or (a conditional create) "exists".
LOSS_MODES = ("lost", "exists")
#: After the lost response: the process goes on (None), or dies before its next store call
#: (0) or the one after (1).
ENDINGS: tuple[int | None, ...] = (None, 0, 1)


def check_image(open_image: Callable[[], Any], run: CrashRun, step: int, label: str) -> None:
    """Open the image left by a cut after ``step`` steps and check it (module docstring).
    Raises ``AssertionError`` naming ``label`` (operation, step, mode) on the first problem."""
    shard = open_image()
    version, upper, rows = contents(shard)
    acked = [a for a in run.acknowledged if a.step <= step]
    where = f"{label}, cut after step {step} of {run.steps}"
    log.debug("%s: image at version %d, upper %d", where, version, upper)
    if acked:
        last = acked[-1]
        assert version >= last.version, (
            f"{where}: acknowledged version {last.version} lost (image is at {version})"
        )
        assert upper >= last.upper, f"{where}: acknowledged upper {last.upper} lost ({upper})"
        if last.upper:
            table = shard.snapshot(last.upper - 1)
            got = sorted(tuple(r.values()) for r in table.to_pylist())
            assert got == last.rows, f"{where}: contents at {last.upper - 1} differ"
    consumers = {n: c.position for n, c in shard.inspect.state().consumers.items()}
    # Old or new, never a mix: the state (consumers included) is the one some operation
    # acknowledged at or after the last acknowledgement before the cut (a later one: the
    # operation cut after its commit landed), or, before any, one of the run's.
    since = [a for a in run.acknowledged if not acked or a.step >= acked[-1].step]
    known = {a.seen() for a in since}
    if not acked:
        known.add((0, (), ()))
    image = Acknowledged(step, version, upper, rows, consumers).seen()
    assert image in known, (
        f"{where}: the image's state (upper {upper}, consumers {consumers}) is none an "
        "operation produced"
    )
    if version:  # an image from before the first commit holds no shard: nothing to verify
        report = shard.inspect.verify()
        assert report.ok, f"{where}: verify found {report.problems}"
    shard.seal(upper + 1)
    assert shard.upper == upper + 1, f"{where}: the shard does not take a new commit"


# --- the operations, and the two drivers -------------------------------------------------------


def _rows(ids: list[int], value: str = "v") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{value}{i}" for i in ids]})


def _appends(shard: Shard, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        shard.append(_rows([i]))


def _reconfigured(shard: Shard, **knobs: int) -> Shard:
    """``shard`` opened again with ``knobs`` over its configuration, on the same blob store
    (a crash scenario's cutting wrapper included) and consensus."""
    address = shard.address
    return replace(address, config=address.config.replace(**knobs)).open(blob=shard._blob)


def _inline(shard: Shard) -> Shard:
    """``shard`` with inline small writes on at the production defaults (whatever the caller's
    defaults are): its 1-row appends carry their rows in the log entry, no part file."""
    defaults = ShardConfig()
    return _reconfigured(shard, inline_bytes=defaults.inline_bytes, inline_cap=defaults.inline_cap)


def _inline_appends(shard: Shard, n: int, start: int = 0) -> None:
    _appends(_inline(shard), n, start)


def _overwrite(shard: Shard, ids: list[int]) -> None:
    """What the Spark overwrite does on the driver and in its tasks, in one process."""
    state = shard.inspect.state()
    write_id = layout.new_id()
    table = _rows(ids, "w").append_column("_time", pa.array([state.upper] * len(ids), pa.int64()))
    table = table.append_column("_diff", pa.array([1] * len(ids), pa.int64()))
    staged = write_transaction(shard, f"{write_id}s").write_updates(
        table, lower=state.upper, new_upper=state.upper + 1, schema=state.schema
    )
    delta = write_transaction(shard).self_correct(
        staged, time=state.upper, write_id=write_id, state=state
    )
    write_transaction(shard).commit(
        delta,
        expected_upper=state.upper,
        new_upper=state.upper + 1,
        schema=state.schema,
        commit_id=write_id,
        label="overwrite",
    )


def _reclock(shard: Shard, remap_location: str, offset: int) -> None:
    """Mint a binding on the remap shard, then append records at their reclocked times."""
    remap = open_remap(remap_location)
    into = remap.mint({"p:0": offset + 2})
    times = remap.reclock(pa.array(["p:0", "p:0"]), pa.array([offset, offset + 1], pa.int64()))
    table = _rows([offset, offset + 1]).append_column("_time", times)
    table = table.append_column("_diff", pa.array([1, 1], pa.int64()))
    upper = shard.upper
    shard.compare_and_append(table, upper, max(into, upper) + 1)


#: The operations cut, by name: (setup, operations). ``check_process_cuts`` skips "reclock"
#: (its remap shard lives next to the location, outside a fresh sub-location).
# (setup, operations): the setup is taken as durable; each operation is acknowledged when it
# returns. Setups of 14 versions make the recorded commits cross the rollup at version 16.
Step = Callable[[Shard, str], object]
Scenario = tuple[Step, list[Step]]


def _stored(shard: Shard) -> Shard:
    """``shard`` writing every part as a file whatever the process's inline default: the
    inputs a compaction then replaces are files gc has to delete."""
    return _reconfigured(shard, inline_bytes=0)


def _appends_then_compact(n: int) -> Step:
    def setup(shard: Shard, remap: str) -> None:
        _appends(_stored(shard), n)
        shard.maintenance.compact()

    return setup


def _retained_appends(n: int) -> Step:
    def setup(shard: Shard, remap: str) -> None:
        shard.set_retention(versions=2)
        _appends(shard, n)

    return setup


def _maintained_append(shard: Shard, remap: str) -> None:
    """An append whose after-commit maintenance does everything it can: the commit moves
    since (retention), a Spine merge is due, and gc (floor 0) deletes what the merge replaced."""
    shard.maintenance.auto.gc_retention_seconds = 0
    shard.append(_rows([100]))


def _gc_everything(shard: Shard, remap: str) -> None:
    """gc with retention 0: every superseded version and object goes (gc judges time by its
    clock, at most a small lead past the newest commit, so no later clock is needed)."""
    shard.maintenance.gc(dry_run=False, retention_seconds=0)


def _consumer_setup(shard: Shard, remap: str) -> None:
    """14 versions (so the recorded commits cross the rollup at 16): appends, consumer ``etl``
    created at since 0 and moved to 5."""
    _appends(shard, 12)
    shard.consumer("etl").advance(5, expected=0)


def _advance_consumer(name: str, expected: int, to: int) -> Step:
    def step(shard: Shard, remap: str) -> None:
        shard.consumer(name).advance(to, expected=expected)

    return step


def _fork_beside(shard: Shard, remap: str) -> None:
    """A fork of the shard beside it (where `check_fork` looks), at its upper - 1."""
    shard.fork(fork_location(remap))


def fork_location(remap: str) -> str:
    """Where the ``fork`` scenario puts its fork: beside the scenario's remap location."""
    return f"{remap}-fork"


SCENARIOS: dict[str, Scenario] = {
    "append": (
        lambda s, r: _appends(s, 14),
        [lambda s, r: s.append(_rows([100])), lambda s, r: s.append(_rows([101]))],
    ),
    # Inline appends: the rows travel in the log entry (no part file); the recorded ones
    # cross the rollup at version 16, which carries the inline bytes.
    "append-inline": (
        lambda s, r: _inline_appends(s, 14),
        [
            lambda s, r: _inline(s).append(_rows([100])),
            lambda s, r: _inline(s).append(_rows([101])),
        ],
    ),
    # Compaction of inline batches: it moves their rows into a part file.
    "compaction-inline": (
        lambda s, r: _inline_appends(s, 6),
        [lambda s, r: s.maintenance.compact()],
    ),
    # an append with auto-maintenance: since moves, a level merge runs, gc deletes
    "append-maintained": (
        _retained_appends(7),
        [_maintained_append],
    ),
    "compaction": (
        lambda s, r: _appends(s, 14),
        [lambda s, r: s.maintenance.compact()],
    ),
    "overwrite": (
        lambda s, r: _appends(s, 6),
        [lambda s, r: _overwrite(s, [2, 3, 50])],
    ),
    "upsert": (
        lambda s, r: _appends(s, 6),
        [lambda s, r: s.upsert(_rows([1, 60], "u"), "id")],
    ),
    "reclock": (
        lambda s, r: _reclock(s, r, 0),
        [lambda s, r: _reclock(s, r, 10)],
    ),
    "gc": (
        _appends_then_compact(17),
        [_gc_everything],
    ),
    # gc without a rollup to truncate to: deletes the parts compaction replaced (a short
    # setup, for the conformance suite on slow stores)
    "gc-short": (
        _appends_then_compact(3),
        [_gc_everything],
    ),
    # durable consumers: a compare-and-set advance, since held at position - 1, a creation
    # at the since, a drop (each one commit)
    "consumer": (
        _consumer_setup,
        [
            _advance_consumer("etl", 5, 9),
            lambda s, r: s.advance_since(11),
            lambda s, r: s.consumer("audit"),
            lambda s, r: s.consumer("etl").drop(),
            _advance_consumer("audit", 8, 12),
        ],
    ),
    # A fork beside the shard (its pin at the shard, then its first entry), then the shard
    # compacts and gc's at retention 0: every image's fork, if there is one, still has every
    # part it names (`check_fork`).
    "fork": (
        _appends_then_compact(3),
        [
            _fork_beside,
            lambda s, r: _stored(s).append(_rows([100])),
            lambda s, r: s.maintenance.compact(),
            _gc_everything,
        ],
    ),
}


def check_fork(open_fork: Callable[[], Any], label: str) -> None:
    """The fork an image holds, if any (the ``fork`` scenario): complete (it verifies: every
    part it names is there, its source's included, whatever the source's gc deleted) and
    readable. An image without one (the cut came before its first entry) passes. Checked by
    the drivers that cut in place (process cuts, lost responses); a page-cache image is a copy
    elsewhere, while a fork names its source by location, so there only the source is checked."""
    fork = open_fork()
    state = fork.inspect.state()
    if state.version == 0 or state.dropped:
        return
    report = fork.inspect.verify()
    assert report.ok, f"{label}: the fork lost parts it names: {report.problems}"
    fork.snapshot()


def _digest(files: dict[str, bytes], acked: int) -> str:
    """Identifies an image and how many acknowledgements it is checked against."""
    h = hashlib.sha256(str(acked).encode())
    for rel, data in sorted(files.items()):
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def check_page_cache(root: str, name: str) -> int:
    """Run scenario ``name`` on local files under ``root`` (a new directory) with the
    page-cache model recording, then check the image of a power cut after every step in
    every flavour (identical images once). Returns how many distinct images were checked."""
    setup, operations = SCENARIOS[name]
    shard_at, remap_at = os.path.join(root, "s"), os.path.join(root, "remap")
    setup(open_shard(shard_at), remap_at)
    recorder = PageCacheRecorder(root)
    run = CrashRun()
    with recorder.recording():
        shard = open_shard(shard_at)
        run.ack(shard, 0)
        for op in operations:
            op(shard, remap_at)
            run.ack(shard, recorder.steps)
    run.steps = recorder.steps
    image = root.rstrip("/") + "-image"
    seen: set[str] = set()
    saved = blob_module.SYNC_LOCAL
    blob_module.SYNC_LOCAL = False  # the images are thrown away: checking them need not sync
    try:
        for step in range(run.steps + 1):
            acked = sum(a.step <= step for a in run.acknowledged)
            for mode in CUT_MODES:
                files = recorder.disk(step, mode)
                key = _digest(files, acked)
                if key in seen:
                    continue
                seen.add(key)
                write_image(files, image)
                label = f"{name} ({mode})"
                check_image(lambda: open_shard(os.path.join(image, "s")), run, step, label)
                if os.path.isdir(os.path.join(image, "remap")):
                    open_remap(os.path.join(image, "remap")).bindings()
    finally:
        blob_module.SYNC_LOCAL = saved
        shutil.rmtree(image, ignore_errors=True)
    return len(seen)


def _scenario_run(
    fresh: Callable[[], str],
    name: str,
    options: dict[str, Any],
    wrap: Callable[[Blob], CutBlob | LoseBlob],
    surfaced: tuple[type[BaseException], ...] = (),
) -> tuple[str, CrashRun, CutBlob | LoseBlob]:
    """Scenario ``name`` on a fresh location (``fresh()``): its setup on the plain store, then
    its operations through ``wrap(store)``, each acknowledged as it returns, until the process
    dies (`Cut`) or an operation raises one of ``surfaced`` (the run ends there, that
    operation unacknowledged)."""
    setup, operations = SCENARIOS[name]
    url = fresh()
    remap = f"{url}-remap"
    setup(Shard(url, **options), remap)
    blob = wrap(open_blob(url, **options))
    shard = Shard(url, blob=blob, **options)
    run = CrashRun()
    run.ack(shard, 0)
    try:
        for op in operations:
            op(shard, remap)
            run.ack(shard, blob.calls)
    except Cut:
        pass
    except surfaced as e:
        log.debug("%s: a fault surfaced after call %d: %s", name, blob.calls, e)
    run.steps = blob.calls
    return url, run, blob


def _process_run(
    fresh: Callable[[], str], name: str, cut_at: int | None, options: dict[str, Any]
) -> tuple[str, CrashRun]:
    url, run, _ = _scenario_run(fresh, name, options, lambda b: CutBlob(b, cut_at))
    return url, run


def check_process_cuts(
    fresh: Callable[[], str], name: str, options: dict[str, Any] | None = None
) -> int:
    """Run scenario ``name`` once whole, then once per store call k on a fresh location
    (``fresh()``), the process dying before call k; check each image. Returns the number of
    cuts checked. Works on any store (what a successful call stored is what it keeps)."""
    options = dict(options or {})
    _, full = _process_run(fresh, name, None, options)
    for cut_at in range(full.steps + 1):
        url, _ = _process_run(fresh, name, cut_at, options)
        # Acknowledgements come from the whole run: a cut run stops before its own.
        check_image(partial(Shard, url, **options), full, cut_at, f"{name} (process cut)")
        check_fork(partial(Shard, fork_location(f"{url}-remap"), **options), name)
    return full.steps + 1


def _lossy_run(
    fresh: Callable[[], str],
    name: str,
    options: dict[str, Any],
    lose_at: int | None,
    mode: str,
    die_after: int | None,
) -> tuple[str, CrashRun, LoseBlob]:
    """Scenario ``name`` on a fresh location, losing the response to store call ``lose_at``.
    Operations run until one raises (an ``OSError`` or `Indeterminate` is the lost response
    surfacing: the run ends there, unacknowledged) or the process dies (`Cut`)."""
    from persistshard.errors import Indeterminate

    url, run, blob = _scenario_run(
        fresh,
        name,
        options,
        lambda b: LoseBlob(b, lose_at, mode, die_after),
        (OSError, Indeterminate),
    )
    assert isinstance(blob, LoseBlob)
    return url, run, blob


def check_lost_responses(
    fresh: Callable[[], str],
    name: str,
    options: dict[str, Any] | None = None,
    endings: tuple[int | None, ...] = ENDINGS,
) -> int:
    """Run scenario ``name`` once whole, then once per store call k, mode (`LOSS_MODES`;
    ``exists`` only where call k is a conditional create) and ending (``endings``), on a
    fresh location each, with the response to call k lost (`LoseBlob`); check each image
    (`check_image`): every operation the run saw return is there exactly once (its contents
    at its upper), the state is one the scenario produces, it verifies and takes a commit.
    Returns the number of runs checked."""
    options = dict(options or {})
    _, full, counted = _lossy_run(fresh, name, options, None, "lost", None)
    checked = 0
    for lose_at, kind in enumerate(counted.kinds):
        modes = LOSS_MODES if kind == "put_if_absent" else ("lost",)
        for mode in modes:
            for die_after in endings:
                url, run, blob = _lossy_run(fresh, name, options, lose_at, mode, die_after)
                assert blob.lost, f"{name}: store call {lose_at} was never made"
                # What this run saw acknowledged must be there; any state of the whole run
                # (an operation that failed may still have landed) is one the scenario makes.
                known = [replace(a, step=run.steps + 1) for a in full.acknowledged]
                both = CrashRun(run.steps, known + run.acknowledged)
                ending = "goes on" if die_after is None else f"dies {die_after} calls later"
                label = f"{name} (response to call {lose_at} ({kind}) {mode}, {ending})"
                check_image(partial(Shard, url, **options), both, run.steps, label)
                check_fork(partial(Shard, fork_location(f"{url}-remap"), **options), label)
                checked += 1
    return checked

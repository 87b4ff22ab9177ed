"""The ``persistshard`` command line: look at, check and maintain a shard without Spark.

    persistshard inspect LOCATION        upper, since, batches by level, sizes, unsealed updates
    persistshard history LOCATION        the state versions still in the log: what each did
    persistshard verify LOCATION         every checksum and invariant (exit 1 if any fails)
    persistshard compact LOCATION        physical and logical compaction, in this process
    persistshard gc LOCATION [--apply]   what garbage collection would delete (deletes with --apply)
    persistshard holds LOCATION [--expire READER] [--drop CONSUMER]
                                         reader holds and durable consumers holding since back
                                         (expires a hold or drops a consumer by hand)
    persistshard retention LOCATION [--seconds S] [--versions N] [--clear]
                                         the history retention since follows (sets it when given)
    persistshard conformance LOCATION    run the storage and semantics conformance suite there
                                         (never inside a shard; removes what it wrote)
    persistshard --version               the installed version
    persistshard repair LOCATION [--apply]   drop unreadable newest log entries (dry run default)
    persistshard fork SRC DST [--as-of T]    a zero-copy fork of SRC at T (default upper - 1)
    persistshard drop LOCATION [--apply]     delete a shard, keeping what its forks name
                                             (dry run default)

``persistshard --help`` lists the commands, ``persistshard COMMAND --help`` describes one (the
first line of its ``cmd_*`` docstring is its summary). Every command takes
``--storage-option NAME=VALUE`` (repeatable; passed to fsspec, a value that
parses as JSON is passed decoded), ``--consensus URL`` (the shard's log in a database:
``sqlite:///path`` or ``postgresql://...``; default next to the data) and ``--json`` for
machine-readable output. ``compact``,
``gc``, ``verify`` and ``conformance`` show progress on stderr when it is a terminal (tqdm;
nothing when it is not). Exit status: 0 when done, 1 when ``verify`` or ``conformance`` found a
problem or a ``repair`` dry run found something to repair, 2 on an error (its message starts
with the error class: `NoShard` on a location that holds no shard, for every command but
``conformance``, which needs an empty place; `StorageError` when the storage refuses, e.g.
``compact`` on a read-only directory or with missing credentials, never a raw OS or botocore
traceback). Storage option values
and consensus passwords are never printed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import math
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from persistshard.core.config import KNOBS, ShardConfig
from persistshard.core.shard import Shard
from persistshard.core.storage import layout
from persistshard.core.storage.blob import Blob, BlobWrapper, as_storage_error, open_blob
from persistshard.core.storage.layout import DEFAULT_RETENTION_SECONDS
from persistshard.errors import (
    CorruptData,
    InvalidOption,
    NoShard,
    PersistShardError,
)

log = logging.getLogger("persistshard.cli")

__all__ = ["NoShard", "main"]


def plural(count: int, singular: str, many: str | None = None) -> str:
    """``1 part``, ``2 parts``, ``0 parts``: a count with its noun in the right number."""
    return f"{count} {singular if count == 1 else (many or singular + 's')}"


def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs as fsspec storage options (JSON values decoded)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(
                f"--storage-option takes NAME=VALUE, got {pair.split('=')[0]!r}..."
            )
        try:
            out[name.strip()] = json.loads(value)
        except ValueError:
            out[name.strip()] = value
    return out


def parse_config(pairs: Sequence[str], location: str | None = None) -> ShardConfig:
    """``--set NAME=VALUE`` pairs as the shard's configuration (`ShardConfig.from_options`,
    the parser of every route); a name that is no knob is `InvalidOption`."""
    knobs: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or name.lower() not in KNOBS:
            raise InvalidOption(
                f"--set takes NAME=VALUE with NAME one of {', '.join(KNOBS)}, got {pair!r}",
                location=location,
            )
        knobs[name] = value
    return ShardConfig.from_options(knobs, location=location, prefix="--set ")


class Progress:
    """A progress bar on stderr when it is a terminal (tqdm), else nothing."""

    def __init__(self, desc: str, *, total: float | None = None, unit: str = "B") -> None:
        self.bar: Any = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # pragma: no cover - tqdm is a dependency
                return
            self.bar = tqdm(
                desc=desc,
                total=total,
                unit=unit,
                unit_scale=unit == "B",
                unit_divisor=1024 if unit == "B" else 1000,
                file=sys.stderr,
                leave=False,
            )

    @property
    def active(self) -> bool:
        return self.bar is not None

    def update(self, n: float = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class CountingBlob(BlobWrapper):
    """A blob that reports bytes read and written, and deletes, to a `Progress`."""

    def __init__(self, inner: Blob, progress: Progress, *, count: str = "bytes") -> None:
        super().__init__(inner)
        self.progress = progress
        self.count = count

    def _bytes(self, n: int) -> None:
        if self.count == "bytes":
            self.progress.update(n)

    def get(self, key: str) -> bytes | None:
        data = self.inner.get(key)
        self._bytes(len(data or b""))
        return data

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        data = self.inner.get_range(key, offset, length)
        self._bytes(len(data))
        return data

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)
        self._bytes(len(data))

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        if self.count == "deletes":
            self.progress.update(1)


def _plain(value: Any) -> Any:
    """A JSON-able form of reports (dataclasses, with their properties)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in dir(type(value)):
            if isinstance(getattr(type(value), name, None), property) and not name.startswith("_"):
                out[name] = _plain(getattr(value, name))
        return out
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    return value


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def cmd_inspect(shard: Shard, args: argparse.Namespace) -> int:
    """Show the shard: upper, since, columns, batches by level, sizes, unsealed updates,
    writers, column statistics, reader holds and durable consumers (with their age)."""
    info = shard.inspect.describe()
    from persistshard.core.read.plan import column_statistics

    state = shard.inspect.state()
    info["leases"] = {w: {"expires_ms": e} for w, e in sorted(state.leases.items())}
    info["lease_fence_ms"] = state.lease_fence_ms
    info["problems"] = []
    try:
        stats = column_statistics(shard._blob, state)
    except (CorruptData, OSError) as e:
        # The metadata is intact; only the parts' statistics cannot be read. Show the rest.
        stats = {}
        info["problems"].append(f"column statistics unavailable: {e}")
    info["column_statistics"] = {
        name: {k: v if isinstance(v, (int, type(None))) else str(v) for k, v in s.items()}
        for name, s in stats.items()
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"shard     {info['location']}")
    print(f"version   {info['version']}")
    print(f"upper     {info['upper']}   (times below it are final)")
    print(f"since     {info['since']}   (reads are exact at or after it)")
    print(f"columns   {info['schema'] or '(none yet)'}".replace("\n", ", "))
    print(f"trace     {plural(info['trace_batches'], 'batch', 'batches')}")
    for level, s in info["trace_levels"].items():
        print(
            f"  level {level}: {plural(s['batches'], 'batch', 'batches')}, "
            f"{plural(s['parts'], 'part')}, {plural(s['rows'], 'update')}, {_size(s['bytes'])}"
        )
    print(
        f"unsealed  {plural(info['unsealed_batches'], 'batch', 'batches')}, "
        f"{plural(info['unsealed_rows'], 'update')}, {_size(info['unsealed_bytes'])}"
    )
    for writer, batch in info["writers"].items():
        print(f"writer    {writer}: last committed batch {batch}")
    if info["txns"] is not None:  # core/txns.py: reads see the txns shard's upper
        print(
            f"txns      registered with {info['txns']['location']} at {info['txns']['at']} "
            f"(logical upper {shard.upper}; pending transactions: "
            f"{len(info['pending_transactions'])})"
        )
    if info["column_statistics"]:
        print("columns   (statistics over every chunk; bounds from chunks that keep them)")
    for name, c in info["column_statistics"].items():
        bounds = f"{c['min']} .. {c['max']}" if c["min"] is not None else "no bounds"
        print(
            f"  {name}: {bounds}, {plural(c['null_count'], 'null')}, bounds in "
            f"{c['chunks_with_bounds']}/{c['chunks']} chunks"
        )
    _print_holds(info["holds"])
    _print_consumers(info["consumers"])
    for write_id, lease in info["leases"].items():
        left = (lease["expires_ms"] - layout.now_ms()) / 1000
        print(f"lease     write {write_id}: {left:.0f} s left (renewed while it runs)")
    for problem in info["problems"]:
        print(f"damaged   {problem}; run `persistshard verify` for every damaged file")
    return 0


def _print_holds(holds: dict[str, dict[str, Any]]) -> None:
    now = layout.now_ms()
    for reader, h in holds.items():
        left = (h["expires_ms"] - now) / 1000
        lease = f"lease {left:.0f} s left" if h["live"] else "lease ran out (no longer holds)"
        print(f"hold      {reader}: since {h['since']}, {lease}")


def _age(ms: int) -> str:
    """A duration in ms, in the largest unit that keeps it readable."""
    seconds = max(0, ms) / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _print_consumers(consumers: dict[str, dict[str, Any]]) -> None:
    for name, c in consumers.items():
        print(
            f"consumer  {name}: position {c['position']} (holds since below it, no lease), "
            f"last moved {_age(c['age_ms'])} ago"
        )


def cmd_holds(shard: Shard, args: argparse.Namespace) -> int:
    """List what holds since back: the leased reader holds and the durable consumers (who
    keeps history from being compacted, until when, and since when); --expire READER drops a
    hold and --drop CONSUMER a consumer, by hand."""
    state = shard.inspect.state()
    if args.expire and args.expire not in state.holds:
        print(f"no hold named {args.expire!r} at {shard.location}", file=sys.stderr)
        return 1
    if args.drop and args.drop not in state.consumers:
        print(f"no consumer named {args.drop!r} at {shard.location}", file=sys.stderr)
        return 1
    if args.expire:
        shard.maintenance.expire_reader(args.expire)
    if args.drop:
        shard.maintenance.drop_consumer(args.drop)
    info = shard.inspect.describe()
    holds, consumers = info["holds"], info["consumers"]
    if args.json:
        print(json.dumps({"readers": holds, "consumers": consumers}, indent=2))
        return 0
    if not holds and not consumers:
        print("no reader holds or consumers")
    _print_holds(holds)
    _print_consumers(consumers)
    return 0


def cmd_retention(shard: Shard, args: argparse.Namespace) -> int:
    """Show the shard's history retention (since follows the upper minus it); --seconds S
    and/or --versions N set it, --clear removes it; needs write access to change it."""
    if args.clear and (args.seconds is not None or args.versions is not None):
        print("retention: give --clear or --seconds/--versions, not both", file=sys.stderr)
        return 2
    if args.clear or args.seconds is not None or args.versions is not None:
        shard.set_retention(seconds=args.seconds, versions=args.versions)
    state = shard.inspect.state()
    kept = state.retention
    if args.json:
        out = {
            "seconds": kept.ms / 1000 if kept is not None and kept.ms is not None else None,
            "versions": kept.versions if kept is not None else None,
            "since": state.since,
            "upper": state.upper,
        }
        print(json.dumps(out, indent=2))
        return 0
    what = kept.describe() if kept is not None else "none (history is kept until since moves)"
    print(f"retention {what}")
    print(f"since     {state.since} (upper {state.upper})")
    return 0


def cmd_history(shard: Shard, args: argparse.Namespace) -> int:
    """List the state versions still in the log: when, what kind of commit, what it did, and
    its metrics (rows, bytes and parts added/removed, duration, store requests, retries)."""
    history = shard.inspect.history()
    if args.json:
        print(json.dumps(history, indent=2))
        return 0
    print(HISTORY_HEADER)
    for h in history:
        when = ""
        if h.get("at_ms"):
            when = dt.datetime.fromtimestamp(h["at_ms"] / 1000, dt.UTC).strftime(
                "%Y-%m-%d %H:%M:%S"
            )
        print(
            f"v{h['version']:<6} {when:19}  {h['kind']:<16} {_metric_columns(h.get('metrics'))}"
            f"  {h['summary']}"
        )
    return 0


#: The column titles of ``persistshard history`` (metrics of entries written before metrics
#: existed show as ``-``).
HISTORY_HEADER = (
    f"{'VERSION':<7} {'COMMITTED (UTC)':19}  {'KIND':<16} {'ROWS +/-':>13} {'BYTES +/-':>17} "
    f"{'PARTS +/-':>9} {'MS':>6} {'REQS':>5} {'RETRY':>5}  SUMMARY"
)


def _metric_columns(m: dict[str, Any] | None) -> str:
    if not m:
        return f"{'-':>13} {'-':>17} {'-':>9} {'-':>6} {'-':>5} {'-':>5}"
    rows = f"+{m['rows_added']}/-{m['rows_removed']}"
    nbytes = f"+{_size(m['bytes_added'])}/-{_size(m['bytes_removed'])}"
    parts = f"+{m['parts_added']}/-{m['parts_removed']}"
    return (
        f"{rows:>13} {nbytes:>17} {parts:>9} {m['duration_ms']:>6} {m['store_requests']:>5} "
        f"{m['retries']:>5}"
    )


def _with_progress(shard: Shard, desc: str, total: float | None, count: str = "bytes") -> Any:
    progress = Progress(desc, total=total, unit="B" if count == "bytes" else "deletes")
    if not progress.active:
        return shard, progress
    blob = CountingBlob(shard._blob, progress, count=count)
    return shard.address.open(blob=blob), progress


def _stored_bytes(shard: Shard) -> int:
    info = shard.inspect.describe()
    return int(sum(v["bytes"] for v in info["trace_levels"].values()) + info["unsealed_bytes"])


def cmd_verify(shard: Shard, args: argparse.Namespace) -> int:
    """Check every checksum and invariant of the current state (exit 1 if any fails)."""
    counted, progress = _with_progress(shard, "verify", _stored_bytes(shard))
    try:
        report = counted.inspect.verify()
    finally:
        progress.close()
    if args.json:
        print(json.dumps(_plain(report) | {"ok": report.ok}, indent=2))
    else:
        print(
            f"version {report.version}: {plural(report.parts_checked, 'part')}, "
            f"{_size(report.bytes_checked)} checked"
        )
        for problem in report.problems:
            print(f"PROBLEM {problem}")
        print("ok" if report.ok else plural(len(report.problems), "problem"))
    return 0 if report.ok else 1


def cmd_compact(shard: Shard, args: argparse.Namespace) -> int:
    """Compact the shard in this process: merge batches (physical) and forward times below
    since (logical); needs write access."""
    counted, progress = _with_progress(shard, "compact (bytes read and written)", None)
    try:
        report = counted.maintenance.compact()
    finally:
        progress.close()
    plain = _plain(report)
    if args.json:
        print(json.dumps(plain, indent=2, default=str))
        return 0
    print(
        f"{plural(report.committed, 'merge')} committed, {report.conflicts} lost to concurrent "
        f"changes; batches {report.batches_before} -> {report.batches_after}; levels "
        f"{report.levels_before} -> {report.levels_after}"
    )
    return 0


def cmd_gc(shard: Shard, args: argparse.Namespace) -> int:
    """Show what garbage collection would delete (unreferenced parts, old log entries,
    temporary files); --apply deletes it."""
    report = shard.maintenance.gc(dry_run=True, retention_seconds=args.retention_seconds)
    if args.apply:
        plain = _plain(report)
        total = len(plain["parts"]) + len(plain["rollups"]) + plain["consensus_versions"]
        total += len(plain.get("temporary", []))
        counted, progress = _with_progress(shard, "gc", total, count="deletes")
        try:
            report = counted.maintenance.gc(dry_run=False, retention_seconds=args.retention_seconds)
        finally:
            progress.close()
    plain = _plain(report)
    if args.json:
        print(json.dumps(plain, indent=2, default=str))
        return 0
    verb = "deleted" if args.apply else "would delete"
    print(
        f"{verb}: {plural(len(report.parts), 'unreferenced part')}, "
        f"{plural(len(report.orphaned_parts), 'orphaned part')}, "
        f"{plural(len(report.rollups), 'rollup')}, "
        f"{plural(report.consensus_versions, 'log entry', 'log entries')}, "
        f"{plural(len(report.temporary), 'temporary file')} ({_size(report.bytes)})"
    )
    if report.young_parts:
        print(
            f"kept {plural(report.young_parts, 'unreferenced part')} younger than the "
            "retention floor"
        )
    if not args.apply:
        print("dry run: nothing deleted; pass --apply to delete")
    return 0


class _Collector:
    """A pytest plugin: progress per test, and the outcomes for ``--json``."""

    def __init__(self) -> None:
        self.outcomes: list[dict[str, str]] = []
        self.progress: Progress | None = None
        #: What the store answered (`persistshard.conformance.store_report`), by check.
        self.store: dict[str, Any] = {}

    def pytest_collection_finish(self, session: Any) -> None:
        self.progress = Progress("conformance", total=len(session.items), unit="tests")

    def pytest_runtest_logreport(self, report: Any) -> None:
        for name, value in getattr(report, "user_properties", ()):
            if name == "store" and isinstance(value, dict):
                self.store.update(value)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes.append(
                {"test": report.nodeid.split("::", 1)[-1], "outcome": report.outcome}
            )
            if self.progress is not None:
                self.progress.update(1)

    def pytest_sessionfinish(self, session: Any) -> None:
        if self.progress is not None:
            self.progress.close()


#: How `_print_store` names what `persistshard.conformance.store_report` found.
STORE_LINES = {
    "atomic_create": "atomic create",
    "repeated_conditional_put": "repeated conditional PUT",
    "lost_responses": "lost responses",
}


def _print_store(location: str, store: dict[str, Any]) -> None:
    """What the store answered, one line per check that ran (nothing if none did)."""
    if not store:
        return
    print(f"the store at {location}:")
    for key, label in STORE_LINES.items():
        if key not in store:
            continue
        value = store[key]
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        print(f"  {label:<26} {value}")


def _run_suite(pytest_args: list[str], plugins: list[Any], quiet: bool) -> int:
    """pytest's exit code for the conformance suite, its own output swallowed when ``quiet``
    (the JSON summary is then all the command prints)."""
    import io

    import pytest

    if not quiet:
        return int(pytest.main(pytest_args, plugins=plugins))
    with contextlib.redirect_stdout(io.StringIO()):
        return int(pytest.main(pytest_args, plugins=plugins))


class _HypothesisHome:
    """A pytest plugin of the conformance run: while the suite runs, Hypothesis's home
    directory (its example database and caches; by default ``.hypothesis`` in the working
    directory) is ``home``, a temporary directory the command removes after the run, so a
    run leaves nothing where the user started it; the process's home before the run is its
    home again after it (a test run calling `main` keeps its own). Hypothesis is imported
    here only once pytest has loaded it as a plugin (importing it earlier, pytest would warn
    that it cannot rewrite its asserts), and nothing goes through the environment."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.previous: Any = None

    def pytest_configure(self, config: Any) -> None:
        from hypothesis import configuration

        self.previous = configuration.storage_directory(intent_to_write=False).home_directory
        configuration.set_hypothesis_home_dir(self.home)

    def pytest_unconfigure(self, config: Any) -> None:
        from hypothesis import configuration

        configuration.set_hypothesis_home_dir(self.previous)


def cmd_conformance(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Run the storage and shard-semantics conformance suite at an empty location (exit 1 if
    a test fails): does this storage keep persistshard's contract?"""
    import importlib.util
    import tempfile

    # Found, not imported: pytest loads hypothesis as a plugin and rewrites its asserts, which
    # it cannot do for a module imported before pytest.main (PytestAssertRewriteWarning).
    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"persistshard conformance needs {missing[0]}: pip install 'persistshard[conformance]'",
            file=sys.stderr,
        )
        return 2
    from persistshard.conformance import cleanup
    from persistshard.conformance.storage import probe_atomic_create
    from persistshard.conformance.target import ConformanceTarget

    refusal = cleanup.refuse_inside_shard(args.location, options)
    if refusal is not None:
        print(f"persistshard conformance: {refusal}", file=sys.stderr)
        return 2
    consensus = options.pop("consensus", None)
    # The target reaches the suite as a pytest plugin object (its fixture), never through the
    # environment: the storage options may hold credentials.
    target = ConformanceTarget(args.location, dict(options), consensus, cleanup.new_run())
    run = target.run
    here = os.path.join(os.path.dirname(__file__), "conformance", "run_suite.py")
    collector = _Collector()
    pytest_args = [here, "-q", "-p", "no:cacheprovider"]
    if args.select:
        pytest_args += ["-k", args.select]
    try:
        probe = f"{cleanup.scratch_name(run)}/"
        probe_atomic_create(open_blob(args.location, **options), prefix=probe)
        with tempfile.TemporaryDirectory(prefix="persistshard-conformance-") as home:
            plugins = [collector, target, _HypothesisHome(home)]
            code = _run_suite(pytest_args, plugins, args.json)
        if args.json:
            failed = [o for o in collector.outcomes if o["outcome"] == "failed"]
            summary = {
                "location": args.location,
                "ok": code == 0,
                "passed": sum(o["outcome"] == "passed" for o in collector.outcomes),
                "failed": len(failed),
                "tests": collector.outcomes,
                "store": collector.store,
            }
            print(json.dumps(summary, indent=2))
        else:
            _print_store(args.location, collector.store)
        if code == 5:  # pytest: nothing ran
            print(f"persistshard conformance: no check matches {args.select!r}", file=sys.stderr)
            return 2
        return code
    finally:
        cleanup.remove_run(args.location, run, options)


def cmd_repair(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Dry run: which newest entries are unreadable and what restoring drops; ``--apply``:
    drop them (`persistshard.core.maintenance.repair`). Exit 0 when the shard reads afterwards (or
    needed nothing), 1 on a dry run that found something to repair."""
    from persistshard.core.maintenance.repair import repair

    shard = Shard(args.location, config=args.config, **options)
    report = repair(shard._machine, apply=args.apply)
    if report.newest_version == 0:
        raise NoShard(
            f"no shard at {shard.location}: no consensus entry is stored there (a "
            "mistyped path, or the wrong --storage-option?)"
        )
    if report.applied:
        shard.inspect.state()  # reads again: the restored head must load
    if args.json:
        print(json.dumps(_plain(report) | {"needed": report.needed}, indent=2))
    else:
        print(f"shard     {report.location}")
        print(f"newest    version {report.newest_version}")
        if not report.needed:
            print("ok        every newest entry is readable; nothing to repair")
            return 0
        verb = "dropped" if report.applied else "would drop"
        for d in report.dropped:
            print(f"{verb:<9} version {d.version} ({d.file}, {d.size} bytes): {d.problem}")
        print(
            f"{'restored' if report.applied else 'restores'}  version {report.valid_version} "
            f"(upper {report.valid_upper}); the dropped commits were never readable, so no "
            "reader saw them; their parts are orphans that gc removes"
        )
        if not report.applied:
            print("dry run: nothing changed; pass --apply to restore")
    return 0 if report.applied or not report.needed else 1


def cmd_fork(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Fork the shard at LOCATION into DST at --as-of (default its upper - 1): a new shard that
    names the source's parts instead of copying them (`persistshard.core.fork`)."""
    source = open_existing(args.location, options, args.config)
    fork = source.fork(args.dst, as_of=args.as_of)
    state = fork.inspect.state()
    named = sum(1 for p in state.parts() if p.source is not None)
    written = len(state.stored_part_keys()) - named
    out = {
        "source": source.location,
        "fork": fork.location,
        "as_of": state.since,
        "upper": state.upper,
        "parts_named": named,
        "parts_written": written,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"forked {out['source']} at {out['as_of']} into {out['fork']}: "
            f"{plural(named, 'part')} named, {plural(written, 'part')} written"
        )
    return 0


def cmd_drop(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Show what dropping the shard deletes (its own parts and log) and releases (its pins at
    the shards it was forked from); --apply drops it. Parts its live forks name are kept."""
    shard = Shard(args.location, config=args.config, **options)
    report = shard.drop(dry_run=not args.apply)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    verb = "deleted" if args.apply else "would delete"
    what = "its log" if report.log_deleted else "no log (its forks' pins are kept in it)"
    print(
        f"{verb}: {plural(len(report.parts), 'part')}, "
        f"{plural(len(report.files), 'other file')} and {what}"
    )
    if report.released:
        print(
            f"{'released' if args.apply else 'would release'}: pins at "
            f"{plural(len(report.released), 'source shard')}"
        )
    if report.kept_parts:
        print(
            f"kept {plural(len(report.kept_parts), 'part')} that "
            f"{plural(len(report.forks), 'fork')} still name: {', '.join(report.forks)}"
        )
    if not args.apply:
        print("dry run: nothing deleted; pass --apply to drop")
    return 0


COMMANDS = {
    "inspect": cmd_inspect,
    "history": cmd_history,
    "verify": cmd_verify,
    "compact": cmd_compact,
    "gc": cmd_gc,
    "holds": cmd_holds,
    "retention": cmd_retention,
}


def open_existing(
    location: str, options: dict[str, Any], config: ShardConfig | None = None
) -> Shard:
    """The shard at ``location`` (``options``: its storage options and consensus; ``config``:
    the ``--set`` knobs), or `NoShard` when nothing was ever committed there."""
    shard = Shard(location, config=config, **options)
    try:
        head = shard.inspect.head_version()
    except CorruptData as e:
        from persistshard.core.statemachine.machine import repair_hint

        raise repair_hint(e, shard.location) from e
    if head is None:
        raise NoShard(
            f"no shard at {shard.location}: no state was ever committed there (a mistyped "
            "path, or the wrong --storage-option?)"
        )
    return shard


#: What each command does to the storage, for a `StorageError` message.
DOING = {
    "inspect": "read the shard",
    "history": "read the shard's log",
    "verify": "verify the shard",
    "compact": "compact the shard",
    "gc": "collect the shard's garbage",
    "holds": "change the shard's holds",
    "retention": "set the shard's retention",
    "conformance": "run the conformance suite",
    "repair": "repair the shard's log",
    "fork": "fork the shard",
    "drop": "drop the shard",
}


def cmd_jar(args: argparse.Namespace) -> int:
    """Build (or find in the cache) the JVM companion jar and print its path, for
    ``spark-submit --jars`` or ``spark.jars`` (with the session catalog ``--conf`` it prints
    too, for SQL tables). It is built from the package's Java sources
    with the JDK's javac against the installed pyspark's jars; without a JDK the command says
    so and exits 2 (Spark then uses the Python source)."""
    from persistshard.datasource import companion

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", companion.CompanionUnavailable)
        path = companion.companion_jar()
    if path is None:
        reasons = [str(w.message) for w in caught if w.category is companion.CompanionUnavailable]
        print(reasons[0] if reasons else "CompanionUnavailable: no jar", file=sys.stderr)
        return 2
    if args.print_path:
        print(path)
    else:
        print(f"persistshard companion jar: {path}")
        print(
            f"use it with: spark-submit --jars {path} {companion.session_catalog_conf()} ... "
            "(or ps.configure_spark(builder))"
        )
    return 0


def _summary(command: Any) -> str:
    """The first sentence of a command's docstring: its one-line help."""
    doc = " ".join((command.__doc__ or "").split())
    return doc.split(". ")[0].rstrip(".")


def _version() -> str:
    from persistshard import __version__

    return f"persistshard {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="persistshard",
        description="persistshard: look at, check and maintain a shard without Spark.",
        epilog="Run 'persistshard COMMAND --help' for a command's options. Exit status: 0 done, "
        "1 a problem found (verify, conformance), 2 an error (NoShard, StorageError, ...).",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    extra = {
        "conformance": cmd_conformance,
        "repair": cmd_repair,
        "fork": cmd_fork,
        "drop": cmd_drop,
    }
    for name in [*COMMANDS, *extra]:
        command = COMMANDS.get(name) or extra[name]
        p = sub.add_parser(
            name,
            help=_summary(command),
            description=" ".join((command.__doc__ or "").split()),
        )
        p.add_argument("location", help="the shard: a local path or any fsspec URL")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=0,
            help="log what the library does to stderr (-v: info, -vv: debug; or set "
            f"{LOG_ENV}=info|debug)",
        )
        if name == "holds":
            p.add_argument("--expire", metavar="READER", help="drop this reader's hold")
            p.add_argument(
                "--drop",
                metavar="CONSUMER",
                help="drop this durable consumer (it no longer holds since back)",
            )
        if name == "retention":
            p.add_argument(
                "--seconds", type=float, help="keep the history of this many seconds readable"
            )
            p.add_argument(
                "--versions", type=int, help="keep this many newest data versions readable"
            )
            p.add_argument("--clear", action="store_true", help="remove the retention")
        p.add_argument(
            "--storage-option",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an fsspec storage option (repeatable; JSON values are decoded)",
        )
        if name != "conformance":
            p.add_argument(
                "--set",
                action="append",
                default=[],
                metavar="NAME=VALUE",
                help="a knob of the shard's configuration, e.g. chunk_bytes=1048576 "
                f"(repeatable; known: {', '.join(KNOBS)})",
            )
        if name == "conformance":
            p.add_argument(
                "-k",
                "--select",
                metavar="EXPR",
                help="run only the checks whose names match (pytest's -k expression, e.g. "
                "'Consensus and not race'); default: all",
            )
        if name == "fork":
            p.add_argument("dst", help="where the fork goes (a new location)")
            p.add_argument(
                "--as-of",
                type=int,
                default=None,
                metavar="T",
                help="the time forked (in [since, upper); default upper - 1)",
            )
        if name == "drop":
            p.add_argument("--apply", action="store_true", help="drop (default: dry run)")
        if name == "repair":
            p.add_argument(
                "--apply",
                action="store_true",
                help="drop the unreadable newest entries (default: dry run)",
            )
        p.add_argument(
            "--consensus",
            metavar="URL",
            help="the shard's consensus database (sqlite:///path or postgresql://...); "
            "default: the log next to the data",
        )
        if name == "gc":
            p.add_argument("--apply", action="store_true", help="delete (default: dry run)")
            p.add_argument(
                "--retention-seconds",
                type=float,
                default=DEFAULT_RETENTION_SECONDS,
                help="keep unreferenced parts and versions younger than this "
                f"(default {DEFAULT_RETENTION_SECONDS:g})",
            )
    jar = sub.add_parser(
        "jar",
        help=_summary(cmd_jar),
        description=" ".join((cmd_jar.__doc__ or "").split()),
    )
    jar.add_argument("--print-path", action="store_true", help="print only the jar's path")
    args = parser.parse_args(argv)
    if args.command == "jar":
        return cmd_jar(args)
    refused = _seconds_flag_problem(args)
    if refused is not None:
        print(str(refused), file=sys.stderr)
        return 2
    try:
        options = parse_storage_options(args.storage_option)
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    if args.consensus:
        options["consensus"] = args.consensus
    try:
        args.config = parse_config(getattr(args, "set", []), args.location)
    except InvalidOption as e:
        print(str(e), file=sys.stderr)
        return 2
    with _logging_to_stderr(args.verbose):
        return _run(args, options)


def _seconds_flag_problem(args: argparse.Namespace) -> InvalidOption | None:
    """The `InvalidOption` (one line, naming the flag) for an out-of-range seconds flag:
    ``gc --retention-seconds`` must be finite and >= 0 (0 is valid: keep only what a live
    version, hold or lease needs), ``retention --seconds`` finite and > 0."""
    if args.command == "gc":
        value, flag, least = args.retention_seconds, "--retention-seconds", ">= 0"
        bad = not math.isfinite(value) or value < 0
    elif args.command == "retention" and args.seconds is not None:
        value, flag, least = args.seconds, "--seconds", "> 0"
        bad = not math.isfinite(value) or value <= 0
    else:
        return None
    if not bad:
        return None
    return InvalidOption(
        f"{flag} {value:g} is out of range: give a finite number of seconds {least}",
        location=args.location,
    )


#: The environment variable that turns the library's log on for the CLI (``debug``, ``info``,
#: ``warning``), as ``-v`` does.
LOG_ENV = "PERSISTSHARD_LOG"


@contextlib.contextmanager
def _logging_to_stderr(verbose: int) -> Iterator[None]:
    """While the command runs, send the ``persistshard`` logger's records at the level asked
    (``-v`` info, ``-vv`` debug, else `LOG_ENV`) to stderr; without either, nothing (the
    command reports its own outcome and errors). Log lines carry no credentials: consensus
    URLs are redacted where they are logged."""
    level = {0: None, 1: logging.INFO}.get(verbose, logging.DEBUG)
    if level is None:
        named = os.environ.get(LOG_ENV, "").strip().upper()
        level = getattr(logging, named, None) if named else None
        if not isinstance(level, int):
            level = logging.CRITICAL + 1  # quiet: also keeps Python's last-resort handler off
    root = logging.getLogger("persistshard")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(level)
    before = root.level
    root.addHandler(handler)
    if level <= logging.CRITICAL and (root.level == logging.NOTSET or root.level > level):
        root.setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


def _run(args: argparse.Namespace, options: dict[str, Any]) -> int:
    log.debug("%s %s (storage options: %s)", args.command, args.location, sorted(options))
    try:
        if args.command == "conformance":
            return cmd_conformance(args, options)
        if args.command == "repair":
            return cmd_repair(args, options)
        if args.command == "fork":
            return cmd_fork(args, options)
        if args.command == "drop":
            return cmd_drop(args, options)
        return COMMANDS[args.command](open_existing(args.location, options, args.config), args)
    except Exception as e:
        # The storage's errors, and a commit refused for lack of access (it did not land),
        # said as StorageError with this command's words; ours as they are; no traceback.
        doing = DOING.get(args.command, f"run {args.command}")
        translated = as_storage_error(e, args.location, doing)
        if translated is None and isinstance(e, ImportError):
            print(f"{type(e).__name__}: {e}", file=sys.stderr)  # names what to install
            return 2
        if translated is None and not isinstance(e, PersistShardError):
            raise
        print(str(translated or e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

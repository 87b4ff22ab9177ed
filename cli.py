"""The ``persistshard`` command line: look at, check and maintain a shard without Spark.

    persistshard inspect LOCATION        upper, since, batches by level, sizes, unsealed updates
    persistshard history LOCATION        the state versions still in the log: what each did
    persistshard verify LOCATION         every checksum and invariant (exit 1 if any fails)
    persistshard compact LOCATION        physical and logical compaction, in this process
    persistshard gc LOCATION [--apply]   what garbage collection would delete (deletes with --apply)
    persistshard holds LOCATION [--expire READER]   reader holds on since (drops one by hand)
    persistshard conformance LOCATION    run the storage and semantics conformance suite there

Every command takes ``--storage-option NAME=VALUE`` (repeatable; passed to fsspec, a value that
parses as JSON is passed decoded), ``--consensus URL`` (the shard's log in a database:
``sqlite:///path`` or ``postgresql://...``; default next to the data) and ``--json`` for
machine-readable output. ``compact``,
``gc``, ``verify`` and ``conformance`` show progress on stderr when it is a terminal (tqdm;
nothing when it is not). Exit status: 0 when done, 1 when ``verify`` or ``conformance`` found a
problem, 2 on an error (its message starts with the error class) and on a location that holds
no shard (every command but ``conformance``, which needs an empty place). Storage option values
and consensus passwords are never printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import Any

from persistshard.core import layout
from persistshard.core.blob import Blob, BlobWrapper, open_blob
from persistshard.core.layout import DEFAULT_RETENTION_SECONDS
from persistshard.core.shard import Shard
from persistshard.errors import PersistShardError


class NoShard(Exception):
    """The location holds no shard (no state was ever committed there)."""


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
    info = shard.describe()
    from persistshard.core.read import column_statistics

    stats = column_statistics(shard.blob, shard.state())
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
    print(f"trace     {info['trace_batches']} batches")
    for level, s in info["trace_levels"].items():
        print(
            f"  level {level}: {s['batches']} batches, {s['parts']} parts, "
            f"{s['rows']} updates, {_size(s['bytes'])}"
        )
    print(
        f"unsealed  {info['unsealed_batches']} batches, {info['unsealed_rows']} updates, "
        f"{_size(info['unsealed_bytes'])}"
    )
    for writer, batch in info["writers"].items():
        print(f"writer    {writer}: last committed batch {batch}")
    if info["column_statistics"]:
        print("columns   (statistics over every chunk; bounds from chunks that keep them)")
    for name, c in info["column_statistics"].items():
        bounds = f"{c['min']} .. {c['max']}" if c["min"] is not None else "no bounds"
        print(
            f"  {name}: {bounds}, {c['null_count']} nulls, bounds in "
            f"{c['chunks_with_bounds']}/{c['chunks']} chunks"
        )
    _print_holds(info["holds"])
    return 0


def _print_holds(holds: dict[str, dict[str, Any]]) -> None:
    now = layout.now_ms()
    for reader, h in holds.items():
        left = (h["expires_ms"] - now) / 1000
        lease = f"lease {left:.0f} s left" if h["live"] else "lease ran out (no longer holds)"
        print(f"hold      {reader}: since {h['since']}, {lease}")


def cmd_holds(shard: Shard, args: argparse.Namespace) -> int:
    if args.expire:
        if args.expire not in shard.state().holds:
            print(f"no hold named {args.expire!r} at {shard.location}", file=sys.stderr)
            return 1
        shard.expire_reader(args.expire)
    holds = shard.describe()["holds"]
    if args.json:
        print(json.dumps(holds, indent=2))
        return 0
    if not holds:
        print("no reader holds")
    _print_holds(holds)
    return 0


def cmd_history(shard: Shard, args: argparse.Namespace) -> int:
    history = shard.history()
    if args.json:
        print(json.dumps(history, indent=2))
        return 0
    for h in history:
        when = ""
        if h.get("at_ms"):
            when = dt.datetime.fromtimestamp(h["at_ms"] / 1000, dt.timezone.utc).strftime(
                "%Y-%m-%d %H:%M:%S"
            )
        print(f"v{h['version']:<6} {when:19}  {h['kind']:<16} {h['summary']}")
    return 0


def _with_progress(shard: Shard, desc: str, total: float | None, count: str = "bytes") -> Any:
    progress = Progress(desc, total=total, unit="B" if count == "bytes" else "deletes")
    if not progress.active:
        return shard, progress
    blob = CountingBlob(shard.blob, progress, count=count)
    return Shard(shard.location, blob=blob, **shard.storage_options), progress


def _stored_bytes(shard: Shard) -> int:
    info = shard.describe()
    return int(sum(v["bytes"] for v in info["trace_levels"].values()) + info["unsealed_bytes"])


def cmd_verify(shard: Shard, args: argparse.Namespace) -> int:
    counted, progress = _with_progress(shard, "verify", _stored_bytes(shard))
    try:
        report = counted.verify()
    finally:
        progress.close()
    if args.json:
        print(json.dumps(_plain(report) | {"ok": report.ok}, indent=2))
    else:
        print(
            f"version {report.version}: {report.parts_checked} parts, "
            f"{_size(report.bytes_checked)} checked"
        )
        for problem in report.problems:
            print(f"PROBLEM {problem}")
        print("ok" if report.ok else f"{len(report.problems)} problems")
    return 0 if report.ok else 1


def cmd_compact(shard: Shard, args: argparse.Namespace) -> int:
    counted, progress = _with_progress(shard, "compact (bytes read and written)", None)
    try:
        report = counted.compact()
    finally:
        progress.close()
    plain = _plain(report)
    if args.json:
        print(json.dumps(plain, indent=2, default=str))
        return 0
    print(
        f"{report.committed} merges committed, {report.conflicts} lost to concurrent changes; "
        f"batches {report.batches_before} -> {report.batches_after}; levels "
        f"{report.levels_before} -> {report.levels_after}"
    )
    return 0


def cmd_gc(shard: Shard, args: argparse.Namespace) -> int:
    report = shard.gc(dry_run=True, retention_seconds=args.retention_seconds)
    if args.apply:
        plain = _plain(report)
        total = len(plain["parts"]) + len(plain["rollups"]) + plain["consensus_versions"]
        total += len(plain.get("temporary", []))
        counted, progress = _with_progress(shard, "gc", total, count="deletes")
        try:
            report = counted.gc(dry_run=False, retention_seconds=args.retention_seconds)
        finally:
            progress.close()
    plain = _plain(report)
    if args.json:
        print(json.dumps(plain, indent=2, default=str))
        return 0
    verb = "deleted" if args.apply else "would delete"
    print(
        f"{verb}: {len(report.parts)} unreferenced parts, "
        f"{len(report.orphaned_parts)} orphaned parts, "
        f"{len(report.rollups)} rollups, {report.consensus_versions} log "
        f"entries, {len(report.temporary)} temporary files ({_size(report.bytes)})"
    )
    if report.young_parts:
        print(f"kept {report.young_parts} unreferenced parts younger than the retention floor")
    if not args.apply:
        print("dry run: nothing deleted; pass --apply to delete")
    return 0


class _Collector:
    """A pytest plugin: progress per test, and the outcomes for ``--json``."""

    def __init__(self) -> None:
        self.outcomes: list[dict[str, str]] = []
        self.progress: Progress | None = None

    def pytest_collection_finish(self, session: Any) -> None:
        self.progress = Progress("conformance", total=len(session.items), unit="tests")

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes.append(
                {"test": report.nodeid.split("::", 1)[-1], "outcome": report.outcome}
            )
            if self.progress is not None:
                self.progress.update(1)

    def pytest_sessionfinish(self, session: Any) -> None:
        if self.progress is not None:
            self.progress.close()


def cmd_conformance(args: argparse.Namespace, options: dict[str, Any]) -> int:
    import contextlib
    import io
    import os

    try:
        import hypothesis  # noqa: F401
        import pytest
    except ImportError as e:
        print(
            f"persistshard conformance needs {e.name}: pip install 'persistshard[conformance]'",
            file=sys.stderr,
        )
        return 2
    from persistshard.conformance.storage import probe_atomic_create

    probe_atomic_create(open_blob(args.location, **options), prefix="conformance-probe/")
    os.environ["PERSISTSHARD_CONFORMANCE_LOCATION"] = args.location
    consensus = options.pop("consensus", None)
    if consensus:
        os.environ["PERSISTSHARD_CONFORMANCE_CONSENSUS"] = consensus
    os.environ["PERSISTSHARD_CONFORMANCE_STORAGE_OPTIONS"] = json.dumps(options)
    here = os.path.join(os.path.dirname(__file__), "conformance", "run_suite.py")
    # run_suite reads its location, options and consensus from the environment when imported:
    # a second run in this process must import it afresh, not reuse the first run's values.
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and os.path.realpath(path) == os.path.realpath(here):
            del sys.modules[name]
    collector = _Collector()
    pytest_args = [here, "-q", "-p", "no:cacheprovider"]
    if args.json:
        with contextlib.redirect_stdout(io.StringIO()):
            code = int(pytest.main(pytest_args, plugins=[collector]))
        failed = [o for o in collector.outcomes if o["outcome"] == "failed"]
        summary = {
            "location": args.location,
            "ok": code == 0,
            "passed": sum(o["outcome"] == "passed" for o in collector.outcomes),
            "failed": len(failed),
            "tests": collector.outcomes,
        }
        print(json.dumps(summary, indent=2))
        return code
    return int(pytest.main(pytest_args, plugins=[collector]))


COMMANDS = {
    "inspect": cmd_inspect,
    "history": cmd_history,
    "verify": cmd_verify,
    "compact": cmd_compact,
    "gc": cmd_gc,
    "holds": cmd_holds,
}


def open_existing(location: str, options: dict[str, Any]) -> Shard:
    """The shard at ``location``, or `NoShard` when nothing was ever committed there."""
    shard = Shard(location, **options)
    if shard.consensus.head() is None:
        raise NoShard(
            f"NoShard: no shard at {shard.location}: no state was ever committed there (a mistyped "
            "path, or the wrong --storage-option?)"
        )
    return shard


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="persistshard", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in [*COMMANDS, "conformance"]:
        p = sub.add_parser(name)
        p.add_argument("location", help="the shard: a local path or any fsspec URL")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "holds":
            p.add_argument("--expire", metavar="READER", help="drop this reader's hold")
        p.add_argument(
            "--storage-option",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an fsspec storage option (repeatable; JSON values are decoded)",
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
    args = parser.parse_args(argv)
    try:
        options = parse_storage_options(args.storage_option)
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    if args.consensus:
        options["consensus"] = args.consensus
    try:
        if args.command == "conformance":
            return cmd_conformance(args, options)
        return COMMANDS[args.command](open_existing(args.location, options), args)
    except (PersistShardError, NoShard) as e:
        print(str(e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``persistshard`` command line: look at, check and maintain a shard without Spark.

    persistshard inspect LOCATION        upper, since, batches by level, sizes, unsealed updates
    persistshard history LOCATION        the state versions still in the log: what each did
    persistshard verify LOCATION         every checksum and invariant (exit 1 if any fails)
    persistshard compact LOCATION        physical and logical compaction, in this process
    persistshard gc LOCATION [--apply]   what garbage collection would delete (deletes with --apply)
    persistshard holds LOCATION [--expire READER]   reader holds on since (drops one by hand)
    persistshard conformance LOCATION    run the storage and semantics conformance suite there

Every command takes ``--json`` for machine-readable output. Errors print their message (which
starts with the error class) and exit with status 2.
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
from persistshard.core.layout import DEFAULT_RETENTION_SECONDS
from persistshard.core.shard import Shard, open_shard
from persistshard.errors import PersistShardError


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


def cmd_verify(shard: Shard, args: argparse.Namespace) -> int:
    report = shard.verify()
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
    report = shard.compact()
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
    report = shard.gc(dry_run=not args.apply, retention_seconds=args.retention_seconds)
    plain = _plain(report)
    if args.json:
        print(json.dumps(plain, indent=2, default=str))
        return 0
    verb = "deleted" if args.apply else "would delete"
    print(
        f"{verb}: {len(report.parts)} unreferenced parts, "
        f"{len(report.orphaned_parts)} orphaned parts, "
        f"{len(report.rollups)} rollups, {report.consensus_versions} log "
        f"entries ({_size(report.bytes)})"
    )
    if report.young_parts:
        print(f"kept {report.young_parts} unreferenced parts younger than the retention floor")
    if not args.apply:
        print("dry run: nothing deleted; pass --apply to delete")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
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
    os.environ["PERSISTSHARD_CONFORMANCE_LOCATION"] = args.location
    here = os.path.join(os.path.dirname(__file__), "conformance", "run_suite.py")
    return int(pytest.main([here, "-q", "-p", "no:cacheprovider"]))


COMMANDS = {
    "inspect": cmd_inspect,
    "history": cmd_history,
    "verify": cmd_verify,
    "compact": cmd_compact,
    "gc": cmd_gc,
    "holds": cmd_holds,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="persistshard", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in [*COMMANDS, "conformance"]:
        p = sub.add_parser(name)
        p.add_argument("location", help="the shard: a local path or any fsspec URL")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "holds":
            p.add_argument("--expire", metavar="READER", help="drop this reader's hold")
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
        if args.command == "conformance":
            return cmd_conformance(args)
        return COMMANDS[args.command](open_shard(args.location), args)
    except PersistShardError as e:
        print(str(e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

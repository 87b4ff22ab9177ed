"""``python -m benchmarks [NAME ...] [--size quick|full] [--rounds N] [--check] [--render]``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks import BY_NAME, REGISTRY
from benchmarks import harness as h


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run persistshard's benchmarks side by side with their anchors; record "
        "the results in docs/benchmarks.json and regenerate docs/benchmarks.md.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    p.add_argument("--size", choices=h.SIZES, default=None, help="quick (default) or full")
    p.add_argument(
        "--rounds", type=int, default=None, help="rounds (default: 3 quick, 5 full, 3 full scaling)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="run fresh and compare ratios with the record of the same size; record nothing; "
        f"exit 1 if a ratio's median got worse by more than {h.TOLERANCE * 100:.0f}%% and "
        "every fresh round is worse than every recorded round (inconclusive, not failed, "
        "when the anchor itself ran faster than recorded by the same rule)",
    )
    p.add_argument(
        "--fresh", type=Path, help="with --check: compare this saved run instead of running"
    )
    p.add_argument("--render", action="store_true", help="only regenerate the page from the record")
    p.add_argument("--list", action="store_true", help="list the benchmarks")
    p.add_argument("--record", type=Path, default=h.RECORD, help="the JSON record")
    p.add_argument("--page", type=Path, default=h.PAGE, help="the markdown page")
    # Internal: run the one named benchmark in this process and write its result there.
    p.add_argument("--result-to", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return args


def run_all(names: list[str], size: str, rounds: int | None) -> tuple[list[h.Result], list[str]]:
    """Run ``names`` one after the other (never two at once: they would measure each other)."""
    results, failed = [], []
    for name in names:
        bench = BY_NAME[name]
        rounds_here = rounds or bench.default_rounds(size)
        print(f"== {name} ({size}, {rounds_here} rounds): {bench.summary}", flush=True)
        try:
            bench.load()
        except ImportError as e:
            print(f"   not available yet, skipped: {e}", flush=True)
            continue
        started = time.time()
        result = _run_isolated(name, size, rounds_here)
        if result is None:
            failed.append(name)
            continue
        for m in result["measurements"]:
            r = m["ratio"]
            shown = (
                f"skipped: {m['skipped']}"
                if m.get("skipped")
                else (f"ratio {r['median']:.2f}x ({r['min']:.2f} to {r['max']:.2f})" if r else "-")
            )
            target = "" if m["target"] is None else f", target <= {m['target']:g}x"
            print(f"   {m['what']}: {m['ours']} vs {m['anchor']}: {shown}{target}", flush=True)
        print(f"   done in {time.time() - started:.0f} s", flush=True)
        results.append(result)
    return results, failed


def _run_isolated(name: str, size: str, rounds: int) -> h.Result | None:
    """Run one benchmark in a fresh Python process (None if it failed; its traceback is
    on stderr). Every benchmark then starts from the same state, whichever ran before it in
    this invocation: no Spark session, JVM heap, warm worker or allocator cache carried over,
    so a ratio recorded alone and the same ratio checked after ten other benchmarks measure
    the same thing."""
    with tempfile.TemporaryDirectory(prefix="psbench-result-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks", name, "--size", size]
        command += ["--rounds", str(rounds), "--result-to", str(out)]
        code = subprocess.run(command, check=False).returncode
        if code != 0 or not out.exists():
            print(f"   {name} failed (exit code {code})", file=sys.stderr, flush=True)
            return None
        result: h.Result = json.loads(out.read_text())
        return result


def _run_here(name: str, size: str, rounds: int, out: Path) -> int:
    """The child side of `_run_isolated`."""
    try:
        result = h.run_benchmark(BY_NAME[name], size, rounds)
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        stop_spark()
    out.write_text(json.dumps(result))
    return 0


def _shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def stop_spark() -> None:
    """Stop this process's active Spark session: only in a benchmark's own child process
    (`_run_here`), which started it. The invoking process never starts one (every benchmark
    runs in a child), so it never stops one either: a session there is its caller's (the test
    suite's shared session, when the harness is tested)."""
    if "pyspark" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is not None:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.list:
        for b in REGISTRY:
            print(f"{b.name:<12} {b.summary}")
        return 0
    if args.result_to is not None:
        if len(args.names) != 1 or args.size is None or args.rounds is None:
            raise SystemExit("--result-to runs exactly one benchmark, with --size and --rounds")
        return _run_here(args.names[0], args.size, args.rounds, args.result_to)
    record = h.load_record(args.record)
    if args.render:
        h.write_page(record, REGISTRY, args.page)
        print(f"wrote {_shown_path(args.page)}")
        return 0
    names = args.names or [b.name for b in REGISTRY]
    size = args.size or "quick"
    rounds = args.rounds
    if args.check:
        if args.fresh:
            fresh = h.load_record(args.fresh)["runs"][size]
            fresh = {n: r for n, r in fresh.items() if not args.names or n in names}
            failed: list[str] = []
        else:
            results, failed = run_all(names, size, rounds)
            fresh = {r["name"]: r for r in results}
            suspects = sorted(
                {c.benchmark for c in h.compare(record["runs"][size], fresh) if c.worse()}
            )
            if suspects:
                # A ratio worse beyond the spread of three rounds happens by chance about
                # once in twenty: confirm on the rounds of a second run, pooled.
                print(f"confirming {', '.join(suspects)}: a second run, rounds pooled")
                again, failed_again = run_all(suspects, size, rounds)
                failed += failed_again
                for r in again:
                    fresh[r["name"]] = h.pool(fresh[r["name"]], r)
                results = [fresh[r["name"]] for r in results]
            out = h.ROOT / "benchmarks" / "results" / f"check-{size}.json"
            h.save_record(h.merge(h.empty_record(), results), out)
            print(f"fresh results saved to {out.relative_to(h.ROOT)}")
        missing = sorted(set(fresh) - set(record["runs"][size]))
        if missing:
            print(
                f"no recorded {size}-size figures for {', '.join(missing)}: record them with "
                f"`python -m benchmarks {' '.join(missing)} --size {size}`"
            )
        comparisons = h.compare(record["runs"][size], fresh)
        print(h.check_report(comparisons))
        worse = any(c.worse() for c in comparisons)
        return 1 if worse or failed else 0
    results, failed = run_all(names, size, rounds)
    if results:
        # Re-read: a run takes long, and others may have recorded other benchmarks meanwhile.
        record = h.merge(h.load_record(args.record), results)
        h.save_record(record, args.record)
        h.write_page(record, REGISTRY, args.page)
        print(f"wrote {_shown_path(args.record)} and {_shown_path(args.page)}")
    if failed:
        print(f"failed or unavailable: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

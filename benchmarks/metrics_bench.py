"""What observability costs a commit: 1-row appends with metrics on vs switched off.

Each round appends one row ``commits`` times to a fresh shard on local disk and takes the
median commit time; once as the shard always runs (every store request timed and counted into
the process registry and the operation, each commit's metrics computed and stored in its log
entry, module loggers at their default level), and once with all of that switched off for the
round (`persistshard.core.storage.metrics`: the counting wrappers, the operation scopes and
the entry metrics replaced by no-ops; only here). The two alternate, each round on fresh
shards in the same directory. Target: the ratio is within the run's noise (the spread of the
rounds).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from collections.abc import Iterator
from typing import Any

from benchmarks.commit_bench import one_row_commit_p50
from benchmarks.harness import alternate, measurement

OURS = "metrics on (as shipped)"
ANCHOR = "metrics switched off"


@contextlib.contextmanager
def _metrics_off() -> Iterator[None]:
    """Replace the metrics hooks the shard and the state machine call with no-ops."""
    from persistshard.core.storage import metrics

    saved = {
        name: getattr(metrics, name)
        for name in ("counting_blob", "count_consensus", "operation", "commit_metrics")
    }

    @contextlib.contextmanager
    def no_scope(name: str) -> Iterator[None]:
        yield None

    metrics.counting_blob = lambda blob: blob  # type: ignore[assignment]
    metrics.count_consensus = lambda consensus, requests: consensus  # type: ignore[assignment]
    metrics.operation = no_scope  # type: ignore[assignment]
    metrics.commit_metrics = lambda before, after, retries: {}  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(metrics, name, value)


def run(commits: int = 50, rounds: int = 5) -> dict[str, Any]:

    with tempfile.TemporaryDirectory(prefix="psbench-metrics-") as tmp:
        counter = iter(range(1_000_000))

        def p50(on: bool) -> Any:
            def go() -> float:
                with contextlib.nullcontext() if on else _metrics_off():
                    return one_row_commit_p50(f"{tmp}/s{next(counter)}", commits)

            return go

        times = alternate({OURS: p50(True), ANCHOR: p50(False)}, rounds)
    on_ms = statistics.median(times[OURS]) * 1000
    off_ms = statistics.median(times[ANCHOR]) * 1000
    spread = (max(times[ANCHOR]) - min(times[ANCHOR])) / statistics.median(times[ANCHOR])
    return {
        "title": "Observability: 1-row commit with metrics on vs switched off",
        "description": (
            f"Each round: {commits} one-row appends to a fresh local shard, the median commit "
            "time of the round; as shipped (every store request timed and counted, each "
            "commit's metrics stored in its entry) alternating with the metrics hooks replaced "
            "by no-ops. Target: within the noise of the run (the anchor's own spread)."
        ),
        "params": {"commits": commits},
        "measurements": [
            measurement(
                "1-row append, p50 of a round",
                OURS,
                ANCHOR,
                times[OURS],
                times[ANCHOR],
                note=f"on {on_ms:.2f} ms, off {off_ms:.2f} ms; the anchor's rounds spread "
                f"{spread:.0%}",
                extra={"on_p50_ms": on_ms, "off_p50_ms": off_ms, "anchor_spread": spread},
            )
        ],
    }

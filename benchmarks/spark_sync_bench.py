"""Spark append with every put synced against syncing switched off, in the same run (issue
25 item 1: "Spark append ratio moves by less than 5%").

Data: the Spark benchmark's table (`benchmarks.spark_bench.make_frame`: ``rows`` rows of
id BIGINT, name STRING of 16 characters, value DOUBLE, cached), local[2]. Each round appends it
into a fresh shard on local disk twice, in alternating order: once as every user does (each
put fsyncs its data, then its directory), once with the benchmark-only storage option
``storage.unsafe_no_sync=true`` (`persistshard.core.storage.blob.NO_SYNC_OPTION`), which
reaches every task and the commit, so both sides run in the same session, on the same
workers, rounds interleaved. Target: the synced append within 1.05x the unsynced one.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from benchmarks import anchors as a
from benchmarks.harness import alternate, measurement, skipped
from benchmarks.spark_bench import human, make_frame, timed

OURS = "synced (every put fsynced)"
ANCHOR = "syncing switched off"
TARGET = 1.05


def run(rows: int = 2_000_000, rounds: int = 7) -> dict[str, Any]:
    from persistshard.core.storage.blob import NO_SYNC_OPTION

    spark = a.spark_session()
    missing = a.persistshard_available(spark)
    n = human(rows)
    what = f"append {n} rows"
    if missing is not None:
        measurements = [skipped(what, OURS, ANCHOR, missing, target=TARGET)]
        return {"title": "Spark append: synced vs unsynced", "measurements": measurements}
    df = make_frame(spark, rows)
    counter = itertools.count()
    with tempfile.TemporaryDirectory(prefix="psbench-spark-sync-") as tmp:

        def contender(options: dict[str, str]) -> Callable[[], float]:
            def go() -> float:
                path = f"{tmp}/w{next(counter)}"

                def write() -> None:
                    df.write.format("persistshard").mode("append").options(**options).save(path)

                return timed(write, lambda: shutil.rmtree(path, True))

            return go

        times = alternate(
            {OURS: contender({}), ANCHOR: contender({f"storage.{NO_SYNC_OPTION}": "true"})},
            rounds,
        )
    df.unpersist()
    return {
        "title": "Spark append: every put synced vs syncing switched off",
        "description": (
            f"{n} rows (the Spark benchmark's table, cached), local[2], appended into a fresh "
            "local shard per round: as always (every put fsyncs its data before publishing "
            "the name, then the directory) alternating with the benchmark-only storage option "
            f"`storage.{NO_SYNC_OPTION}=true` (no sync anywhere: tasks and commit), same "
            "session, same workers. Target (issue 25 item 1): the ratio within 1.05x."
        ),
        "params": {"rows": rows, "master": "local[2]", "partitions": 2},
        "measurements": [
            measurement(what, OURS, ANCHOR, times[OURS], times[ANCHOR], target=TARGET)
        ],
    }

"""The reads of tests/test_s3.py's companion tests: one shard on S3 (moto) read through the
JVM companion (``format("persistshard")``) and through the Python source (registered again
under ``persistshard_python``), in a Spark session that has the companion.

`collect` reads in a given session; run as ``python tests/hadoop_session.py WORKDIR`` it
starts its own (a JVM of its own: ``spark.jars`` and ``spark.hadoop.*`` apply only when a
session starts) with the settings ``WORKDIR/request.json`` names under ``conf``, and prints
one line ``RESULT <json>``. The request also names the shard (``location``) and the read's
options (``options``, the ``storage.*`` ones). The result: both sides' rows as sorted
``[repr(row), count]`` pairs, and the companion's physical plan (its scan says how many
partitions the JVM decoded).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REQUEST = "request.json"


def rows_of(df: Any) -> list[list[Any]]:
    counts = Counter(repr(tuple(r)) for r in df.collect())
    return [[row, n] for row, n in sorted(counts.items())]


def collect(spark: Any, work: Path) -> dict[str, Any]:
    """Read the shard of ``work``'s request both ways in ``spark`` (a session with the
    companion); leaves the Python source registered under ``persistshard_python``."""
    from persistshard.datasource.source import PersistShardDataSource

    class PythonOnly(PersistShardDataSource):
        @classmethod
        def name(cls) -> str:
            return "persistshard_python"

    spark.dataSource.register(PythonOnly)
    request = json.loads((work / REQUEST).read_text())
    location, options = request["location"], request["options"]
    companion = spark.read.format("persistshard").options(**options).load(location)
    python = spark.read.format("persistshard_python").options(**options).load(location)
    result = {"companion": rows_of(companion), "python": rows_of(python)}
    # Planned once: the collect above ran this plan (its scan's description is filled in).
    result["plan"] = companion._jdf.queryExecution().executedPlan().toString()
    return result


def main() -> None:
    from jvm_scan_session import companion_session

    work = Path(sys.argv[1])
    spark = companion_session(**json.loads((work / REQUEST).read_text()).get("conf", {}))
    result = collect(spark, work)
    spark.stop()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()

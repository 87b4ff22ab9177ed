"""Shards of every type whose parts are at each format version (1, 2, 3), read through the JVM
companion, equal the Python source's reads of the same shards (docs/format.md, "Versioning").

Version 3 parts are as the writer writes them: plain and compressed segments, a part file and
an inline part. Versions 2 and 1 are written with no plain segment (what the writer did before
version 3) and rewritten in place at that version: version 3 without plain segments differs
from version 2 only in the version fields, version 2 from 1 only in the per-column ``stats``.
The JVM decodes the snapshots of versions 2 and 3 itself; version 1 parts have no statistics
of ``_diff`` (no proof that every diff is 1), so Python reads them.

The reads run in the suite's session when it has the companion (``PERSISTSHARD_TEST_COMPANION``,
`has_companion_catalog`), else in a Spark session of its own: this file run as a script
(``python tests/test_companion_versions.py WORKDIR``, one line ``RESULT <json>``), as
tests/test_jvm_companion.py's `run_session` runs one.
"""

from __future__ import annotations

import json
import random
import re
import sys
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_jvm_companion import run_session

pytestmark = [pytest.mark.spark, pytest.mark.subprocess]

VERSIONS = (3, 2, 1)
#: Rows of the two appends of each shard: a part file, then a small one (inline at version 3).
APPENDS = (900, 60)
#: The Python source registered again under its own name, beside the companion's.
PYTHON_NAME = "persistshard_python"


def every_type_table(n: int, seed: int) -> pa.Table:
    """``n`` rows of every type a Spark read of a shard returns, nulls in each nullable column:
    random doubles (segments zstd cannot shrink: stored plain from version 3) beside runs and
    sequences (compressed segments); decimals negative and wider than a long."""
    rnd = random.Random(seed)
    ids = list(range(n))

    def holes(values: list[Any], every: int) -> list[Any]:
        return [None if i % every == 3 else v for i, v in enumerate(values)]

    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "b": pa.array(holes([i % 100 - 50 for i in ids], 7), pa.int8()),
            "sh": pa.array(holes([i * 7 % 30000 for i in ids], 11), pa.int16()),
            "i": pa.array(holes([i * 1_000_003 % 2**31 for i in ids], 5), pa.int32()),
            "f": pa.array(holes([rnd.uniform(-1e6, 1e6) for _ in ids], 9), pa.float32()),
            "d": pa.array([rnd.random() * 1e9 for _ in ids], pa.float64()),
            "dec": pa.array(
                holes([Decimal(i * 37 % 100_000 - 50_000) / 100 for i in ids], 13),
                pa.decimal128(10, 2),
            ),
            "wide": pa.array(
                holes([Decimal(10**25 * (i - n // 2) + i) / 10**4 for i in ids], 19),
                pa.decimal128(30, 4),
            ),
            "s": pa.array(holes([f"name-{i % 97}" for i in ids], 6)),
            "bin": pa.array(holes([bytes([i % 256, 7]) * (i % 4) for i in ids], 8), pa.binary()),
            "flag": pa.array(holes([i % 3 == 0 for i in ids], 10), pa.bool_()),
            "day": pa.array(holes([date(2024, 1, 1 + i % 28) for i in ids], 12), pa.date32()),
            "ts": pa.array(
                holes([datetime(2024, 3, 1, i % 24, i % 60, tzinfo=UTC) for i in ids], 14),
                pa.timestamp("us", tz="UTC"),
            ),
            "ntz": pa.array(
                holes([datetime(2023, 5, 2, i % 24, 0, i % 60) for i in ids], 15),
                pa.timestamp("us"),
            ),
            "arr": pa.array(holes([list(range(i % 4)) for i in ids], 16), pa.list_(pa.int32())),
            "st": pa.array(
                holes([{"a": i, "b": f"x{i % 5}"} for i in ids], 17),
                pa.struct([("a", pa.int32()), ("b", pa.string())]),
            ),
            "m": pa.array(
                holes([[(f"k{i % 3}", i)] for i in ids], 18), pa.map_(pa.string(), pa.int64())
            ),
        }
    )


def part_files(shard: str) -> list[Path]:
    """The part files under ``shard`` (found by their magic)."""
    from persistshard.format.part import MAGIC

    return [
        p for p in sorted(Path(shard).rglob("*")) if p.is_file() and p.read_bytes()[:6] == MAGIC
    ]


def downgrade(path: Path, version: int) -> None:
    """Rewrite a version 3 part with no plain segment as the same part at ``version`` 2 or 1,
    in place and at the same size (the shard's state records part sizes): the version in the
    header, footer and tail; at version 1 the per-column ``stats`` left out of the footer
    (blanks keep its length); the footer's checksum again."""
    import crc32c

    from persistshard.format.part import HEADER, TAIL

    data = bytearray(path.read_bytes())
    length, _, old, magic = TAIL.unpack_from(data, len(data) - TAIL.size)
    start = len(data) - TAIL.size - length
    footer = json.loads(bytes(data[start : start + length]))
    assert old == 3 and footer["version"] == 3, path
    assert all(len(c) == 3 for chunk in footer["chunks"] for c in chunk["columns"]), "plain"
    footer["version"] = version
    if version == 1:
        for chunk in footer["chunks"]:
            chunk.pop("stats", None)
    text = json.dumps(footer, separators=(",", ":"), sort_keys=True).encode()
    assert len(text) <= length, path
    text = text.ljust(length, b" ")
    data[start : start + length] = text
    HEADER.pack_into(data, 0, magic, version)
    TAIL.pack_into(data, len(data) - TAIL.size, length, crc32c.crc32c(text), version, magic)
    path.write_bytes(bytes(data))


def write_shards(work: Path) -> dict[int, str]:
    """One shard per format version under ``work`` (module docstring), by its version."""
    import persistshard as ps
    import persistshard.format.part as part_format

    shards = {}
    for version in VERSIONS:
        path = str(work / f"v{version}")
        kept = part_format.PLAIN_ABOVE
        if version < 3:
            part_format.PLAIN_ABOVE = float("inf")  # no plain segment, as before version 3
        try:
            inline = 16 << 10 if version == 3 else 0
            start = 0
            for i, rows in enumerate(APPENDS):
                table = every_type_table(rows, seed=version * 10 + i)
                table = table.set_column(0, "id", pa.array(range(start, start + rows), pa.int64()))
                start += 1000
                table = table.append_column("_time", pa.array([i] * rows, pa.int64()))
                table = table.append_column("_diff", pa.array([1] * rows, pa.int64()))
                shard = ps.open_shard(
                    path, maintenance=False, inline_bytes=inline, chunk_bytes=4096
                )
                shard.append(table, new_upper=i + 1)
        finally:
            part_format.PLAIN_ABOVE = kept
        for part in part_files(path) if version < 3 else []:
            downgrade(part, version)
        shards[version] = path
    return shards


def census(shard: str) -> dict[str, Any]:
    """The format versions of ``shard``'s part files, how many of their segments are plain and
    compressed, and how many of its parts are inline (not files)."""
    import persistshard as ps
    from persistshard.core.shard import read_state
    from persistshard.format.part import PartReader

    versions, plain, compressed = set(), 0, 0
    for path in part_files(shard):
        reader = PartReader.from_bytes(str(path), path.read_bytes())
        versions.add(reader.version)
        for chunk in reader.chunks:
            plain += sum(s.plain for s in chunk.segments)
            compressed += sum(not s.plain for s in chunk.segments)
    inline = sum(r.inline is not None for r in read_state(ps.open_shard(shard)).parts())
    return {
        "versions": sorted(versions),
        "plain": plain,
        "compressed": compressed,
        "inline": inline,
    }


#: The reads of each shard: options and what is made of the loaded frame (None: the frame).
READS: dict[str, tuple[dict[str, str], Any]] = {
    "snapshot": ({}, None),
    "count": ({}, lambda df: df.groupBy().count()),
    "as_of 0": ({"as_of": "0"}, None),
    "nested columns": ({}, lambda df: df.select("m", "arr", "st", "id")),
    "filtered": ({}, lambda df: df.filter("id >= 1000 OR day = DATE'2024-01-02'")),
    "decimal sums": (
        {},
        lambda df: df.selectExpr("sum(dec)", "min(dec)", "max(wide)", "sum(dec * 3)"),
    ),
}


def answer(make: Any) -> dict[str, Any]:
    """The sorted rows (as text) of the frame ``make()`` returns, or its error's first line."""
    try:
        return {"rows": sorted(repr(tuple(r)) for r in make().collect())}
    except Exception as e:
        return {"error": (str(e).splitlines() or [type(e).__name__])[0]}


def compare(spark: Any, work: Path) -> dict[str, Any]:
    """Writes the shards and reads each of them both ways in ``spark`` (which has the
    companion): per shard its census, per read both answers and the companion's plan."""
    from persistshard.datasource.source import PersistShardDataSource

    class PythonOnly(PersistShardDataSource):
        @classmethod
        def name(cls) -> str:
            return PYTHON_NAME

    spark.dataSource.register(PythonOnly)
    shards = write_shards(work)
    result: dict[str, Any] = {"parts": {}, "cases": {}}
    for version, path in shards.items():
        result["parts"][str(version)] = census(path)
        for label, (options, shape) in READS.items():

            def frame(fmt: str, options: dict[str, str] = options, shape: Any = shape) -> Any:
                df = spark.read.format(fmt).options(**options).load(path)  # noqa: B023
                return df if shape is None else shape(df)

            made: list[Any] = []

            def companion(made: list[Any] = made, frame: Any = frame) -> Any:
                made.append(frame("persistshard"))
                return made[-1]

            case = {"companion": answer(companion)}
            # The plan as it ran: the scan says how many partitions the JVM decoded once planned.
            case["plan"] = made[0]._jdf.queryExecution().executedPlan().toString() if made else ""
            case["python"] = answer(lambda frame=frame: frame(PYTHON_NAME))
            result["cases"][f"version {version}: {label}"] = case
    return result


def main() -> None:
    """The script's side (module docstring): a session of its own with the companion
    (`persistshard.configure_spark` names this interpreter for Spark's Python workers)."""
    from pyspark.sql import SparkSession

    import persistshard as ps

    local = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    spark = ps.configure_spark(local).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = compare(spark, Path(sys.argv[1]))
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result))


def test_every_type_at_every_format_version_reads_as_in_python(
    spark, has_companion_catalog, request, tmp_path
):
    """Each shard holds parts of exactly its version (plain and compressed segments and an
    inline part at version 3, compressed only before); every read through the companion
    equals the Python source's; the JVM decodes every partition of the snapshots of versions
    2 and 3 and none of version 1."""
    if has_companion_catalog:
        result = compare(spark, tmp_path)
    else:
        result = run_session(Path(__file__), tmp_path, request.getfixturevalue("jar_cache"))
    parts = result["parts"]
    assert parts["3"]["versions"] == [3] and parts["3"]["inline"] >= 1
    assert parts["3"]["plain"] > 0 and parts["3"]["compressed"] > 0
    for older in ("2", "1"):
        assert parts[older]["versions"] == [int(older)] and parts[older]["plain"] == 0
        assert parts[older]["compressed"] > 0
    cases = result["cases"]
    assert len(cases) == len(VERSIONS) * len(READS)
    differ = {
        n: (c["companion"], c["python"]) for n, c in cases.items() if c["companion"] != c["python"]
    }
    assert not differ, json.dumps(differ, indent=1)[:5000]
    for version in VERSIONS:
        snapshot = cases[f"version {version}: snapshot"]
        assert len(snapshot["python"]["rows"]) == sum(APPENDS)
        assert len(cases[f"version {version}: as_of 0"]["python"]["rows"]) == APPENDS[0]
        decoded = re.search(r"\((\d+) of (\d+) partitions decoded in the JVM\)", snapshot["plan"])
        assert decoded, snapshot["plan"]
        jvm, total = int(decoded.group(1)), int(decoded.group(2))
        assert total >= 1 and jvm == (total if version > 1 else 0), (version, snapshot["plan"])


if __name__ == "__main__":
    main()

"""Column pruning through a user-given schema (issue 28 item 4).

Spark 4.3 asks a Python source for no required columns, but ``spark.read.schema(...)`` reaches
``reader(schema)``: the read then decodes only those columns' segments (plus the filters'
and ``_time``/``_diff``), returns exactly the projection of the full read (as a multiset; per
distinct projected row with ``_diff``), and refuses a column the shard does not store, another
type, or NOT NULL for a column that holds nulls, naming the stored columns.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.errors import InvalidOption


def _shard(location: str) -> None:
    """id, name (with nulls), value over two times, with retractions and a repeated row."""
    shard = ps.open_shard(location)
    n = 300
    shard.append(
        pa.table(
            {
                "id": pa.array(range(n), pa.int64()),
                "name": [f"n{i % 7}" if i % 11 else None for i in range(n)],
                "value": [i / 4 for i in range(n)],
                "_time": [0] * n,
                "_diff": [1 + (i % 3 == 0) for i in range(n)],
            }
        ),
        new_upper=1,
    )
    shard.append(
        pa.table(
            {
                "id": pa.array(range(0, n, 5), pa.int64()),
                "name": [f"n{i % 7}" if i % 11 else None for i in range(0, n, 5)],
                "value": [i / 4 for i in range(0, n, 5)],
                "_time": [1] * len(range(0, n, 5)),
                "_diff": [-1] * len(range(0, n, 5)),
            }
        ),
        new_upper=2,
    )


def _read(location: str, schema: StructType, **options: str) -> list[tuple[Any, ...]]:
    from persistshard.datasource.reader import PersistShardReader

    reader = PersistShardReader({"path": location, **options}, schema)
    return [
        tuple(r.values())
        for p in reader.partitions()
        for b in reader.read(p)
        for r in b.to_pylist()
    ]


FULL = StructType(
    [
        StructField("id", LongType()),
        StructField("name", StringType()),
        StructField("value", DoubleType()),
    ]
)


def _project(rows: list[tuple[Any, ...]], names: list[str]) -> Counter:
    index = [FULL.names.index(n) for n in names]
    return Counter(tuple(r[i] for i in index) for r in rows)


@pytest.mark.parametrize("names", [["value"], ["name", "id"], ["name"], ["value", "name"]])
def test_a_subset_schema_reads_the_projection_and_decodes_only_its_columns(
    tmp_path: Any, monkeypatch: Any, names: list[str]
) -> None:
    from persistshard.format.part import PartReader

    location = str(tmp_path / "s")
    _shard(location)
    full = _read(location, FULL)
    decoded: set[str] = set()
    original = PartReader._decode_segment

    def spy(self: Any, index: int, column: int, data: Any) -> Any:
        decoded.add(self.schema.field(column).name)
        return original(self, index, column, data)

    monkeypatch.setattr(PartReader, "_decode_segment", spy)
    subset = StructType([FULL[n] for n in names])
    got = _read(location, subset, min_partitions="1")
    assert Counter(got) == _project(full, names)
    assert decoded <= {*names, "_time", "_diff"}
    assert set(names) <= decoded


def test_a_where_on_a_column_outside_the_subset_still_filters(tmp_path: Any) -> None:
    location = str(tmp_path / "s")
    _shard(location)
    full = [r for r in _read(location, FULL) if r[0] < 20]
    got = _read(location, StructType([FULL["name"]]), where="id < 20")
    assert Counter(got) == _project(full, ["name"])


def test_with_diff_sums_per_distinct_projected_row(tmp_path: Any) -> None:
    location = str(tmp_path / "s")
    _shard(location)
    diff = StructField("_diff", LongType(), False)
    full = _read(location, StructType([*FULL.fields, diff]), with_diff="true")
    sums: Counter = Counter()
    for r in full:
        sums[r[1]] += r[3]
    got = _read(location, StructType([FULL["name"], diff]), with_diff="true")
    assert sorted(got, key=repr) == sorted(((k, v) for k, v in sums.items() if v), key=repr)
    # a condition on _diff applies to the rows returned: the projected rows' sums
    big = _read(location, StructType([FULL["name"], diff]), with_diff="true", where="_diff > 44")
    assert sorted(big, key=repr) == sorted(((k, v) for k, v in sums.items() if v > 44), key=repr)
    assert 0 < len(big) < len(got)
    with pytest.raises(InvalidOption, match=r"id is not among the columns of \.schema"):
        _read(
            location,
            StructType([FULL["name"], diff]),
            with_diff="true",
            where="_diff > 44 OR id = 2",
        )


@pytest.mark.parametrize(
    ("field", "says"),
    [
        (StructField("nope", LongType()), "names column nope, which the shard does not have"),
        (StructField("id", StringType()), "gives column id the type string, but the shard"),
        (StructField("name", StringType(), False), "column name holds nulls, but the read"),
    ],
)
def test_a_schema_the_shard_cannot_serve_is_refused(
    tmp_path: Any, field: StructField, says: str
) -> None:
    location = str(tmp_path / "s")
    _shard(location)
    with pytest.raises(InvalidOption, match=says) as info:
        _read(location, StructType([FULL["id"], field]))
    if "does not have" in says or "type" in says:
        assert "its columns are: id bigint, name string, value double" in str(info.value)


def test_spark_reads_a_subset_schema(spark: Any, tmp_path: Any) -> None:
    location = str(tmp_path / "s")
    _shard(location)
    full = spark.read.format("persistshard").load(location)
    want = Counter(tuple(r) for r in full.select("name", "id").collect())
    pruned = spark.read.format("persistshard").schema("name string, id long").load(location)
    assert pruned.columns == ["name", "id"]
    assert Counter(tuple(r) for r in pruned.collect()) == want
    assert pruned.count() == full.count()
    assert pruned.where("id < 3").count() == full.where("id < 3").count()
    bad = spark.read.format("persistshard").schema("id long, price double").load(location)
    with pytest.raises(Exception, match="names column price, which the shard does not have"):
        bad.collect()

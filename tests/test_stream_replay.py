"""A streaming write restarted without its checkpoint never drops rows (issue 36, item 5).

Spark numbers micro-batches from 0 again when the checkpoint is lost. Only the batch id the
shard recorded last can be a replay (Spark writes its commit log entry for batch N after the
sink committed N); a replay is recognised by what identifies the batch (the query id Spark
keeps in the checkpoint, and a digest of the batch's rows), never by its number alone. A lower
id, or the recorded id with other rows from another query, is refused naming the checkpoint.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persistshard as ps
from persistshard.datasource.options import WriteOptions
from persistshard.datasource.sinks import PersistShardStreamWriter
from persistshard.errors import InvalidUpdates


@pytest.fixture
def location(tmp_path) -> str:
    return str(tmp_path / "shard")


SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])


def rows(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": ids, "v": [f"v{i}" for i in ids]})


def commit(location: str, batch_id: int, ids: list[int], *, writer="w", query=None, **extra):
    """One micro-batch as Spark runs it: a write task (on the rows) and the driver's commit."""
    from persistshard.datasource.sinks import stream_task

    opts = {"path": location, "writer_id": writer, "compact": "false", **extra}
    complete = extra.pop("complete", False)
    opts.pop("complete", None)
    msg = stream_task(
        WriteOptions.parse(opts, SCHEMA), SCHEMA, complete, [rows(ids)], batch_id, query
    )
    PersistShardStreamWriter(opts, SCHEMA, complete).commit([msg], batch_id)


def ids_of(shard: ps.Shard) -> Counter:
    return Counter({r["id"]: r["_diff"] for r in shard.snapshot().to_pylist()})


# --- the digest -----------------------------------------------------------------------------


def table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3, None, 5, 2], pa.int64()),
            "s": pa.array(["a", "", None, "abcdefghijkl", "é", "a"]),
            "f": pa.array([0.5, None, -1.0, 2.0, 3.0, 0.5]),
            "b": pa.array([True, False, None, True, False, True]),
            "l": pa.array([[1, 2], [], None, [3], [2, 1], [1, 2]], pa.list_(pa.int32())),
            "st": pa.array(
                [
                    {"x": 1, "y": "p"},
                    None,
                    {"x": None, "y": "q"},
                    {"x": 2, "y": None},
                    {"x": 1, "y": "p"},
                    {"x": 1, "y": "p"},
                ]
            ),
            "bin": pa.array([b"\x00", b"\x00\x00", None, b"", b"xyz", b"\x00"]),
            "d": pa.array([1, 2, 3, 4, 5, 1], pa.date32()),
            "dec": pa.array(
                [Decimal(x) if x else None for x in ("1.50", "-2", "", "0", "9.99", "1.50")],
                pa.decimal128(10, 2),
            ),
            "ls": pa.array([["ab", "c"], ["abc"], [], None, ["c", "ab"], ["ab", "c"]]),
            "m": pa.array(
                [[("k", 1)], [], None, [("k", 2), ("j", 1)], [("j", 1)], [("k", 1)]],
                pa.map_(pa.string(), pa.int32()),
            ),
            "ts": pa.array([10, 20, None, 40, 50, 10], pa.timestamp("us", tz="UTC")),
            "big": pa.array(["x" * 20, "y", None, "", "x" * 19, "x" * 20], pa.large_string()),
            "fsb": pa.array([b"ab", b"ba", None, b"aa", b"bb", b"ab"], pa.binary(2)),
            "_diff": pa.array([1, 1, 2, -1, 1, 1], pa.int64()),
        }
    )


def test_digest_ignores_partitioning_and_row_order():
    from persistshard.datasource import replay

    t = table()
    whole = replay.Digest.of_batches(t.to_batches())
    order = list(range(t.num_rows))
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(order)
        shuffled = t.take(order)
        cut = rng.randrange(1, t.num_rows)
        parts = [shuffled.slice(0, cut), shuffled.slice(cut)]
        tasks = [replay.Digest.of_batches(p.to_batches(max_chunksize=2)) for p in parts]
        assert sum(tasks, replay.Digest()) == whole
    assert whole.rows == t.num_rows
    # Sliced arrays (offsets inside a shared buffer) hash as their values.
    assert replay.Digest.of_batches([t.slice(1).combine_chunks().to_batches()[0]]) == (
        replay.Digest.of_batches(
            pa.Table.from_pylist(t.slice(1).to_pylist(), t.schema).to_batches()
        )
    )


def test_digest_sees_a_changed_row_or_a_changed_multiplicity():
    from persistshard.datasource import replay

    t = table()
    base = replay.Digest.of_batches(t.to_batches())
    for column in t.column_names:
        values = t.column(column).to_pylist()
        for i in range(t.num_rows):
            other = [v for v in values]
            # Swap this row's value with another row's distinct value, or null it.
            j = next((k for k in range(t.num_rows) if values[k] != values[i]), None)
            other[i] = values[j] if j is not None else None
            changed = t.set_column(
                t.column_names.index(column), column, pa.array(other, t.schema.field(column).type)
            )
            assert replay.Digest.of_batches(changed.to_batches()) != base, (column, i)
    # One row twice instead of another row once: same count, another digest.
    twice = t.take([0, 0, 2, 3, 4, 5])
    assert replay.Digest.of_batches(twice.to_batches()) != base
    # Moving a value between columns of one row changes it (columns are positional).
    swapped = pa.table({"a": [1, 2], "b": [2, 1]})
    assert replay.Digest.of_batches(swapped.to_batches()) != replay.Digest.of_batches(
        pa.table({"a": [2, 1], "b": [2, 1]}).to_batches()
    )
    # Strings: byte order and boundaries matter.
    assert replay.Digest.of_batches(pa.table({"s": ["ab", "c"]}).to_batches()) != (
        replay.Digest.of_batches(pa.table({"s": ["a", "bc"]}).to_batches())
    )
    assert replay.Digest.of_batches(pa.table({"s": ["ab"]}).to_batches()) != (
        replay.Digest.of_batches(pa.table({"s": ["ba"]}).to_batches())
    )


def test_digest_text_round_trips():
    from persistshard.datasource import replay

    d = replay.Digest.of_batches(table().to_batches())
    assert replay.Digest.parse(d.text()) == d
    assert replay.Digest.parse("v0:1:2") is None  # another version of the hash: unknown


# --- the commit rule (the driver's side, simulated) ------------------------------------------


def test_lower_batch_id_after_the_checkpoint_was_lost_is_refused(location):
    """The reproduction: batch ids 0 and 1 committed, then batch 0 again with new rows
    (Spark after the checkpoint was deleted). It used to be dropped as a replay."""
    commit(location, 0, [1, 2])
    commit(location, 1, [3])
    shard = ps.open_shard(location)
    version = shard.inspect.state().version
    with pytest.raises(InvalidUpdates, match="checkpoint") as e:
        commit(location, 0, [4, 5])
    assert "writer_id" in str(e.value)  # says how to start over on purpose
    assert shard.inspect.state().version == version
    assert ids_of(shard) == Counter({1: 1, 2: 1, 3: 1})
    assert {m.key for m in shard._blob.list("parts/")} == shard.inspect.state().stored_part_keys()


def test_recorded_batch_id_is_a_replay_only_with_the_same_rows(location):
    commit(location, 0, [1])
    commit(location, 1, [2, 3])
    shard = ps.open_shard(location)
    version = shard.inspect.state().version
    commit(location, 1, [3, 2])  # a genuine replay (rows in another order): a no-op
    assert shard.inspect.state().version == version
    with pytest.raises(InvalidUpdates, match="checkpoint"):
        commit(location, 1, [2, 4])  # same id, other rows: a lost checkpoint
    assert shard.inspect.state().version == version
    assert ids_of(shard) == Counter({1: 1, 2: 1, 3: 1})
    assert {m.key for m in shard._blob.list("parts/")} == shard.inspect.state().stored_part_keys()
    commit(location, 2, [4])
    assert ids_of(shard) == Counter({1: 1, 2: 1, 3: 1, 4: 1})


def test_same_query_replay_is_a_no_op_even_with_other_rows(location):
    """Spark re-runs batch N of the same query (same checkpoint: same query id) over the same
    offsets; a nondeterministic query may give other rows, still the batch Spark committed."""
    commit(location, 0, [1], query="q-1")
    version = ps.open_shard(location).inspect.state().version
    commit(location, 0, [9], query="q-1")
    assert ps.open_shard(location).inspect.state().version == version
    with pytest.raises(InvalidUpdates, match="checkpoint"):
        commit(location, 0, [9], query="q-2")  # another checkpoint, other rows


def test_a_new_writer_id_starts_over_and_drops_nothing(location):
    commit(location, 0, [1])
    commit(location, 1, [2])
    commit(location, 0, [3], writer="w-2")
    commit(location, 1, [4], writer="w-2")
    assert ids_of(ps.open_shard(location)) == Counter({1: 1, 2: 1, 3: 1, 4: 1})


def test_state_without_a_digest_keeps_equal_ids_as_replays(location):
    """A record written before digests existed: the equal id stays a replay, a lower one is
    refused."""
    from persistshard.datasource.writer import StreamTaskWritten, describe_write, write_task

    opts = {"path": location, "writer_id": "w", "compact": "false"}
    shard = ps.open_shard(location)

    def old_commit(batch_id: int, ids: list[int]) -> None:  # what the old tasks sent
        d = describe_write(WriteOptions.parse(opts, SCHEMA), SCHEMA, False, shard)
        out = write_task(d, [rows(ids)], d.lower)
        msg = StreamTaskWritten(
            out.sealed, out.unsealed, out.max_time, out.rows_in, d.lower, d.write_id
        )
        PersistShardStreamWriter(opts, SCHEMA, False).commit([msg], batch_id)

    old_commit(0, [1])
    old_commit(1, [2])
    version = shard.inspect.state().version
    commit(location, 1, [7])  # equal id, nothing to compare with: a replay
    assert shard.inspect.state().version == version
    with pytest.raises(InvalidUpdates, match="checkpoint"):
        commit(location, 0, [8])


def test_complete_mode_follows_the_same_rule(location):
    commit(location, 0, [1, 2], complete=True)
    commit(location, 1, [1, 2, 3], complete=True)
    shard = ps.open_shard(location)
    version = shard.inspect.state().version
    commit(location, 1, [3, 1, 2], complete=True)
    assert shard.inspect.state().version == version
    with pytest.raises(InvalidUpdates, match="checkpoint"):
        commit(location, 0, [5], complete=True)
    with pytest.raises(InvalidUpdates, match="checkpoint"):
        commit(location, 1, [5], complete=True)
    assert shard.inspect.state().version == version
    assert ids_of(shard) == Counter({1: 1, 2: 1, 3: 1})


def test_streaming_upserts_follow_the_same_rule(location):
    from persistshard.datasource.upsert import UpsertStreamWriter, upsert_stream_task

    opts = {"path": location, "writer_id": "u", "key_columns": "id", "compact": "false"}

    def up(batch_id: int, ids: list[int], query=None) -> None:
        msg = upsert_stream_task(opts, SCHEMA, [rows(ids)], batch_id, query)
        UpsertStreamWriter(opts, SCHEMA, False).commit([msg], batch_id)

    up(0, [1, 2])
    up(1, [3])
    shard = ps.open_shard(location)
    version = shard.inspect.state().version
    up(1, [3])
    assert shard.inspect.state().version == version
    for batch_id, ids in ((0, [4]), (1, [4])):
        with pytest.raises(InvalidUpdates, match="checkpoint"):
            up(batch_id, ids)
    assert shard.inspect.state().version == version
    assert ids_of(shard) == Counter({1: 1, 2: 1, 3: 1})


# --- a real stream ---------------------------------------------------------------------------


@pytest.mark.spark
def test_stream_restarted_without_checkpoint_never_drops_rows(spark, tmp_path):
    """Two micro-batches committed; the checkpoint is deleted; the query restarts after the
    offsets it had written, on two new records. Before: Spark's batch 0 was dropped as a
    replay and the query succeeded. Now it fails naming the checkpoint and writes nothing;
    restarted with a new writer_id (the documented way to start over), the new rows land
    exactly once."""
    from persistshard.conformance.logsource import PartitionedLogSource, append_records

    spark.dataSource.register(PartitionedLogSource)
    src, out, chk = tmp_path / "src", str(tmp_path / "out"), tmp_path / "chk"
    append_records(str(src), "t", 0, [f"r{i}" for i in range(4)])

    def run(starting: str, writer: str) -> Exception | None:
        q = (
            spark.readStream.format("partitioned_log")
            .option("startingOffsets", starting)
            .option("maxRecordsPerPartition", 2)
            .load(str(src))
            .selectExpr("offset", "CAST(value AS STRING) AS v")
            .writeStream.format("persistshard")
            .option("writer_id", writer)
            .option("checkpointLocation", str(chk))
            .trigger(availableNow=True)
            .start(out)
        )
        try:
            q.awaitTermination(180)
        except Exception as e:  # a failed query raises here
            return e
        return q.exception()

    assert run("earliest", "ingest") is None
    shard = ps.open_shard(out)
    assert shard.inspect.state().writers["ingest"] == 1
    assert (
        shard.inspect.state().writer_batches["ingest"].query_id
    )  # Spark's query id reached the sink
    shutil.rmtree(chk)
    append_records(str(src), "t", 0, ["r4", "r5"])
    error = run('{"t:0": 4}', "ingest")
    assert error is not None and "checkpoint" in str(error), error
    assert sorted(r["v"] for r in shard.snapshot().to_pylist()) == [f"r{i}" for i in range(4)]
    shutil.rmtree(chk, ignore_errors=True)
    assert run('{"t:0": 4}', "ingest-2") is None
    got = Counter(r["v"] for r in shard.snapshot().to_pylist() for _ in range(r["_diff"]))
    assert got == Counter(f"r{i}" for i in range(6))


# --- the record in the state (the compare-and-set's own check) -------------------------------


def test_state_records_the_identity_and_judges_at_the_compare_and_set(location, clock):
    """The sink's check before the commit can race; the state machine applies the same rule,
    so a commit that raced a lost checkpoint is refused there, and a raced replay is a no-op.
    The record is additive: a state without identities encodes and decodes as before."""
    from conformance_helpers import updates

    from persistshard.core.statemachine import state as st
    from persistshard.core.statemachine.commits import apply
    from persistshard.core.statemachine.commits.append import Append
    from persistshard.errors import WriterAlreadyCommitted

    shard = ps.open_shard(location, clock=clock.now)
    first = st.BatchIdentity(digest="v1:1:00000000000000aa", query_id="q-1")

    def append(writer) -> None:
        t = shard.upper
        shard.compare_and_append(updates([(t, "x", t, 1)]), t, t + 1, writer=writer)

    def attempt(writer):
        state = shard.inspect.state()
        batch = st.Batch("b", state.upper, state.upper + 1, ())
        return apply(state, Append(state.upper, state.upper + 1, batch, writer=writer, id="c"))

    append(("plain", 0))
    assert "writer_batches" not in shard.inspect.state().to_json()  # encoded as before identities
    append(st.WriterBatch("w", 0, first))
    state = shard.inspect.state()
    assert state.writer_batches == {"w": first}
    assert st.ShardState.from_json(state.to_json()).writer_batches == {"w": first}
    old = state.to_json()
    del old["writer_batches"]  # a state stored before this change
    assert st.ShardState.from_json(old).writer_batches == {}

    for same in (
        st.WriterBatch("w", 0, first),  # the same batch again
        st.WriterBatch("w", 0, st.BatchIdentity(digest="v1:2:01", query_id="q-1")),  # same query
        st.WriterBatch("w", 0, st.BatchIdentity(digest=first.digest, query_id="q-2")),  # rows
        ("w", 0),  # a caller that does not know the identity
    ):
        with pytest.raises(WriterAlreadyCommitted):
            attempt(same)
    other = st.BatchIdentity(digest="v1:1:00000000000000bb", query_id="q-2")
    with pytest.raises(InvalidUpdates, match="restarted without its checkpoint"):
        attempt(st.WriterBatch("w", 0, other))
    version = shard.inspect.state().version
    with pytest.raises(InvalidUpdates, match="checkpoint"):
        append(st.WriterBatch("w", 0, other))  # through the shard: refused, nothing applied
    assert shard.inspect.state().version == version
    append(("w", 1))  # a batch of unknown identity: the old identity goes with the old batch
    assert "w" not in shard.inspect.state().writer_batches
    with pytest.raises(InvalidUpdates, match="below the last one it committed"):
        attempt(("w", 0))
    # Records expire with their identities (the state check refuses an orphaned identity).
    append(st.WriterBatch("w", 2, first))
    clock.ms += st.WRITER_RECORD_MS + 1
    for _ in range(st.PRUNE_EVERY):
        shard.append(updates([(9, "plain", shard.upper, 1)]))
    assert shard.inspect.state().writers == {} and shard.inspect.state().writer_batches == {}

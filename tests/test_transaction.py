"""The write protocol (`persistshard.core.write.transaction.WriteTransaction`): a refused
commit leaves the shard as it was and deletes what it wrote; an outcome that stays unknown
keeps every part; parts written elsewhere are checked before anything names them; a sweep never
deletes what a commit may have named."""

from __future__ import annotations

import pyarrow as pa
import pytest

from persistshard.core.shard import Shard, write_transaction
from persistshard.core.storage.consensus import MemoryConsensus
from persistshard.errors import CorruptData, Indeterminate, UpperMismatch


def rows(ids: list[int], time: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "_time": pa.array([time] * len(ids), pa.int64()),
            "_diff": pa.array([1] * len(ids), pa.int64()),
        }
    )


def stored(shard: Shard, write_id: str) -> set[str]:
    return {m.key for m in shard._blob.list(f"parts/{write_id}/")}


class BreakingConsensus(MemoryConsensus):
    """A consensus that, once ``broken``, fails every request with a timeout: a commit's
    compare-and-set, and every read that could tell whether it landed."""

    broken = False

    def _fail(self) -> None:
        if self.broken:
            raise TimeoutError("the consensus stopped answering")

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        self._fail()
        return super().compare_and_set(expected, data)

    def head(self):  # type: ignore[no-untyped-def]
        self._fail()
        return super().head()

    def scan(self, from_version: int, limit: int | None = None):  # type: ignore[no-untyped-def]
        self._fail()
        return super().scan(from_version, limit)


@pytest.fixture
def shard(tmp_path) -> Shard:
    out = Shard(str(tmp_path / "s"), inline_bytes=0, maintenance=False)
    out.compare_and_append(rows([1, 2], 0), 0, 1)
    return out


def test_a_refused_commit_deletes_its_parts_and_changes_nothing(shard):
    before = shard.inspect.state()
    with write_transaction(shard) as txn:
        written = txn.write_updates(rows([3], 0), lower=0, new_upper=1, schema=before.schema)
        assert stored(shard, txn.write_id) == set(written.stored_keys()) != set()
        with pytest.raises(UpperMismatch):  # the upper is 1, not 0
            txn.commit(written, expected_upper=0, new_upper=1, schema=before.schema)
    assert stored(shard, txn.write_id) == set()
    assert shard.inspect.state().version == before.version


def test_an_unknown_outcome_keeps_every_part(tmp_path):
    consensus = BreakingConsensus()
    shard = Shard(str(tmp_path / "s"), consensus=consensus, inline_bytes=0, maintenance=False)
    shard.compare_and_append(rows([1], 0), 0, 1)
    schema = shard.schema
    txn = write_transaction(shard)
    written = txn.write_updates(rows([2], 1), lower=1, new_upper=2, schema=schema)
    consensus.broken = True
    with pytest.raises(Indeterminate):
        txn.commit(written, expected_upper=1, new_upper=2, schema=schema)
    # The commit may have landed: nothing of it is deleted, not even by the write's sweep
    # when it keeps what the commit names.
    txn.sweep_write(txn.write_id, written.keys())
    assert stored(shard, txn.write_id) == set(written.stored_keys()) != set()


def test_parts_written_elsewhere_are_checked_and_nothing_is_deleted(shard):
    elsewhere = write_transaction(shard)  # as a Spark task would, under the driver's id
    written = elsewhere.write_updates(rows([3, 4], 1), lower=1, new_upper=2, schema=shard.schema)
    written.extend(elsewhere.write_updates(rows([5], 1), lower=1, new_upper=2, schema=None))
    lost = written.sealed[0].key
    shard._blob.delete(lost)
    before = shard.inspect.state()
    with pytest.raises(CorruptData, match="missing"):
        write_transaction(shard).commit(
            written, expected_upper=1, new_upper=2, schema=before.schema, check=True
        )
    assert shard.inspect.state().version == before.version
    assert stored(shard, elsewhere.write_id) == set(written.stored_keys()) - {lost}
    shard._blob.put(lost, b"")  # present again, but not with its recorded size
    with pytest.raises(CorruptData):
        shard.commit_checked(written, expected_upper=1, new_upper=2, schema=before.schema)
    assert shard.inspect.state().version == before.version


def test_a_sweep_deletes_only_what_nothing_will_name(shard):
    txn = write_transaction(shard)
    kept = txn.write_updates(rows([3], 1), lower=1, new_upper=2, schema=shard.schema)
    stray = txn.write_updates(rows([4], 1), lower=1, new_upper=2, schema=shard.schema)
    txn.commit(kept, expected_upper=1, new_upper=2, schema=shard.schema)
    assert txn.sweep_write(txn.write_id, kept.keys()) == len(stray.stored_keys())
    assert stored(shard, txn.write_id) == set(kept.stored_keys())
    # Deleting by name never takes a part the state names either.
    txn.delete(kept.stored_keys())
    assert stored(shard, txn.write_id) == set(kept.stored_keys())
    assert sorted(shard.snapshot().column("id").to_pylist()) == [1, 2, 3]


def test_the_python_api_commits_through_one_write(shard):
    """An append names only the parts of its own write id, under its commit id."""
    state = shard.append(pa.table({"id": pa.array([7], pa.int64())}))
    batch = state.trace[-1]
    write_ids = {p.key.split("/")[1] for p in batch.parts}
    assert len(write_ids) == 1 and batch.id == f"{write_ids.pop()}-t"


def test_self_correct_writes_only_the_difference_and_deletes_the_staged_rows(shard):
    state = shard.inspect.state()
    staged_txn = write_transaction(shard)
    staged = staged_txn.write_updates(rows([2, 3], 1), lower=1, new_upper=2, schema=state.schema)
    txn = write_transaction(shard)
    delta = txn.self_correct(staged, time=1, state=state)
    assert stored(shard, staged_txn.write_id) == set()
    txn.commit(delta, expected_upper=1, new_upper=2, schema=state.schema)
    assert sorted(shard.snapshot().column("id").to_pylist()) == [2, 3]
    changes = shard.updates(1, 2)
    assert sorted(zip(changes["id"].to_pylist(), changes["_diff"].to_pylist(), strict=True)) == [
        (1, -1),
        (3, 1),
    ]

"""Damage to any stored file of a shard: each damaged copy reads exactly as before or fails
with `CorruptData` naming the file, never a different answer and never a retryable error.

The sweep covers every file of a small shard: data parts, consensus entries, the rollup and
the HEAD hint. Bytes are flipped at sampled positions (every header byte of the metadata
objects, then spread over the rest, a new seed each run; the part format has its own sweep in
tests/test_format_corruption.py) and files are truncated at sampled lengths.
"""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest
from conformance_helpers import rows_of, updates

import persistshard as ps
from persistshard.core.statemachine.encoding import Entry, decode_rollup, encode_rollup, fold
from persistshard.core.statemachine.machine import SHARED_STATES
from persistshard.core.storage.layout import ROLLUP_EVERY

#: Positions sampled per file: in the header line of a metadata object, and anywhere.
HEADER_SAMPLES = 6
SAMPLES = 4


def build(location: str) -> ps.Shard:
    """A shard with a rollup, entries before and after it, compacted and gc'd parts, a since
    and an unsealed batch."""
    shard = ps.open_shard(location)
    for t in range(ROLLUP_EVERY + 3):
        shard.append(updates([(t % 5, f"r{t % 3}", t, 1), (100 + t, "x", t, 1)]))
        if t == ROLLUP_EVERY // 2:
            shard.compact()
    shard.compare_and_append(updates([(7, "late", 50, 1)]), shard.upper, shard.upper + 1)
    shard.advance_since(4)
    return shard


def answers(location: str) -> tuple:
    """Everything a reader can ask, through a fresh handle, as a fresh process would (the
    states this process shared between handles forgotten: damage behind a state held in
    memory is not read)."""
    SHARED_STATES.clear()
    shard = ps.open_shard(location)
    state = shard.inspect.state()
    snaps = tuple(
        tuple(sorted(rows_of(shard.snapshot(t)).items())) for t in (state.since, state.upper - 1)
    )
    later = shard.updates(state.since + 1, state.upper).to_pylist()
    return state.upper, state.since, snaps, later, state.schema


def positions(size: int, header: int, rng: random.Random) -> list[int]:
    head = rng.sample(range(min(size, header)), min(size, header, HEADER_SAMPLES))
    rest = [rng.randrange(size) for _ in range(SAMPLES)] if size else []
    return sorted(set(head + rest + ([size - 1] if size else [])))


def check_damaged(location: str, key: str, expected: tuple, what: str) -> str:
    """'same' or 'corrupt'; fails the test on a different answer or another error."""
    try:
        got = answers(location)
    except ps.CorruptData as e:
        assert key in str(e), f"{what}: CorruptData does not name {key}: {e}"
        if not key.startswith("parts/"):
            assert location in str(e), f"{what}: CorruptData does not name the shard: {e}"
        return "corrupt"
    except Exception as e:
        pytest.fail(f"{what}: {type(e).__name__} instead of CorruptData or the same answer: {e}")
    assert got == expected, f"{what}: a different answer"
    return "same"


def test_every_file_flipped_or_truncated_reads_the_same_or_is_corrupt(tmp_path):
    location = str(tmp_path / "shard")
    build(location)
    expected = answers(location)
    root = tmp_path / "shard"
    files = sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".tmp-" not in p.name
    )
    kinds = {f.split("/")[0] for f in files}
    assert {"parts", "consensus", "rollups"} <= kinds and "consensus/HEAD" in files
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    outcomes: dict[str, set[str]] = {}
    for key in files:
        path = root / key
        original = path.read_bytes()
        header = 0 if key.startswith("parts/") else original.find(b"\n") + 1
        trials: list[tuple[str, bytes]] = []
        for pos in positions(len(original), header, rng):
            mask = 0x01 if pos % 2 else 0xFF
            damaged = bytearray(original)
            damaged[pos] ^= mask
            trials.append((f"{key} byte {pos} ^ {mask:#x} (seed {seed})", bytes(damaged)))
        for length in sorted({0, len(original) // 2, max(len(original) - 1, 0)}):
            if length < len(original):
                trials.append((f"{key} truncated to {length}", original[:length]))
        trials.append((f"{key} with a byte appended", original + b"\x00"))
        try:
            for what, data in trials:
                path.write_bytes(data)
                outcome = check_damaged(location, key, expected, what)
                outcomes.setdefault(key.split("/")[0], set()).add(outcome)
        finally:
            path.write_bytes(original)
    assert answers(location) == expected
    # Damage that is read is caught in every kind of file the reads touch.
    assert "corrupt" in outcomes["parts"]
    assert "corrupt" in outcomes["consensus"]
    assert "corrupt" in outcomes["rollups"]


def test_a_flipped_upper_in_the_head_entry_is_corrupt_not_fewer_rows(tmp_path):
    """The reported case: a batch upper 5 -> 4 in a consensus entry once made rows vanish."""
    location = str(tmp_path / "shard")
    shard = ps.open_shard(location)
    for t in range(5):
        shard.append(updates([(t, "a", t, 1)]))
    head = tmp_path / "shard" / "consensus" / f"v{5:020d}.json"
    raw = head.read_bytes()
    assert b'"new_upper":5' in raw
    head.write_bytes(raw.replace(b'"new_upper":5', b'"new_upper":4'))
    with pytest.raises(ps.CorruptData, match=r"^CorruptData: consensus entry is damaged") as e:
        ps.open_shard(location).snapshot()
    assert f"v{5:020d}.json" in str(e.value) and location in str(e.value)


def test_an_inconsistent_log_is_corrupt_not_upper_mismatch(tmp_path):
    """A log whose commits no longer chain (checksums intact) is damaged, not a lost race."""
    location = str(tmp_path / "shard")
    shard = ps.open_shard(location)
    for t in range(3):
        shard.append(updates([(t, "a", t, 1)]))
    entries = [Entry.decode(e.data) for e in shard._consensus.scan(1)]
    with pytest.raises(ps.CorruptData, match=r"^CorruptData: replaying the log.*version 3"):
        fold(
            ps.core.statemachine.state.ShardState(),
            [entries[0].commit, entries[1].commit, entries[1].commit],
        )


def test_a_rollup_breaking_an_invariant_is_corrupt(tmp_path):
    from dataclasses import replace

    state = ps.core.statemachine.state.ShardState(version=3, upper=2, since=5)
    with pytest.raises(ps.CorruptData, match=r"since 5 and upper 2 out of order.*file r1"):
        decode_rollup(encode_rollup(state), "r1")
    good = replace(state, since=1)
    assert decode_rollup(encode_rollup(good), "r1") == good


def test_a_missing_part_is_corrupt_data_naming_it(tmp_path):
    location = str(tmp_path / "shard")
    shard = ps.open_shard(location, inline_bytes=0)  # a part file to remove
    shard.append(pa.table({"id": [1, 2], "_time": [0, 0], "_diff": [1, 1]}))
    key = shard.inspect.state().trace[0].parts[0].key
    os.remove(tmp_path / "shard" / key)
    with pytest.raises(ps.CorruptData, match=r"^CorruptData: part .* missing") as e:
        ps.open_shard(location).snapshot()
    assert key in str(e.value) and location in str(e.value)
    assert e.value.file == key


def test_verify_reports_a_damaged_old_log_entry(tmp_path):
    """Reads only touch the entries after the newest rollup; verify checks every retained one."""
    location = str(tmp_path / "shard")
    shard = ps.open_shard(location)
    for t in range(ROLLUP_EVERY + 2):
        shard.append(updates([(t, "a", t, 1)]))
    old = tmp_path / "shard" / "consensus" / f"v{2:020d}.json"
    raw = bytearray(old.read_bytes())
    raw[-3] ^= 0x01
    old.write_bytes(bytes(raw))
    fresh = ps.open_shard(location)
    assert fresh.upper == ROLLUP_EVERY + 2  # reads do not need it
    report = fresh.verify()
    assert not report.ok and any(f"v{2:020d}.json" in p for p in report.problems)


def test_consensus_implementations_declare_sharing(tmp_path):
    from persistshard.core.storage.blob import open_blob
    from persistshard.core.storage.consensus import BlobConsensus, MemoryConsensus

    assert BlobConsensus(open_blob(str(tmp_path))).shared
    assert not BlobConsensus(open_blob("memory://declare/x")).shared
    assert not MemoryConsensus().shared
    blob = open_blob(str(tmp_path))
    assert blob.capabilities.atomic_create and blob.capabilities.shared
    assert not open_blob("memory://declare/y").capabilities.shared
    from persistshard.core.storage.blob import Blob, FsspecBlob

    assert type(Blob(str(tmp_path))) is FsspecBlob  # the interface builds the default

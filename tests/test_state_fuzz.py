"""States are checked before every compare-and-set and on every read (issue 25, item 3).

A commit whose new state breaks an invariant (a part key outside the shard or aliasing
another, counts that do not add up, an unsealed update below the seal) is refused with
`InvalidUpdates` before anything is written; a state that is already stored that way (written
by an older or hostile writer) reads as `CorruptData`, never as another shard's rows, and gc
deletes nothing through it. Hypothesis mutates real states and commits (keys, bounds,
counts) and checks each outcome against an oracle written independently of the code.
"""

from __future__ import annotations

import base64
import json
import posixpath
from dataclasses import replace
from typing import Any

import pytest
from conformance_helpers import examples, rows_of, updates
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import persistshard as ps
from persistshard.core.statemachine import encoding
from persistshard.core.statemachine import state as st
from persistshard.core.statemachine.commits import Commit
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.encoding import Entry
from persistshard.core.statemachine.state import Batch, PartRef
from persistshard.core.storage.layout import new_id
from persistshard.errors import CorruptData, InvalidUpdates, PersistShardError

BAD_KEYS = [
    "parts/w/./p.part",
    "parts/w/../w/p.part",
    "parts/../../other/parts/w/p.part",
    "/etc/passwd",
    "s3://bucket/shard/parts/w/p.part",
    "file:parts/w/p.part",
    "parts//w/p.part",
    "parts/w/",
    "parts/",
    "rollups/v1.json",
    "consensus/v00000000000000000001.json",
    "parts/w\\..\\p.part",
    "parts/w/p.part\x00",
    "",
]


def files(shard: ps.Shard) -> dict[str, bytes | None]:
    return {m.key: shard._blob.get(m.key) for m in shard._blob.list("")}


def small_shard(location: str, *, inline: bool = False) -> ps.Shard:
    """Two appends; their parts are files (the forged commits here copy a live part's record
    under other keys) unless ``inline`` (the production default: the parts travel inline)."""
    shard = ps.open_shard(location, inline_bytes=None if inline else 0)
    shard.append(updates([(1, "a", 0, 1), (2, "b", 0, 1)]))
    shard.append(updates([(3, "c", 1, 1)]))
    return shard


def forged_append(shard: ps.Shard, part: PartRef, unsealed: Batch | None = None) -> Commit:
    upper = shard.upper
    batch = Batch(new_id(), upper, upper + 1, (part,))
    return Append(upper, upper + 1, batch, unsealed, id=new_id())


def a_live_part(shard: ps.Shard) -> PartRef:
    return shard.inspect.state().parts()[0]


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_a_commit_with_a_bad_part_key_is_refused_and_changes_nothing(tmp_path, bad):
    shard = small_shard(str(tmp_path / "s"))
    before, state = files(shard), shard.inspect.state()
    part = replace(a_live_part(shard), key=bad, min_time=state.upper, max_time=state.upper)
    with pytest.raises(InvalidUpdates, match="refused before it is written"):
        shard._machine.commit(forged_append(shard, part))
    assert files(shard) == before
    assert ps.open_shard(shard.location).inspect.state() == state


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"size": -1}, "size"),
        ({"num_rows": -3}, "rows"),
        ({"size": 0}, "0 bytes"),
        ({"max_time": "upper - 1"}, "min time"),
        ({"max_time": 10**6}, "beyond its batch"),
        ({"num_rows": True}, "rows"),
        ({"rewrite_time": 1}, "rewritten"),
    ],
)
def test_a_commit_with_inconsistent_counts_is_refused(tmp_path, change, why):
    shard = small_shard(str(tmp_path / "s"))
    before = files(shard)
    upper = shard.upper
    part = replace(a_live_part(shard), min_time=upper, max_time=upper)
    change = {k: upper - 1 if v == "upper - 1" else v for k, v in change.items()}
    part = replace(part, key=f"parts/{new_id()}/p.part", **change)
    with pytest.raises(InvalidUpdates, match=why):
        shard._machine.commit(forged_append(shard, part))
    assert files(shard) == before


def test_an_unsealed_batch_below_the_new_upper_is_refused(tmp_path):
    """Unsealed updates below the seal would change snapshots that are already readable."""
    shard = small_shard(str(tmp_path / "s"))
    before, snapshot = files(shard), rows_of(shard.snapshot())
    upper = shard.upper
    live = a_live_part(shard)
    part = replace(live, key=f"parts/{new_id()}/a.part", min_time=upper, max_time=upper)
    hidden = replace(live, key=f"parts/{new_id()}/u.part", min_time=0, max_time=0)
    unsealed = Batch(new_id(), 0, 1, (hidden,))
    with pytest.raises(InvalidUpdates, match="below the new upper"):
        shard._machine.commit(forged_append(shard, part, unsealed))
    assert files(shard) == before
    assert rows_of(ps.open_shard(shard.location).snapshot()) == snapshot


def forge_entry(shard: ps.Shard, commit: Commit | dict[str, Any]) -> None:
    """Append ``commit`` (or a commit's stored JSON, which may be no commit at all) to the log
    without any check (an old or hostile writer)."""
    head = shard._consensus.head()
    assert head is not None
    entry = Entry.decode(head.data)
    d = commit.to_json() if isinstance(commit, Commit) else commit
    body = {
        "commit": {**d, "at_ms": entry.at_ms},
        "rollup": {"version": entry.rollup_version, "key": entry.rollup_key},
        "at_ms": None,
    }
    forged = encoding.seal(encoding.ENTRY_MAGIC, json.dumps(body, separators=(",", ":")).encode())
    assert shard._consensus.compare_and_set(head.version, forged)


def test_an_aliased_key_in_a_stored_state_is_corrupt_and_gc_deletes_nothing(tmp_path):
    """The reported bug: ``parts/w/./p.part`` made gc delete the live part ``parts/w/p.part``."""
    shard = small_shard(str(tmp_path / "s"))
    live = a_live_part(shard)
    write_id, name = live.key.split("/")[1:]
    alias = replace(live, key=f"parts/{write_id}/./{name}", min_time=2, max_time=2)
    # The forged batch replaces nothing, so the state references both names of one file...
    forge_entry(shard, forged_append(shard, alias))
    before = files(shard)
    fresh = ps.open_shard(shard.location)
    with pytest.raises(CorruptData, match=r"'\.'"):
        fresh.snapshot()
    with pytest.raises(CorruptData):
        fresh.gc(dry_run=False, now_ms=2**45)
    assert files(fresh) == before


def test_a_key_into_another_shard_is_corrupt_not_its_rows(tmp_path):
    """``..`` in a key once read (and verified) another shard's part."""
    other = ps.open_shard(str(tmp_path / "other"), inline_bytes=0)
    other.append(updates([(7, "secret", 0, 1)]))
    theirs = a_live_part(other)
    shard = small_shard(str(tmp_path / "s"))
    stolen = replace(theirs, key=f"parts/../../other/{theirs.key}", min_time=2, max_time=2)
    forge_entry(shard, forged_append(shard, stolen))
    fresh = ps.open_shard(shard.location)
    with pytest.raises(CorruptData, match=r"'\.\.'"):
        fresh.snapshot()
    with pytest.raises(CorruptData):
        fresh.verify()


# --- fuzz -------------------------------------------------------------------------------


def oracle_ok(d: dict[str, Any]) -> bool:
    """An independent reading of the invariants of a state's JSON (module docstring of
    `persistshard.core.statemachine.state`): what a decoded state must satisfy."""

    def count(v: Any) -> bool:
        return type(v) is int and v >= 0

    def key_ok(k: Any) -> bool:
        return (
            isinstance(k, str)
            and k.startswith("parts/")
            and posixpath.normpath(k) == k
            and not k.endswith("/")
            and k.count("/") >= 2
            and ":" not in k
            and "\\" not in k
            and all(ord(c) >= 32 and c != "\x7f" for c in k)
            and ".." not in k.split("/")
        )

    if not (count(d["version"]) and count(d["upper"]) and count(d["since"])):
        return False
    if d["since"] > d["upper"]:
        return False
    lower = 0
    keys: list[Any] = []
    for b in d["trace"]:
        if not (count(b["lower"]) and count(b["upper"])) or b["lower"] != lower:
            return False
        if b["upper"] < b["lower"]:
            return False
        lower = b["upper"]
        for p in b["parts"]:
            if p["rows"] and type(p["max_time"]) is int and p["max_time"] >= b["upper"]:
                return False
    if d["trace"] and lower != d["upper"]:
        return False
    for b in d["trace"] + d["unsealed"]:
        for p in b["parts"]:
            keys.append(p["key"])
            if not (key_ok(p["key"]) and count(p["size"]) and count(p["rows"])):
                return False
            if p["rows"] and not (count(p["min_time"]) and count(p["max_time"])):
                return False
            if p["rows"] and (p["size"] == 0 or p["min_time"] > p["max_time"]):
                return False
    return len(keys) == len(set(keys))


VALUES = hs.one_of(
    hs.sampled_from(BAD_KEYS),
    hs.integers(-3, 2**40),
    hs.booleans(),
    hs.none(),
    hs.text(max_size=12),
)
FIELDS = ["key", "size", "rows", "min_time", "max_time", "lower", "upper", "since", "version"]


@pytest.fixture(scope="module")
def real_state(tmp_path_factory) -> dict[str, Any]:
    shard = ps.open_shard(str(tmp_path_factory.mktemp("fuzz") / "s"))
    for t in range(6):
        shard.append(updates([(t, "x", t, 1), (t + 1, "y", t, 1)]))
    shard.advance_since(2)
    shard._maybe_compact(2)
    return shard.inspect.state().to_json()


def mutate(d: dict[str, Any], where: int, name: str, value: Any) -> dict[str, Any]:
    d = json.loads(json.dumps(d))
    if name in ("version", "upper", "since") and where % 3 == 0:
        d[name] = value
        return d
    batches = d["trace"] + d["unsealed"]
    batch = batches[where % len(batches)]
    if name in ("lower", "upper"):
        batch[name] = value
    elif batch["parts"]:
        batch["parts"][where % len(batch["parts"])][name] = value
    return d


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    edits=hs.lists(
        hs.tuples(hs.integers(0, 50), hs.sampled_from(FIELDS), VALUES), min_size=1, max_size=3
    )
)
def test_hand_corrupted_rollups_decode_to_a_valid_state_or_corrupt_data(real_state, edits):
    d = real_state
    for where, name, value in edits:
        d = mutate(d, where, name, value)
    raw = encoding.seal(encoding.ROLLUP_MAGIC, json.dumps(d).encode())
    try:
        decoded = encoding.decode_rollup(raw, "rollups/fuzz.json")
    except CorruptData:
        return
    assert oracle_ok(decoded.to_json()), (edits, decoded)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    name=hs.sampled_from(["key", "size", "rows", "min_time", "max_time"]),
    value=VALUES,
    unsealed=hs.booleans(),
)
def test_hand_corrupted_commits_are_refused_or_land_valid(tmp_path_factory, name, value, unsealed):
    """A commit with one field corrupted: refused with a typed error leaving every file as
    it was, or landed with a state the oracle accepts and that reads back the same."""
    shard = small_shard(str(tmp_path_factory.mktemp("commit") / "s"))
    before, state = files(shard), shard.inspect.state()
    upper = state.upper
    live = a_live_part(shard)
    part = replace(live, key=f"parts/{new_id()}/a.part", min_time=upper, max_time=upper)
    extra = None
    if unsealed:
        hidden = replace(live, key=f"parts/{new_id()}/u.part", min_time=upper + 5, max_time=9)
        extra = Batch(new_id(), upper + 5, 10, (replace(hidden, **{_attr(name): value}),))
    else:
        part = replace(part, **{_attr(name): value})
    try:
        new = shard._machine.commit(forged_append(shard, part, extra))
    except PersistShardError:
        assert files(shard) == before
        return
    assert oracle_ok(new.to_json()), (name, value, new)
    assert ps.open_shard(shard.location).inspect.state().to_json() == new.to_json()


def _attr(name: str) -> str:
    return "num_rows" if name == "rows" else name


# --- inline parts: their bytes travel in the commit ------------------------------------------


def _flip(data: bytes, at: int) -> bytes:
    at %= len(data)
    return data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :]


def _inline_part(shard: ps.Shard) -> PartRef:
    """A live inline part of ``shard``, moved to a fresh key at the upper."""
    part = a_live_part(shard)
    assert part.inline is not None
    upper = shard.upper
    return replace(part, key=f"parts/{new_id()}/i.part", min_time=upper, max_time=upper)


def _rows_wrong(p: PartRef) -> PartRef:
    return replace(p, num_rows=p.num_rows + 1)


INLINE_DAMAGE = [
    (lambda p: replace(p, inline=_flip(p.inline, 40)), "crc32c"),
    (lambda p: replace(p, inline_crc=(p.inline_crc + 1) % 2**32), "crc32c"),
    (lambda p: replace(p, inline=p.inline[:-3]), "bytes"),
    (lambda p: replace(p, inline_crc=None), "crc32c"),
    (_rows_wrong, "rows"),
    (lambda p: replace(p, min_time=p.min_time + 7, max_time=p.max_time + 7), "times"),
    (lambda p: replace(p, size=st.MAX_INLINE_PART_BYTES + 1), "bytes"),
]


@pytest.mark.parametrize(("damage", "why"), INLINE_DAMAGE)
def test_a_commit_with_a_damaged_inline_part_is_refused(tmp_path, damage, why):
    """check_transition checks an inline part's size, crc32c, rows and times before the
    compare-and-set: `InvalidUpdates`, nothing written."""
    shard = small_shard(str(tmp_path / "s"), inline=True)
    before, state = files(shard), shard.inspect.state()
    part = damage(_inline_part(shard))
    if why == "times":  # the times checked are the footer's, beyond the batch's interval
        part = replace(part, min_time=state.upper, max_time=state.upper)
        part = replace(part, inline=a_live_part(shard).inline)
        part = replace(part, num_rows=a_live_part(shard).num_rows)
        why = "holds times"
    with pytest.raises(InvalidUpdates, match=why):
        shard._machine.commit(forged_append(shard, part))
    assert files(shard) == before
    assert ps.open_shard(shard.location).inspect.state() == state


@pytest.mark.parametrize("damage", ["flip", "base64", "type"])
def test_a_stored_damaged_inline_part_is_corrupt_data(tmp_path, damage):
    """An entry that carries damaged inline bytes (an old or hostile writer; the entry's own
    checksum matches) reads as `CorruptData`, never as other rows."""
    shard = small_shard(str(tmp_path / "s"), inline=True)
    part = _inline_part(shard)
    commit = forged_append(shard, part)
    d = commit.to_json()
    forged = d["args"]["batch"]["parts"][0]
    if damage == "flip":
        forged["inline"] = base64.b64encode(_flip(part.inline or b"", 60)).decode()
    elif damage == "base64":
        forged["inline"] = "not base64!"
    else:
        forged["inline"] = 12345
    forge_entry(shard, d)
    fresh = ps.open_shard(shard.location)
    with pytest.raises(CorruptData):
        fresh.snapshot()


@pytest.fixture(scope="module")
def inline_state(tmp_path_factory) -> dict[str, Any]:
    shard = ps.open_shard(str(tmp_path_factory.mktemp("inline") / "s"), inline_bytes=4096)
    for t in range(3):
        shard.append(updates([(t, "x", t, 1)]))
    state = shard.inspect.state()
    assert all(p.inline is not None for p in state.parts())
    return state.to_json()


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(where=hs.integers(0, 10**6), xor=hs.integers(1, 255), batch=hs.integers(0, 2))
def test_flipped_inline_bytes_in_a_rollup_are_corrupt_data(inline_state, where, xor, batch):
    """Any byte of an inline part changed (its checksum left as it was): the rollup decodes
    to `CorruptData`, never to a state."""
    d = json.loads(json.dumps(inline_state))
    part = d["trace"][batch]["parts"][0]
    data = bytearray(base64.b64decode(part["inline"]))
    data[where % len(data)] ^= xor
    part["inline"] = base64.b64encode(bytes(data)).decode()
    with pytest.raises(CorruptData, match="inline part"):
        encoding.decode_rollup(
            encoding.seal(encoding.ROLLUP_MAGIC, json.dumps(d).encode()), "rollups/fuzz.json"
        )


def test_a_rollup_decodes_once_per_process_and_damage_is_never_remembered(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`decode_rollup` remembers what bytes it decoded: every handle opened anew reads the
    newest rollup, and its state is decoded and checked once; the state is the one decoded
    then. Bytes that fail (a flipped byte) raise every time, and are never remembered."""
    shard = ps.open_shard(str(tmp_path / "s"), maintenance=False)
    for i in range(3):
        shard.append(
            updates([(j, f"r{j}", i, 1) for j in range(i * 5, i * 5 + 5)]), new_upper=i + 1
        )
    raw = encoding.encode_rollup(shard.inspect.state())
    calls: list[int] = []
    original = encoding._decode_rollup

    def counting(data: bytes, where: str, location: str | None) -> st.ShardState:
        calls.append(len(data))
        return original(data, where, location)

    monkeypatch.setattr(encoding, "_decode_rollup", counting)
    first = encoding.decode_rollup(raw, "rollups/a.json")
    again = encoding.decode_rollup(bytes(raw), "rollups/b.json")
    assert again is first and first == shard.inspect.state() and len(calls) == 1
    damaged = bytearray(raw)
    damaged[len(raw) // 2] ^= 0x20
    for _ in range(2):
        with pytest.raises(CorruptData):
            encoding.decode_rollup(bytes(damaged), "rollups/c.json")
    assert len(calls) == 3
    monkeypatch.setattr(encoding._ROLLUPS, "entries", 1)
    other = encoding.encode_rollup(
        replace(shard.inspect.state(), version=shard.inspect.state().version + 1)
    )
    encoding.decode_rollup(other, "rollups/d.json")  # remembered alone now
    encoding.decode_rollup(raw, "rollups/a.json")
    assert len(calls) == 5
    monkeypatch.setattr(encoding._ROLLUPS, "entries", 64)
    monkeypatch.setattr(encoding._ROLLUPS, "total_bytes", 1)  # no rollup fits
    encoding.decode_rollup(other, "rollups/d.json")  # forgotten at once, and so is every other
    encoding.decode_rollup(raw, "rollups/a.json")
    encoding.decode_rollup(raw, "rollups/a.json")
    assert len(calls) == 8 and not encoding._ROLLUPS and encoding._ROLLUPS.bytes == 0

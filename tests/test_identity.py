"""One shard, one identity (issue 36, item 3): every spelling of a location reaches the same
shard and the same log, and a shard's log lives in exactly one place.

- `canonical_location` gives one canonical location for every spelling of a local directory
  (``file://`` or not, doubled or trailing slashes, ``.``, a symbolic link) and one spelling of
  a URL; Spark/SQL options give the same one.
- A database log is keyed by the shard's id (made on its first write, recorded next to the
  data in `LOG_HOME_KEY` together with the database's own id), not by the location string:
  an alias finds the same log, and gc through an alias deletes nothing the shard needs.
- Opening a shard with another consensus (another database, a database for a blob-logged
  shard, none for a database-logged one) is `InvalidOption` and writes nothing anywhere.
- Shards logged in a database before this change (keyed by their location, the marker
  holding only the redacted URL) keep working, untouched.
"""

from __future__ import annotations

import json
import os
import sqlite3

import pyarrow as pa
import pytest
from conformance_helpers import rows_of

import persistshard as ps
from persistshard.core.shard import Shard
from persistshard.core.storage.blob import Blob, BlobMeta, BlobWrapper, open_blob
from persistshard.core.storage.consensus import LEGACY_LOG_HOME_KEY, LOG_HOME_KEY, mark_log_home
from persistshard.core.storage.layout import canonical_location
from persistshard.core.storage.sqlconsensus import open_consensus
from persistshard.errors import InvalidOption


def _row(i: int) -> pa.Table:
    return pa.table({"id": [i]})


def _ids(shard: ps.Shard) -> list[int]:
    return sorted(shard.snapshot().column("id").to_pylist())


def _db_rows(path: str) -> list[tuple[str, int]]:
    """Every (log key, version) in the SQLite consensus file at ``path`` ([] if none)."""
    if not os.path.exists(path):
        return []
    with sqlite3.connect(path) as db:
        try:
            return sorted(db.execute("SELECT shard, version FROM persistshard_consensus"))
        except sqlite3.OperationalError:
            return []  # no tables: nothing was ever written


def _everything(shard: ps.Shard) -> dict[str, bytes | None]:
    """Every stored object of the shard with its bytes (what "writes nothing" compares)."""
    return {m.key: shard._blob.get(m.key) for m in shard._blob.list("")}


def _spellings(tmp_path, name: str) -> list[str]:
    """Other spellings of the directory ``tmp_path/name``: file URLs, slashes, a dot, a link."""
    real = str(tmp_path / name)
    link = str(tmp_path / f"link-to-{name}")
    os.symlink(real, link)
    return [
        f"file://{real}/",
        f"file:{real}",
        f"{real}//",
        f"{tmp_path}//{name}/.",
        f"{real}/../{name}",
        link,
        f"file://{link}/",
    ]


def test_canonical_location_unifies_spellings(tmp_path):
    real = tmp_path / "d"
    real.mkdir()
    want = f"file://{os.path.realpath(real)}"
    for spelling in _spellings(tmp_path, "d"):
        assert canonical_location(spelling) == want, spelling
    assert canonical_location(f"file://localhost{real}") == want
    assert canonical_location("S3://bucket//a/b/") == "s3://bucket/a/b"
    assert canonical_location("s3://bucket/a/b") == "s3://bucket/a/b"
    assert canonical_location("memory://x/y/") == "memory://x/y"
    assert canonical_location("s3://bucket/") == "s3://bucket"


def test_spark_options_give_the_canonical_location(tmp_path):
    from persistshard.datasource.options import ReadOptions, WriteOptions

    (tmp_path / "d").mkdir()
    want = canonical_location(str(tmp_path / "d"))
    for spelling in _spellings(tmp_path, "d"):
        assert WriteOptions.parse({"path": spelling}).location == want
        assert ReadOptions.parse({"path": spelling}).location == want


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/log.db"


def test_every_spelling_finds_the_one_database_log(tmp_path, sqlite_url):
    """Today the database log is keyed by the location string: an alias reads an empty log
    and its first write starts a second history over the same parts."""
    home = str(tmp_path / "d")
    ps.open_shard(home, consensus=sqlite_url).append(_row(0))
    spellings = _spellings(tmp_path, "d")
    for i, spelling in enumerate(spellings, start=1):
        alias = ps.open_shard(spelling, consensus=sqlite_url)
        assert alias.upper == i, spelling
        alias.append(_row(i))
    n = len(spellings)
    shard = ps.open_shard(home, consensus=sqlite_url)
    assert _ids(shard) == list(range(n + 1))
    assert len({key for key, _ in _db_rows(f"{tmp_path}/log.db")}) == 1  # one log


def test_gc_through_an_alias_keeps_the_shard(tmp_path, sqlite_url):
    home = str(tmp_path / "d")
    shard = ps.open_shard(home, consensus=sqlite_url)
    for i in range(5):
        shard.append(_row(i))
    os.symlink(home, tmp_path / "alias")
    alias = ps.open_shard(str(tmp_path / "alias") + "/", consensus=sqlite_url)
    alias.append(_row(5))  # today: the first entry of a second history over the same parts
    alias.gc(dry_run=False, retention_seconds=0)
    again = ps.open_shard(home, consensus=sqlite_url)
    assert _ids(again) == list(range(6))
    assert again.verify().ok


def test_another_sqlite_database_is_refused_and_writes_nothing(tmp_path, sqlite_url):
    """Today another database reads empty, takes the append and re-points the marker."""
    home = str(tmp_path / "d")
    ps.open_shard(home, consensus=sqlite_url).append(_row(1))
    before = _everything(ps.open_shard(home, consensus=sqlite_url))
    marker = before[LOG_HOME_KEY]
    other_path = f"{tmp_path}/other.db"
    other = ps.open_shard(home, consensus=f"sqlite:///{other_path}")
    with pytest.raises(InvalidOption, match="another database"):
        other.inspect.state()
    with pytest.raises(InvalidOption):
        other.append(_row(2))
    with pytest.raises(InvalidOption):
        other.compare_and_append(_row(2).append_column("_time", pa.array([0])), 0, 1)
    assert not os.path.exists(other_path)  # nothing in (or of) the other database
    shard = ps.open_shard(home, consensus=sqlite_url)
    assert shard._blob.get(LOG_HOME_KEY) == marker  # the marker was not re-pointed
    assert _everything(shard) == before  # no part, no marker, nothing
    assert _ids(shard) == [1]


def test_the_same_sqlite_file_under_another_spelling_is_the_same_database(tmp_path):
    (tmp_path / "db").mkdir()
    os.symlink(tmp_path / "db", tmp_path / "dblink")
    home = str(tmp_path / "d")
    ps.open_shard(home, consensus=f"sqlite:///{tmp_path}/db/log.db").append(_row(1))
    for url in (
        f"sqlite:///{tmp_path}/dblink/log.db",
        f"sqlite:///{tmp_path}//db/./log.db",
    ):
        shard = ps.open_shard(home, consensus=url)
        assert _ids(shard) == [1]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        shard = ps.open_shard(home, consensus="sqlite:///db/log.db")  # relative: same file
        shard.append(_row(2))
    finally:
        os.chdir(cwd)
    assert _ids(ps.open_shard(home, consensus=f"sqlite:///{tmp_path}/db/log.db")) == [1, 2]


def test_a_database_for_a_blob_logged_shard_writes_nothing(tmp_path, sqlite_url):
    home = str(tmp_path / "d")
    ps.open_shard(home).append(_row(1))
    before = _everything(ps.open_shard(home))
    wrong = ps.open_shard(home, consensus=sqlite_url)
    for call in (wrong.inspect.state, lambda: wrong.append(_row(2))):
        with pytest.raises(InvalidOption, match="next to its data"):
            call()
    assert _db_rows(f"{tmp_path}/log.db") == []
    assert _everything(ps.open_shard(home)) == before
    assert _ids(ps.open_shard(home)) == [1]


def test_no_consensus_for_a_database_shard_writes_nothing(tmp_path, sqlite_url):
    home = str(tmp_path / "d")
    ps.open_shard(home, consensus=sqlite_url).append(_row(1))
    wrong = ps.open_shard(home)
    before = _everything(wrong)
    with pytest.raises(InvalidOption, match="keeps its log in a database"):
        wrong.append(_row(2))
    assert _everything(wrong) == before


def test_the_first_write_records_one_id_and_a_crash_before_the_entry_is_completed(
    tmp_path, sqlite_url
):
    """The id is created (put-if-absent) before the first entry; a writer that crashed in
    between leaves the id, and the next writer uses it: never two ids."""
    home = str(tmp_path / "d")
    crashed = ps.open_shard(home, consensus=sqlite_url)
    crashed.inspect.state()
    mark_log_home(crashed._blob, crashed._consensus, crashed.location)  # then "crashed"
    marker = json.loads(crashed._blob.get(LOG_HOME_KEY) or b"")
    assert marker["log"] == "database" and marker["shard_id"] and marker["database_id"]
    assert _db_rows(f"{tmp_path}/log.db") == []
    ps.open_shard(home, consensus=sqlite_url).append(_row(1))
    ps.open_shard(f"file://{home}/", consensus=sqlite_url).append(_row(2))
    assert json.loads(crashed._blob.get(LOG_HOME_KEY) or b"") == marker
    assert _db_rows(f"{tmp_path}/log.db") == [(marker["shard_id"], 1), (marker["shard_id"], 2)]
    # A blob-logged shard records its id the same way (one key, raced on by every kind).
    blob_home = str(tmp_path / "b")
    ps.open_shard(blob_home).append(_row(1))
    blob_marker = json.loads(ps.open_shard(blob_home)._blob.get(LOG_HOME_KEY) or b"")
    assert blob_marker["log"] == "blob" and blob_marker["shard_id"]


def _make_legacy(tmp_path, url: str, home: str) -> tuple[str, bytes]:
    """A shard logged in the SQLite database at ``url`` the way versions before the shard id
    did it: entries keyed by the location string, ``consensus/ELSEWHERE`` holding the
    redacted URL, no identity marker, no database id row. Built from a shard written today
    by moving its rows to the old key and its marker to the old bytes."""
    shard = ps.open_shard(home, consensus=url)
    for i in range(3):
        shard.append(_row(i))
    marker = json.loads(shard._blob.get(LOG_HOME_KEY) or b"")
    old_key = "file://" + os.path.abspath(home)
    with sqlite3.connect(url[len("sqlite:///") :]) as db:
        for table in ("persistshard_consensus", "persistshard_heads"):
            db.execute(
                f"UPDATE {table} SET shard = ? WHERE shard = ?", (old_key, marker["shard_id"])
            )
        db.execute("DROP TABLE persistshard_identity")
    shard._blob.delete(LOG_HOME_KEY)
    old_marker = url.encode()  # the redacted URL (a SQLite URL has nothing to redact)
    shard._blob.put(LEGACY_LOG_HOME_KEY, old_marker)
    return old_key, old_marker


def test_a_shard_logged_before_ids_keeps_working(tmp_path, sqlite_url):
    home = str(tmp_path / "legacy")
    old_key, old_marker = _make_legacy(tmp_path, sqlite_url, home)
    shard = ps.open_shard(home, consensus=sqlite_url)
    assert rows_of(shard.snapshot()) == {(i,): 1 for i in range(3)}
    shard.append(_row(3))
    os.symlink(home, tmp_path / "alias")
    ps.open_shard(str(tmp_path / "alias"), consensus=sqlite_url).append(_row(4))
    assert _ids(ps.open_shard(f"file://{home}/", consensus=sqlite_url)) == list(range(5))
    # Its history stays where it was: under the old key, the old marker untouched.
    assert {key for key, _ in _db_rows(f"{tmp_path}/log.db")} == {old_key}
    assert shard._blob.get(LEGACY_LOG_HOME_KEY) == old_marker
    # Still refused without its database and with another one.
    with pytest.raises(InvalidOption, match="keeps its log in a database"):
        ps.open_shard(home).append(_row(9))
    other = f"{tmp_path}/other.db"
    with pytest.raises(InvalidOption):
        ps.open_shard(home, consensus=f"sqlite:///{other}").append(_row(9))
    assert not os.path.exists(other)
    assert _ids(ps.open_shard(home, consensus=sqlite_url)) == list(range(5))


def test_another_postgres_database_is_refused(postgres_url, tmp_path):
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS persist_other")
        admin.execute("CREATE DATABASE persist_other")
    other_url = postgres_url.rsplit("/", 1)[0] + "/persist_other"
    home = str(tmp_path / "d")
    ps.open_shard(home, consensus=postgres_url).append(_row(1))
    ps.open_shard(f"file://{home}//", consensus=postgres_url).append(_row(2))
    with pytest.raises(InvalidOption, match="another database"):
        ps.open_shard(home, consensus=other_url).append(_row(3))
    with psycopg.connect(other_url, autocommit=True) as db:
        # Not even the tables: the check reads, it never creates.
        assert db.execute("SELECT to_regclass('persistshard_consensus')").fetchone() == (None,)
    assert _ids(ps.open_shard(home, consensus=postgres_url)) == [1, 2]


def test_a_raw_consensus_keeps_the_key_it_was_given(tmp_path, sqlite_url):
    """`open_consensus` used on its own (the consensus contract, tools) keys by the string
    it is given, as before."""
    c = open_consensus(sqlite_url, "any-key")
    assert c.compare_and_set(None, b"1")
    assert _db_rows(f"{tmp_path}/log.db") == [("any-key", 1)]


class _Recording(BlobWrapper):
    """Records which keys were read, created or listed."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, str]] = []

    def get(self, key: str) -> bytes | None:
        self.calls.append(("get", key))
        return self.inner.get(key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.calls.append(("put_if_absent", key))
        return self.inner.put_if_absent(key, data)

    def list(self, prefix: str = "") -> list[BlobMeta]:
        self.calls.append(("list", prefix))
        return self.inner.list(prefix)

    def marker_calls(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[1] in (LOG_HOME_KEY, LEGACY_LOG_HOME_KEY)]


def test_costs_one_get_per_open_of_a_database_shard_and_nothing_per_blob_commit(
    tmp_path, sqlite_url
):
    home = str(tmp_path / "d")
    ps.open_shard(home, consensus=sqlite_url).append(_row(0))
    blob = _Recording(open_blob(canonical_location(home)))
    shard = Shard(home, consensus=sqlite_url, blob=blob)
    shard.inspect.state()
    shard.append(_row(1))
    shard.append(_row(2))
    assert _ids(shard) == [0, 1, 2]
    assert blob.marker_calls() == [("get", LOG_HOME_KEY)]  # one get for the handle's life
    assert not [c for c in blob.calls if c[0] == "list"]

    beside = str(tmp_path / "b")
    ps.open_shard(beside).append(_row(0))
    blob = _Recording(open_blob(canonical_location(beside)))
    shard = Shard(beside, blob=blob)
    for i in range(1, 4):
        shard.append(_row(i))
    assert _ids(shard) == [0, 1, 2, 3]
    assert blob.marker_calls() == []  # the blob consensus commit path never reads it


def test_first_writers_with_different_consensuses_race_on_one_marker(tmp_path, sqlite_url):
    """Both checked an empty location; the other's first write lands before this one marks
    its home: the marker is not re-pointed (today it was overwritten), the late writer is
    refused before its log holds anything."""
    home = str(tmp_path / "d")
    late_db = ps.open_shard(home, consensus=sqlite_url)
    assert late_db.upper == 0
    ps.open_shard(home).append(_row(1))  # the blob consensus's first write lands
    marker = ps.open_shard(home)._blob.get(LOG_HOME_KEY)
    with pytest.raises(InvalidOption, match="next to its data"):
        mark_log_home(late_db._blob, late_db._consensus, late_db.location)
    assert ps.open_shard(home)._blob.get(LOG_HOME_KEY) == marker
    assert _db_rows(f"{tmp_path}/log.db") == []

    other = str(tmp_path / "e")
    late_blob = ps.open_shard(other)
    assert late_blob.upper == 0
    ps.open_shard(other, consensus=sqlite_url).append(_row(1))
    with pytest.raises(InvalidOption, match="keeps its log in a database"):
        mark_log_home(late_blob._blob, late_blob._consensus, late_blob.location)
    assert not [m.key for m in late_blob._blob.list("consensus/") if m.key.endswith(".json")]
    assert _ids(ps.open_shard(other, consensus=sqlite_url)) == [1]


def test_a_database_consensus_travels_with_its_key(tmp_path, sqlite_url):
    """Pickled (to another process), the object keeps its resolved key and reads the same
    log; its connection is not pickled."""
    import pickle

    home = str(tmp_path / "d")
    shard = ps.open_shard(home, consensus=sqlite_url)
    shard.append(_row(1))
    consensus = open_consensus(sqlite_url, shard.location, open_blob(shard.location))
    assert consensus.head() is not None
    copy = pickle.loads(pickle.dumps(consensus))
    head = copy.head()
    assert head is not None and head.version == shard.inspect.state().version


def test_spark_writes_through_aliases_reach_one_log(spark, tmp_path, sqlite_url):
    """A Spark write under other spellings of the location (a file URL with a trailing slash,
    a symbolic link) lands in the one log the Python API reads."""
    home = str(tmp_path / "orders")
    ps.open_shard(home, consensus=sqlite_url).append(_row(1))
    os.symlink(home, tmp_path / "alias")
    for n, where in enumerate((f"file://{home}/", str(tmp_path / "alias")), start=2):
        df = spark.createDataFrame([(n,)], "id BIGINT")
        df.write.format("persistshard").mode("append").option("consensus", sqlite_url).save(where)
    assert _ids(ps.open_shard(home, consensus=sqlite_url)) == [1, 2, 3]
    read = spark.read.format("persistshard").option("consensus", sqlite_url)
    assert sorted(r.id for r in read.load(f"{tmp_path}//alias/.").collect()) == [1, 2, 3]

"""The database consensus (`persistshard.core.storage.sqlconsensus`) on SQLite and on a real
PostgreSQL server (the session's ``postgres_url`` fixture): the consensus contract and the
shard model from `persistshard.conformance`, racing processes over many versions, a
connection killed in the middle of a compare-and-set, several shards in one database, and
URLs whose credentials must not show anywhere."""

from __future__ import annotations

import json
import threading
import uuid

import pyarrow as pa
import pytest
from conformance_helpers import examples, rows_of
from hypothesis import HealthCheck, settings

import persistshard as ps
from persistshard import Indeterminate
from persistshard.conformance.model import make_shard_machine
from persistshard.conformance.storage import (
    RACERS,
    ConsensusAt,
    ConsensusContract,
    Store,
    process_context,
)
from persistshard.core.shard import Shard, open_shard
from persistshard.core.storage.consensus import LOG_HOME_KEY, Consensus
from persistshard.core.storage.sqlconsensus import (
    PostgresConsensus,
    open_consensus,
    redact_url,
    url_has_password,
)
from persistshard.errors import InvalidOption


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.database)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/consensus.db"
    return str(request.getfixturevalue("postgres_url"))


class TestSqlConsensus(ConsensusContract):
    """The contract every consensus passes (racers are processes: the database is shared)."""

    @pytest.fixture
    def store(self, tmp_path, db_url) -> Store:
        return Store(
            f"file://{tmp_path}/store-{uuid.uuid4().hex}", consensus_factory=ConsensusAt(db_url)
        )


def _append_many(url: str, shard: str, name: str, rounds: int, barrier, out) -> None:
    """Append ``rounds`` entries by read-head-then-CAS; report (won, heads seen in order)."""
    consensus = open_consensus(url, shard)
    barrier.wait()
    won, seen = [], []
    while len(won) < rounds:
        head = consensus.head()
        version = head.version if head else 0
        seen.append(version)
        data = f"{name}-{len(won)}".encode()
        if consensus.compare_and_set(version or None, data):
            won.append((version + 1, data))
            seen.append(version + 1)
    out.put((won, seen))


def test_racing_processes_every_version_has_one_winner(db_url, tmp_path):
    """RACERS processes append 6 entries each: the log is contiguous, every success is in it
    at its version, no version has two winners, and no process ever saw the head go back."""
    shard = f"file://{tmp_path}/race"
    ctx = process_context()
    barrier, out = ctx.Barrier(RACERS), ctx.Queue()
    procs = [
        ctx.Process(target=_append_many, args=(db_url, shard, f"w{i}", 6, barrier, out))
        for i in range(RACERS)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    won = sorted(w for ws, _ in results for w in ws)
    assert [v for v, _ in won] == list(range(1, 6 * RACERS + 1))
    log = [(e.version, e.data) for e in open_consensus(db_url, shard).scan(1)]
    assert log == won
    for _, seen in results:
        assert seen == sorted(seen)


def test_shards_share_one_database(db_url, tmp_path):
    a = open_consensus(db_url, f"file://{tmp_path}/a")
    b = open_consensus(db_url, f"file://{tmp_path}/b")
    assert a.compare_and_set(None, b"a1") and a.compare_and_set(1, b"a2")
    assert b.head() is None
    assert b.compare_and_set(None, b"b1")
    assert a.truncate(10) == 1
    assert [e.data for e in a.scan(1)] == [b"a2"]
    assert [e.data for e in b.scan(1)] == [b"b1"]


def test_head_after_cas_is_never_older_on_other_connections(db_url, tmp_path):
    """Linearizable reads: after each successful CAS, a reader on another connection (opened
    before the writes) sees that version or newer."""
    shard = f"file://{tmp_path}/lin"
    writer, reader = open_consensus(db_url, shard), open_consensus(db_url, shard)
    assert reader.head() is None
    for v in range(1, 21):
        assert writer.compare_and_set(v - 1 or None, str(v).encode())
        head = reader.head()
        assert head is not None and head.version >= v


def test_shard_on_database_consensus(db_url, tmp_path):
    """A shard with its log in the database: nothing of the log next to the data (only the
    marker saying where it is, `mark_log_home`), a reopen from its storage options finds the
    same state, gc truncates in the database."""
    location = f"{tmp_path}/orders"
    shard = open_shard(location, consensus=db_url)
    for i in range(20):  # past the first rollup (version 16), below which gc truncates
        shard.compare_and_append(pa.table({"id": [i], "_time": [i], "_diff": [1]}), i, i + 1)
    assert [m.key for m in shard._blob.list("consensus/")] == [LOG_HOME_KEY]
    assert shard.address.storage_options == {}  # storage options only: the consensus travels apart
    assert shard.address.consensus == db_url
    again = shard.address.open()
    assert again.upper == 20
    assert rows_of(again.snapshot()) == {(i,): 1 for i in range(20)}
    shard.advance_since(19)
    before = len(shard._consensus.scan(1))
    shard.gc(dry_run=False, retention_seconds=0)
    after = shard._consensus.scan(1)
    assert len(after) < before and after[-1].version == shard.inspect.state().version
    assert rows_of(Shard(location, consensus=db_url).snapshot()) == {(i,): 1 for i in range(20)}
    # The same location without the URL is another log: empty (the data files stay put).
    assert Shard(location)._consensus.head() is None


def test_model_on_database_consensus(db_url, tmp_path):
    """The reference-model state machine (conformance) with the log in the database."""
    machine = make_shard_machine(
        lambda: f"{tmp_path}/model-{uuid.uuid4().hex}", {"consensus": db_url}
    )
    case = machine.TestCase
    case.settings = settings(
        max_examples=examples(8),
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    case("runTest").runTest()


def _admin(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True)


def test_connection_killed_mid_cas_is_indeterminate(postgres_url, tmp_path):
    """The CAS waits on a row lock another transaction holds; its backend is terminated while
    it waits: `Indeterminate`, nothing applied, and the next call reconnects and works."""
    shard = f"file://{tmp_path}/killed"
    consensus = open_consensus(postgres_url, shard)
    assert isinstance(consensus, PostgresConsensus)
    assert consensus.compare_and_set(None, b"one")
    pid = consensus.backend_pid()
    with _admin(postgres_url) as admin:
        locker = _admin(postgres_url)
        locker.autocommit = False
        locker.execute("SELECT head FROM persistshard_heads WHERE shard = %s FOR UPDATE", (shard,))
        raised: list[BaseException] = []

        def cas() -> None:
            try:
                consensus.compare_and_set(1, b"two")
            except BaseException as e:
                raised.append(e)

        t = threading.Thread(target=cas)
        t.start()
        while not admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)
        ).fetchone():
            t.join(0.05)
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        t.join(60)
        locker.rollback()
        locker.close()
    assert len(raised) == 1 and isinstance(raised[0], Indeterminate)
    assert str(raised[0]).startswith("Indeterminate: ")
    head = consensus.head()  # a new connection
    assert head is not None and (head.version, head.data) == (1, b"one")
    assert consensus.compare_and_set(1, b"two")


def test_killed_connection_before_cas_is_indeterminate_then_resolved_by_the_shard(
    postgres_url, tmp_path
):
    """A shard whose connection was dropped still commits: the state machine resolves the
    ambiguous attempt by reading its commit back, and the append lands exactly once."""
    location = f"{tmp_path}/dropped"
    shard = open_shard(location, consensus=postgres_url)
    shard.compare_and_append(pa.table({"id": [1], "_time": [0], "_diff": [1]}), 0, 1)
    consensus = shard._consensus
    assert isinstance(consensus, PostgresConsensus)
    with _admin(postgres_url) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (consensus.backend_pid(),))
    with pytest.raises(Indeterminate):
        consensus.compare_and_set(99, b"never")
    with _admin(postgres_url) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (consensus.backend_pid(),))
    shard.compare_and_append(pa.table({"id": [2], "_time": [1], "_diff": [1]}), 1, 2)
    assert rows_of(Shard(location, consensus=postgres_url).snapshot()) == {(1,): 1, (2,): 1}


def test_credentials_never_show(postgres_url, tmp_path):
    secret = "s3cr3t-Pa55"
    url = postgres_url.replace("@", f":{secret}@").replace(
        ":" + postgres_url.rsplit(":", 1)[1].split("/")[0], ":1"
    )  # a closed port: connecting fails
    assert url_has_password(url) and not url_has_password(postgres_url)
    assert secret not in redact_url(url)
    consensus = open_consensus(url + "?sslpassword=other-secret", f"file://{tmp_path}/c")
    assert secret not in repr(consensus) and "other-secret" not in repr(consensus)
    with pytest.raises(OSError) as e:
        consensus.head()
    assert secret not in str(e.value) and "other-secret" not in str(e.value)
    with pytest.raises(InvalidOption) as bad:
        open_consensus(f"mysql://u:{secret}@h/db", "file:///x")
    assert secret not in str(bad.value)


def test_redacted_urls_keep_their_shape():
    assert redact_url("sqlite:////data/x.db") == "sqlite:////data/x.db"
    assert redact_url("postgresql://u:pw@h:5/db?sslmode=require") == (
        "postgresql://u:***@h:5/db?sslmode=***"
    )
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"


def test_sqlite_url_forms(tmp_path):
    c: Consensus = open_consensus(f"sqlite:///{tmp_path}/a.db", "file:///x")
    assert c.compare_and_set(None, b"1")
    for bad in ("sqlite://relative.db", "sqlite:///:memory:", "sqlite:///"):
        with pytest.raises(InvalidOption, match=r"^InvalidOption: consensus"):
            open_consensus(bad, "file:///x")


def test_cli_takes_consensus(tmp_path, capsys):
    """``--consensus URL`` on every command; without it the location holds no shard."""
    from persistshard.cli import main

    location, url = str(tmp_path / "s"), f"sqlite:///{tmp_path}/log.db"
    shard = open_shard(location, consensus=url)
    for t in range(3):
        shard.append(pa.table({"id": [t], "_time": [t], "_diff": [1]}))
    assert main(["inspect", location, "--consensus", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["upper"] == 3
    assert main(["history", location, "--consensus", url]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + 3  # the column titles, 3 versions
    assert main(["verify", location, "--consensus", url]) == 0
    assert main(["inspect", location]) == 2
    assert "NoShard" in capsys.readouterr().err


def test_cli_conformance_with_consensus(tmp_path, capsys):
    """``persistshard conformance LOCATION --consensus URL`` runs the suite with its log in
    the database and passes (its consensus contract: the whole suite on local files is
    tests/test_cli_output.py's); ``-k`` selecting nothing is an error, not a pass."""
    from persistshard.cli import main

    url = f"sqlite:///{tmp_path}/conformance.db"
    place = str(tmp_path / "place")
    assert main(["conformance", place, "--consensus", url, "-k", "TestConsensus", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["passed"] > 5 and report["failed"] == 0
    assert {t["test"].split("::")[0] for t in report["tests"]} == {"TestConsensus"}
    assert main(["conformance", place, "--consensus", url, "-k", "NoSuchCheck"]) == 2
    assert "no check matches 'NoSuchCheck'" in capsys.readouterr().err
    import sqlite3

    with sqlite3.connect(f"{tmp_path}/conformance.db") as db:
        assert db.execute("SELECT count(*) FROM persistshard_heads").fetchone()[0] > 0


def test_one_object_shared_by_threads(db_url, tmp_path):
    """One consensus object used from several threads (a Spark driver's streams): its one
    connection is used under its lock, and every version still has one winner."""
    consensus = open_consensus(db_url, f"file://{tmp_path}/threads")
    won: list[int] = []

    def append(name: str) -> None:
        for i in range(5):
            while True:
                head = consensus.head()
                version = head.version if head else 0
                if consensus.compare_and_set(version or None, f"{name}-{i}".encode()):
                    won.append(version + 1)
                    break

    threads = [threading.Thread(target=append, args=(f"t{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(won) == list(range(1, 21))
    assert [e.version for e in consensus.scan(1)] == list(range(1, 21))


def test_a_shard_opened_with_the_wrong_consensus_is_refused_not_forked(tmp_path):
    """A shard keeps one log. Opened without its database consensus it must not look empty
    (a first write there would start a second history over the same parts); opened with a
    database while its log is next to the data, likewise. Both are refused naming the fix,
    and nothing is written."""
    url = f"sqlite:///{tmp_path}/log.db"
    in_db = str(tmp_path / "in_db")
    ps.open_shard(in_db, consensus=url).append(pa.table({"id": [1]}))
    wrong = ps.open_shard(in_db)
    with pytest.raises(InvalidOption, match=r"keeps its log in a database \(sqlite:///"):
        wrong.inspect.state()
    with pytest.raises(InvalidOption, match="open it with that consensus"):
        wrong.append(pa.table({"id": [2]}))
    assert not any(m.key.endswith(".json") for m in wrong._blob.list("consensus/"))
    assert ps.open_shard(in_db, consensus=url).snapshot().column("id").to_pylist() == [1]

    beside = str(tmp_path / "beside")
    ps.open_shard(beside).append(pa.table({"id": [1]}))
    other_url = f"sqlite:///{tmp_path}/other.db"
    with pytest.raises(InvalidOption, match="keeps its log next to its data"):
        ps.open_shard(beside, consensus=other_url).append(pa.table({"id": [2]}))
    assert ps.open_shard(beside).snapshot().column("id").to_pylist() == [1]


# --- a lost race on a database is certain (issue 36: no extra scan before a refusal) ----------

from persistshard.conformance.recorder import FaultyConsensus  # noqa: E402
from persistshard.core.statemachine.commits.append import Append  # noqa: E402
from persistshard.core.statemachine.state import Batch  # noqa: E402


class _Scans:
    """Counts the scans of one consensus object (its ``scan`` is an instance attribute: the
    shard instruments the object itself, `persistshard.core.storage.metrics`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, consensus: Consensus) -> None:
        self.calls: list[int] = []
        real = consensus.scan

        def counted(from_version: int, limit: int | None = None) -> list:  # type: ignore[type-arg]
            self.calls.append(from_version)
            return real(from_version, limit)

        monkeypatch.setattr(consensus, "scan", counted)


def _refused_after_a_lost_race(
    db_url: str, location: str, monkeypatch: pytest.MonkeyPatch, *, trust: bool
) -> list[int]:
    """A handle commits on a stale state, loses the race at the database, then fails its
    precondition (`UpperMismatch`); returns the versions its scans started at. ``trust``
    False: the state machine is made to distrust the lost race (what it did before the
    database consensus declared `Consensus.certain_lost_races`)."""
    rows = pa.table({"id": [1], "_time": [0], "_diff": [1]})
    winner = open_shard(location, consensus=db_url)
    winner.compare_and_append(rows, 0, 1)
    loser = open_shard(location, consensus=db_url)
    stale = loser.inspect.state()
    winner.compare_and_append(rows.set_column(1, "_time", pa.array([1])), 1, 2)
    consensus = loser._machine.consensus
    if not trust:
        monkeypatch.setattr(type(consensus), "certain_lost_races", property(lambda _: False))
    scans = _Scans(monkeypatch, consensus)
    with pytest.raises(ps.UpperMismatch):
        loser._machine.commit(Append(1, 2, Batch("b", 1, 2, ()), id="loser"), base=stale)
    monkeypatch.undo()
    return scans.calls


def test_a_lost_race_on_a_database_is_certain_no_extra_scan(db_url, tmp_path, monkeypatch):
    """A compare-and-set on a database is one transaction, and a failed connection raises
    (`Indeterminate` or `ConnectionError`) rather than returning False: a False is a race
    lost to another writer, certainly. So a commit that loses a race and then fails its
    precondition is refused without first scanning the log for its own id."""
    assert open_consensus(db_url, f"{tmp_path}/any").certain_lost_races
    distrusted = _refused_after_a_lost_race(
        db_url, f"{tmp_path}/distrusted", monkeypatch, trust=False
    )
    trusted = _refused_after_a_lost_race(db_url, f"{tmp_path}/trusted", monkeypatch, trust=True)
    assert distrusted.count(2) == trusted.count(2) + 1, (distrusted, trusted)  # find_commit's


def test_a_lost_database_response_is_still_resolved(db_url, tmp_path):
    """The database applied a compare-and-set and its answer was lost (`FaultyConsensus`:
    applied, then ``TimeoutError``): the append lands once, reported as a success, with the
    lost race certainty declared."""
    location = f"{tmp_path}/lost-answer"
    shard = open_shard(location, consensus=db_url)
    shard.compare_and_append(pa.table({"id": [0], "_time": [0], "_diff": [1]}), 0, 1)
    faulty = FaultyConsensus(shard._machine.consensus, fail_after=1.0)
    shard._machine.consensus = faulty
    assert faulty.certain_lost_races
    shard.compare_and_append(pa.table({"id": [1], "_time": [1], "_diff": [1]}), 1, 2)
    assert faulty.injected >= 1
    faulty.fail_after = 0.0
    shard.append(pa.table({"id": [2], "_time": [2], "_diff": [1]}))
    clean = Shard(location, consensus=db_url)
    assert clean.upper == 3
    assert rows_of(clean.snapshot()) == {(0,): 1, (1,): 1, (2,): 1}

"""Consensus in a database: `SqliteConsensus` (one machine) and `PostgresConsensus` (shared).

Both keep every shard's log in two tables of one database, keyed by the shard's id, so one
database serves many shards:

- ``persistshard_consensus (shard, version, data)``, primary key ``(shard, version)``: the
  entries;
- ``persistshard_heads (shard, head)``, primary key ``shard``: the shard's current head
  version. The row is created by the first compare-and-set and never deleted;
- ``persistshard_identity (name, value)``: the database's own random id (row
  ``database_id``), made with the tables (or on the first connection of this version to a
  database made before) and never changed. A shard's identity marker next to its data
  (`persistshard.core.storage.consensus.LogHome`) names it, so a shard opened with a URL of
  another database is refused, and any URL of the same database (another spelling of the
  same SQLite file) is accepted.

Which key (the ``shard`` column): an object built for a shard (``open_consensus(url,
location, home=blob)``, what `persistshard.core.shard.Shard` does) reads the shard's marker
on first use (one get; kept for the object's life) and keys the log by the shard id in it;
before the marker exists the log is empty, and the first compare-and-set creates the marker
first (`persistshard.core.storage.consensus.mark_log_home`). A shard logged here before shard
ids (a legacy marker, `LEGACY_LOG_HOME_KEY`, holding only the redacted URL) keeps its old key:
the location string it was written under, found among this database's keys by canonical
location (one query on open), so its history is neither moved nor rewritten. An object built
without ``home`` keys by the string it was given (the consensus contract, tools).

What always holds (the `persistshard.core.storage.consensus` contract):
- An entry is inserted only in the same transaction that moves ``head`` from ``expected`` to
  ``expected + 1`` (the conditional ``UPDATE ... WHERE head = expected``, or for an empty log
  the ``INSERT`` of the heads row that conflicts with any existing one). So a compare-and-set
  succeeds iff ``expected`` is the head at that moment, and at most one of any racing callers
  succeeds: the database serialises them on the heads row.
- Truncation deletes only entries below both ``below`` and the head, and never touches the
  heads row. A writer that read a version long ago cannot re-create it after truncation: its
  ``expected`` is no longer the head, whatever entries are left. (The blob consensus needs
  predecessor digests for this; here the heads row is the low-water mark's other end.)
- Reads are single statements on committed data, so once a compare-and-set returned True every
  later `head` (on any connection) returns that version or a newer one: linearizable.
- PostgreSQL does a compare-and-set in one round trip: one statement whose data-modifying CTE
  moves the head and whose ``INSERT`` takes the entry from it (autocommit: one transaction).
  SQLite runs ``BEGIN IMMEDIATE``, the conditional update, the insert and ``COMMIT`` (WAL mode,
  so readers never wait on a writer).
- A compare-and-set whose connection fails after the statement was sent raises `Indeterminate`
  (it may have been applied; the state machine resolves it by reading its commit id back);
  its False is therefore certain (`Consensus.certain_lost_races`: a refusal after a lost race
  needs no scan of the log for the commit's own id). A
  read or truncation is tried once more on a new connection, then raises `ConnectionError` (an
  `OSError`, which the state machine retries). A failed connection is dropped; the next call
  opens a new one.
- Credentials never leave this module: `redact_url` is what ``repr``, logs and messages show.
  Connections are opened lazily and never pickled, so an object built on the Spark driver can
  travel to executors (each process opens its own connection).

`open_consensus` builds one from a URL: ``sqlite:///relative.db`` or ``sqlite:////abs.db``
(an absolute path is what Spark needs: executors may have another working directory), and
``postgresql://user:password@host:port/database?...`` (psycopg 3, the ``postgres`` extra; any
libpq parameter in the query string).
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
import urllib.parse
import uuid
from typing import Any

from persistshard.core.storage.blob import Blob
from persistshard.core.storage.consensus import (
    Consensus,
    DatabaseLog,
    LogHome,
    VersionedData,
    mark_log_home,
    read_log_home,
    refuse_other_home,
)
from persistshard.core.storage.layout import canonical_location
from persistshard.errors import CorruptData, Indeterminate, InvalidOption

log = logging.getLogger("persistshard.core.storage.sqlconsensus")

ENTRIES = "persistshard_consensus"
HEADS = "persistshard_heads"
IDENTITY = "persistshard_identity"

SQLITE_SCHEMES = ("sqlite",)
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


def is_consensus_url(url: str) -> bool:
    """Whether ``url`` names a database consensus this module can open."""
    scheme = url.split(":", 1)[0].lower()
    return scheme in SQLITE_SCHEMES + POSTGRES_SCHEMES


def redact_url(url: str) -> str:
    """``url`` without secrets: the password and every query value are replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable consensus URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}{':***' if ':' in userinfo else ''}@{host}"
    query = "&".join(
        f"{k}=***" for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    )
    if netloc == parts.netloc and not query:
        return url.split("#", 1)[0]  # nothing secret (and sqlite:////abs keeps its slashes)
    return f"{parts.scheme}://{netloc}{parts.path}{'?' + query if query else ''}"


def url_has_password(url: str) -> bool:
    """Whether ``url`` carries a password (in its user info or as a query parameter)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return True  # cannot tell: treat as secret
    userinfo = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
    if ":" in userinfo:
        return True
    keys = {k.lower() for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)}
    return bool(keys & {"password", "passfile", "sslpassword"})


def open_consensus(url: str, shard: str, home: Blob | None = None) -> Consensus:
    """The database consensus named by ``url``, holding the log of the shard at ``shard``:
    keyed by the shard id recorded in ``home`` (the shard's blob; see the module docstring),
    or without ``home`` by the string ``shard`` itself."""
    scheme = url.split(":", 1)[0].lower()
    if scheme in SQLITE_SCHEMES:
        return SqliteConsensus(url, shard, home)
    if scheme in POSTGRES_SCHEMES:
        return PostgresConsensus(url, shard, home)
    raise InvalidOption(
        f"consensus {redact_url(url)!r} is no consensus URL this version knows; use "
        "sqlite:///path/to/file.db (one machine) or postgresql://user@host:port/database",
        location=shard,
    )


class _SqlConsensus(Consensus, DatabaseLog):
    """What both databases share: the log key, the URL kept out of sight, lazy connections,
    the database's identity."""

    def __init__(self, url: str, shard: str, home: Blob | None = None) -> None:
        self._url = url
        #: The shard's (canonical) location: what messages name; the key without ``home``.
        self.shard = shard
        self.redacted = redact_url(url)
        self._conn: Any = None
        self._pid = 0
        self._lock = threading.Lock()
        self._home = home
        #: The log's key once known (see the module docstring); None: not resolved yet.
        self._key: str | None = None if home is not None else shard
        self._database: str | None = None  # the database id, read on each new connection

    def attach(self, home: Blob) -> None:
        """Key this object's log by the id of the shard whose data is in ``home`` (what
        `persistshard.core.shard.Shard` does with a consensus object it is given)."""
        if self._home is None:
            self._home, self._key = home, None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.redacted!r}, shard={self.shard!r})"

    __str__ = __repr__

    @property
    def cache_key(self) -> str:
        return f"{type(self).__name__}:{self._url}#{self._key or self.shard}"

    @property
    def certain_lost_races(self) -> bool:
        """True: a False from `compare_and_set` is certain. The head moves and the entry is
        inserted in one transaction that this object sends once (no driver retries it): a
        False is returned only after that transaction committed having moved no head row
        (another writer's version is there), or when the log is empty and ``expected`` is
        not (no marker: nothing was ever written). A connection that fails anywhere raises
        (`Indeterminate` once the statement may have run, `ConnectionError` before), never
        returns False. So the state machine reports a refusal after a lost race without
        scanning the log for its own commit first."""
        return True

    def database_id(self) -> str:
        with self._lock:
            self._connect_for("read the database id")
            assert self._database is not None  # set by every connect that may create
            return self._database

    def existing_database_id(self) -> str | None:
        with self._lock:
            self._connect_for("read the database id", create=False)
            return self._database

    def bind_log(self, shard_id: str) -> None:
        self._key = shard_id

    def _log_key(self) -> str | None:
        """The log's key, resolved from the shard's marker on first use (the module
        docstring): None while the shard has no identity yet (its log is empty). Refuses
        (`InvalidOption`, nothing written) a shard whose log is not in this database."""
        if self._key is not None or self._home is None:
            return self._key
        home = read_log_home(self._home, self.shard)
        if home is None:
            return None
        refuse_other_home(home, self, self.shard)
        if not home.legacy:
            assert home.shard_id is not None
            self._key = home.shard_id
            return self._key
        key = self._legacy_key(home)
        if key is not None:
            self._key = key
        return key

    def _legacy_key(self, home: LogHome) -> str | None:
        """The key of a shard logged here before shard ids: the one location string among
        this database's keys that names the same place; None if this database holds none (the
        shard's first write never landed: it is made anew on this database, if the legacy
        marker names this database; else `InvalidOption`)."""
        same = self._names_this_database(home.consensus)
        if same is False:
            raise InvalidOption(
                f"the shard keeps its log in another database: {home.consensus}, not "
                f"{self.redacted}; open it with the consensus that holds its log. Nothing was "
                "written",
                location=self.shard,
            )
        keys = [k for k in self._keys() if _same_place(k, self.shard)]
        if not keys:
            if same is None:
                raise InvalidOption(
                    f"the shard keeps its log in the database {home.consensus}, and "
                    f"{self.redacted} holds no log of it: open it with that consensus. "
                    "Nothing was written",
                    location=self.shard,
                )
            return None
        if self.shard in keys:
            return self.shard
        if len(keys) > 1:
            raise CorruptData(
                f"the database {self.redacted} holds {len(keys)} logs of this location under "
                f"different spellings ({', '.join(keys)}), written before shard ids: two "
                "histories over the same data; keep the right one and delete the others' rows",
                location=self.shard,
            )
        log.info("%s: legacy database log keyed %r", self.shard, keys[0])
        return keys[0]

    def _key_to_write(self, base: int) -> str | None:
        """The key a compare-and-set on ``base`` writes under: for the first version of a
        shard with no identity yet, the one `mark_log_home` records first (the state machine
        has done that already; a direct caller gets it done here). None: the log is empty,
        so a compare-and-set on a ``base`` above 0 fails."""
        key = self._log_key()
        if key is None and base == 0 and self._home is not None:
            mark_log_home(self._home, self, self.shard)
            key = self._key
        return key

    def _names_this_database(self, redacted: str) -> bool | None:
        """Whether a legacy marker's redacted URL names this database: True, False, or None
        when the URL alone cannot tell (then the rows decide)."""
        raise NotImplementedError

    def _keys(self) -> list[str]:
        """Every log key in this database (only to find a legacy shard's)."""
        raise NotImplementedError

    def _connect_for(self, doing: str, create: bool = True) -> Any:
        """The connection (`_unreachable` if it fails). ``create``: make the tables and the
        database id if missing; without it nothing is written (a SQLite file that does not
        exist is not created, and ``_database`` stays None for a database without an id)."""
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_conn"] = None  # a connection belongs to one process
        state["_pid"] = 0
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def entry_name(self, version: int) -> str:
        return f"consensus version {version} in {self.redacted}"

    def _scrub(self, error: BaseException) -> str:
        """The error's text with any secret of the URL removed."""
        text = f"{type(error).__name__}: {error}"
        for secret in _secrets(self._url):
            text = text.replace(secret, "***")
        return text

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: nothing more to release
                pass

    def close(self) -> None:
        """Close this object's connection (the next call opens a new one)."""
        with self._lock:
            self._drop()

    def _unreachable(self, doing: str, error: BaseException) -> ConnectionError:
        self._drop()
        log.info("consensus %s: %s failed: %s", self.redacted, doing, self._scrub(error))
        return ConnectionError(
            f"consensus database {self.redacted} failed to {doing} for shard {self.shard}: "
            f"{self._scrub(error)}; nothing was changed, try again when it is reachable"
        )

    def _indeterminate(self, version: int, error: BaseException) -> Indeterminate:
        self._drop()
        log.warning(
            "consensus %s: compare-and-set of version %d may or may not have applied: %s",
            self.redacted,
            version,
            self._scrub(error),
        )
        return Indeterminate(
            f"the connection to consensus database {self.redacted} failed during the "
            f"compare-and-set of version {version} ({self._scrub(error)}); it may have been "
            "applied: re-read the shard",
            location=self.shard,
        )


def _secrets(url: str) -> list[str]:
    out = []
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return [url]
    if parts.password:
        out += [parts.password, urllib.parse.unquote(parts.password)]
    out += [v for _, v in urllib.parse.parse_qsl(parts.query) if len(v) >= 3]
    return [s for s in out if s]


def _same_place(key: str, location: str) -> bool:
    """Whether the log key ``key`` (a location string, as keys were before shard ids) names
    the place whose canonical location is ``location``."""
    if ":" not in key:
        return False  # a shard id, or a key a tool chose: not a location
    try:
        return canonical_location(key) == location
    except (InvalidOption, ValueError, OSError):
        return False


def _new_database_id() -> str:
    return uuid.uuid4().hex


def _sqlite_path(url: str) -> str | None:
    """The file a ``sqlite:///...`` URL names, unresolved; None if it names none."""
    rest = url.split(":", 1)[1] if ":" in url else ""
    if not rest.startswith("///"):
        return None
    path = urllib.parse.unquote(rest[3:].split("?", 1)[0])
    return None if not path or path == ":memory:" else path


class SqliteConsensus(_SqlConsensus):
    """The log in a SQLite file (WAL mode): shared by the processes of one machine.

    SQLite's file locks do not work over network file systems: use it on a local disk, for
    one machine (Spark ``local[*]`` or ``local-cluster``), and PostgreSQL for a cluster."""

    def __init__(self, url: str, shard: str, home: Blob | None = None) -> None:
        super().__init__(url, shard, home)
        if not url.split(":", 1)[1].startswith("///"):
            raise InvalidOption(
                f"consensus {self.redacted!r}: a SQLite URL is sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db",
                location=shard,
            )
        path = _sqlite_path(url)
        if path is None:
            raise InvalidOption(
                f"consensus {self.redacted!r} names no file; an in-memory SQLite database "
                "lives in one connection, use MemoryConsensus for that",
                location=shard,
            )
        self.path = os.path.abspath(os.path.expanduser(path))

    def _connect(self) -> sqlite3.Connection:
        conn = self._open(create=True)
        assert conn is not None
        return conn

    def _open(self, create: bool) -> sqlite3.Connection | None:
        """The connection, set up (`_set_up`) when ``create`` or when the database has an id
        already; without ``create``, a missing file is not created (None) and a database
        without an id is left untouched (``_database`` None) until a call that may create."""
        if self._conn is not None and self._pid == os.getpid():
            if self._database is not None or not create:
                return self._conn  # type: ignore[no-any-return]
            conn: sqlite3.Connection = self._conn  # opened without creating: set it up now
        else:
            self._conn, self._database = None, None
            if not create and not os.path.exists(self.path):
                return None
            # One connection per object, used under its lock from whichever thread calls.
            conn = sqlite3.connect(
                self.path, timeout=60.0, isolation_level=None, check_same_thread=False
            )
        # Switching a new file to WAL and creating the tables take locks for which SQLite
        # does not always wait (it answers "database is locked" at once when several
        # processes open a new database together): retry those, with backoff, up to the
        # connection's own timeout.
        deadline = time.monotonic() + 60.0
        attempt = 0
        while True:
            try:
                self._database = _peek_database_id(conn, sqlite3.OperationalError)
                if create or self._database is not None:
                    self._set_up(conn)
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() >= deadline:
                    conn.close()
                    self._conn, self._database = None, None
                    raise
                attempt += 1
                time.sleep(min(1.0, 0.01 * 2**attempt) * random.random())
            except BaseException:
                conn.close()
                self._conn, self._database = None, None
                raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _connect_for(self, doing: str, create: bool = True) -> Any:
        try:
            return self._open(create)
        except sqlite3.Error as e:
            raise self._unreachable(doing, e) from e

    def _keys(self) -> list[str]:
        with self._lock:
            try:
                rows = self._connect().execute(f"SELECT shard FROM {HEADS}").fetchall()
            except sqlite3.Error as e:
                raise self._unreachable("list the logs", e) from e
        return [str(r[0]) for r in rows]

    def _names_this_database(self, redacted: str) -> bool | None:
        if redacted.split(":", 1)[0].lower() not in SQLITE_SCHEMES:
            return False
        path = _sqlite_path(redacted)
        if path is None or not os.path.isabs(os.path.expanduser(path)):
            return None  # relative to a working directory we do not know
        path = os.path.expanduser(path)
        try:
            return os.path.samefile(path, self.path)
        except OSError:
            return os.path.realpath(path) == os.path.realpath(self.path)

    def _set_up(self, conn: sqlite3.Connection) -> None:
        """WAL mode, full sync, the two tables and the database's identity (idempotent)."""
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            log.warning("consensus %s: SQLite did not switch to WAL mode", self.redacted)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {ENTRIES} (shard TEXT NOT NULL, "
            "version INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (shard, version))"
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {HEADS} (shard TEXT PRIMARY KEY, head INTEGER NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {IDENTITY} (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )
        self._database = _read_database_id(conn, "?")

    def head(self) -> VersionedData | None:
        key = self._log_key()
        if key is None:
            return None
        with self._lock:
            try:
                row = (
                    self._connect()
                    .execute(
                        f"SELECT version, data FROM {ENTRIES} WHERE shard = ? "
                        "ORDER BY version DESC LIMIT 1",
                        (key,),
                    )
                    .fetchone()
                )
            except sqlite3.Error as e:
                raise self._unreachable("read the head", e) from e
        return None if row is None else VersionedData(int(row[0]), bytes(row[1]))

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        base = expected or 0
        key = self._key_to_write(base)
        if key is None:
            return False
        with self._lock:
            try:
                conn = self._connect()
            except sqlite3.Error as e:
                raise self._unreachable("connect", e) from e
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:  # nothing was written
                raise self._unreachable("begin a compare-and-set", e) from e
            try:
                if base == 0:
                    moved = conn.execute(
                        f"INSERT OR IGNORE INTO {HEADS} (shard, head) VALUES (?, 1)",
                        (key,),
                    ).rowcount
                else:
                    moved = conn.execute(
                        f"UPDATE {HEADS} SET head = head + 1 WHERE shard = ? AND head = ?",
                        (key, base),
                    ).rowcount
                if moved == 1:
                    conn.execute(
                        f"INSERT INTO {ENTRIES} (shard, version, data) VALUES (?, ?, ?)",
                        (key, base + 1, data),
                    )
            except sqlite3.Error as e:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    raise self._indeterminate(base + 1, e) from e
                raise self._unreachable("compare-and-set", e) from e
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                raise self._indeterminate(base + 1, e) from e
        return moved == 1

    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        key = self._log_key()
        if key is None:
            return []
        with self._lock:
            try:
                rows = (
                    self._connect()
                    .execute(
                        f"SELECT version, data FROM {ENTRIES} WHERE shard = ? AND version >= ? "
                        "ORDER BY version LIMIT ?",
                        (key, from_version, -1 if limit is None else limit),
                    )
                    .fetchall()
                )
            except sqlite3.Error as e:
                raise self._unreachable("scan the log", e) from e
        return [VersionedData(int(v), bytes(d)) for v, d in rows]

    def truncate(self, below: int) -> int:
        key = self._log_key()
        if key is None:
            return 0
        with self._lock:
            try:
                cur = self._connect().execute(
                    f"DELETE FROM {ENTRIES} WHERE shard = ? AND version < ? AND version < "
                    f"(SELECT head FROM {HEADS} WHERE shard = ?)",
                    (key, below, key),
                )
            except sqlite3.Error as e:
                raise self._unreachable("truncate the log", e) from e
        return max(0, cur.rowcount)

    def destroy(self) -> None:
        """`Consensus.destroy`: the shard's entries, then its heads row (each statement
        idempotent; a crash between them leaves an empty log)."""
        key = self._log_key()
        if key is None:
            return
        with self._lock:
            try:
                conn = self._connect()
                conn.execute(f"DELETE FROM {ENTRIES} WHERE shard = ?", (key,))
                conn.execute(f"DELETE FROM {HEADS} WHERE shard = ?", (key,))
            except sqlite3.Error as e:
                raise self._unreachable("delete the log", e) from e


class PostgresConsensus(_SqlConsensus):
    """The log in PostgreSQL (psycopg 3, autocommit): shared by every machine that reaches it.

    One round trip per compare-and-set, read and truncation; the tables are created on the
    first connection (``CREATE TABLE IF NOT EXISTS``; the user needs that right once)."""

    def __init__(self, url: str, shard: str, home: Blob | None = None) -> None:
        super().__init__(url, shard, home)
        rest = url.split(":", 1)[1]
        self._dsn = "postgresql:" + rest  # libpq knows postgresql:// and postgres:// only

    def _connect(self, create: bool = True) -> Any:
        """The connection. A database with an id needs no DDL (its tables were made with
        it); one without gets the tables and an id when ``create``, else is left untouched
        (``_database`` None)."""
        if self._conn is not None and self._pid == os.getpid() and not self._conn.closed:
            if self._database is not None or not create:
                return self._conn
            conn = self._conn
        else:
            self._conn, self._database = None, None
            psycopg = self._psycopg()
            kwargs: dict[str, Any] = {"autocommit": True}
            if "connect_timeout" not in self._dsn:
                kwargs["connect_timeout"] = 10
            conn = psycopg.connect(self._dsn, **kwargs)
        try:
            self._database = _peek_database_id(conn, self._psycopg().errors.UndefinedTable)
            if self._database is None and create:
                _create_tables(conn)
                self._database = _read_database_id(conn, "%s")
        except BaseException:
            conn.close()
            self._conn, self._database = None, None
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _connect_for(self, doing: str, create: bool = True) -> Any:
        errors = self._errors()
        try:
            return self._connect(create)
        except errors as e:
            raise self._unreachable(doing, e) from e

    def _keys(self) -> list[str]:
        rows = self._run("list the logs", f"SELECT shard FROM {HEADS}", ()).fetchall()
        return [str(r[0]) for r in rows]

    def _names_this_database(self, redacted: str) -> bool | None:
        if redacted.split(":", 1)[0].lower() not in POSTGRES_SCHEMES:
            return False
        theirs, mine = _pg_address(redacted), _pg_address(self._dsn)
        if theirs is None or mine is None:
            return None
        if theirs[2] != mine[2]:
            return False  # another database name: another database
        return True if theirs == mine else None  # another host spelling may be the same server

    def _psycopg(self) -> Any:
        try:
            import psycopg
        except ImportError as e:  # pragma: no cover - depends on the installed extras
            raise InvalidOption(
                f"consensus {self.redacted} needs psycopg 3: pip install 'persistshard[postgres]'",
                location=self.shard,
            ) from e
        return psycopg

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (self._psycopg().Error,)

    def backend_pid(self) -> int:
        """The server process of this object's connection (what ``pg_terminate_backend``
        takes; tests use it to drop the connection)."""
        with self._lock:
            return int(self._connect().info.backend_pid)

    def _run(self, doing: str, sql: str, params: Any) -> Any:
        """Run an idempotent statement (a read, a truncation); once more on a new connection
        when the old one was dropped (a server restart, an idle timeout)."""
        errors = self._errors()
        with self._lock:
            for attempt in (1, 2):
                try:
                    return self._connect().execute(sql, params)
                except errors as e:
                    failure = self._unreachable(doing, e)
                    if attempt == 2:
                        raise failure from e
        raise AssertionError("unreachable")  # pragma: no cover

    def head(self) -> VersionedData | None:
        key = self._log_key()
        if key is None:
            return None
        row = self._run(
            "read the head",
            f"SELECT version, data FROM {ENTRIES} WHERE shard = %s ORDER BY version DESC LIMIT 1",
            (key,),
        ).fetchone()
        return None if row is None else VersionedData(int(row[0]), bytes(row[1]))

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        base = expected or 0
        if base == 0:
            moved = (
                f"INSERT INTO {HEADS} (shard, head) VALUES (%(shard)s, 1) "
                "ON CONFLICT (shard) DO NOTHING RETURNING head"
            )
        else:
            moved = (
                f"UPDATE {HEADS} SET head = head + 1 "
                "WHERE shard = %(shard)s AND head = %(base)s RETURNING head"
            )
        sql = (
            f"WITH moved AS ({moved}) INSERT INTO {ENTRIES} (shard, version, data) "
            "SELECT %(shard)s, head, %(data)s FROM moved"
        )
        key = self._key_to_write(base)
        if key is None:
            return False
        errors = self._errors()
        with self._lock:
            try:
                conn = self._connect()
            except errors as e:
                raise self._unreachable("connect", e) from e
            try:
                cur = conn.execute(sql, {"shard": key, "base": base, "data": data})
            except errors as e:
                raise self._indeterminate(base + 1, e) from e
        return int(cur.rowcount) == 1

    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        key = self._log_key()
        if key is None:
            return []
        rows = self._run(
            "scan the log",
            f"SELECT version, data FROM {ENTRIES} WHERE shard = %s AND version >= %s "
            "ORDER BY version LIMIT %s",
            (key, from_version, limit),
        ).fetchall()
        return [VersionedData(int(v), bytes(d)) for v, d in rows]

    def truncate(self, below: int) -> int:
        key = self._log_key()
        if key is None:
            return 0
        cur = self._run(
            "truncate the log",
            f"DELETE FROM {ENTRIES} WHERE shard = %(shard)s AND version < %(below)s "
            f"AND version < (SELECT head FROM {HEADS} WHERE shard = %(shard)s)",
            {"shard": key, "below": below},
        )
        return max(0, int(cur.rowcount))

    def destroy(self) -> None:
        """`Consensus.destroy`: the shard's entries, then its heads row (each statement
        idempotent; a crash between them leaves an empty log)."""
        key = self._log_key()
        if key is None:
            return
        self._run("delete the log", f"DELETE FROM {ENTRIES} WHERE shard = %s", (key,))
        self._run("delete the log", f"DELETE FROM {HEADS} WHERE shard = %s", (key,))


def _create_tables(conn: Any) -> None:
    """Create the two tables if missing; a concurrent creator winning the race is fine."""
    import psycopg

    for ddl in (
        f"CREATE TABLE IF NOT EXISTS {ENTRIES} (shard TEXT NOT NULL, version BIGINT NOT NULL, "
        "data BYTEA NOT NULL, PRIMARY KEY (shard, version))",
        f"CREATE TABLE IF NOT EXISTS {HEADS} (shard TEXT PRIMARY KEY, head BIGINT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {IDENTITY} (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ):
        try:
            conn.execute(ddl)
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            pass  # created by a racing connection between the check and the create


def _peek_database_id(conn: Any, missing: type[BaseException]) -> str | None:
    """The database's id, or None when it has none (no ``persistshard_identity`` table:
    ``missing`` is the driver's error for that, or no row). Writes nothing."""
    try:
        row = conn.execute(f"SELECT value FROM {IDENTITY} WHERE name = 'database_id'").fetchone()
    except missing as e:
        if "no such table" in str(e) or "does not exist" in str(e):
            return None
        raise
    return None if row is None else str(row[0])


def _read_database_id(conn: Any, mark: str) -> str:
    """The database's id (``persistshard_identity``), made here if it has none yet: a random
    value inserted unless a row exists (a racing connection's insert wins the same way), then
    read back, so every connection to one database reads the same id forever. ``mark`` is the
    driver's parameter mark. A read when it exists (every connection after the first)."""
    select = f"SELECT value FROM {IDENTITY} WHERE name = 'database_id'"
    row = conn.execute(select).fetchone()
    if row is None:
        conn.execute(
            f"INSERT INTO {IDENTITY} (name, value) VALUES ('database_id', {mark}) "
            "ON CONFLICT (name) DO NOTHING",
            (_new_database_id(),),
        )
        row = conn.execute(select).fetchone()
    if row is None:  # pragma: no cover - the insert above or a racing one made it
        raise ConnectionError("the database id could not be read back after it was created")
    return str(row[0])


def _pg_address(url: str) -> tuple[str, int, str] | None:
    """(host, port, database name) of a PostgreSQL URL, lower-cased host, default port 5432;
    None when the URL does not say (a socket directory or service in the query string)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or 5432
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    name = urllib.parse.unquote(parts.path.lstrip("/"))
    if not host or not name:
        return None
    return host, port, name

"""Consensus in a database: `SqliteConsensus` (one machine) and `PostgresConsensus` (shared).

Both keep every shard's log in two tables of one database, keyed by the shard's location, so
one database serves many shards:

- ``persistshard_consensus (shard, version, data)``, primary key ``(shard, version)``: the
  entries;
- ``persistshard_heads (shard, head)``, primary key ``shard``: the shard's current head
  version. The row is created by the first compare-and-set and never deleted.

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
  (it may have been applied; the state machine resolves it by reading its commit id back). A
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
from typing import Any

from persistshard.core.storage.consensus import Consensus, VersionedData
from persistshard.errors import Indeterminate, InvalidUpdates

log = logging.getLogger("persistshard.core.storage.sqlconsensus")

ENTRIES = "persistshard_consensus"
HEADS = "persistshard_heads"

SQLITE_SCHEMES = ("sqlite",)
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")

#: The option (Spark, SQL, CLI) and keyword (`persistshard.core.shard.Shard`) that name it.
CONSENSUS_OPTION = "consensus"


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


def open_consensus(url: str, shard: str) -> Consensus:
    """The database consensus named by ``url``, holding the log of the shard at ``shard``."""
    scheme = url.split(":", 1)[0].lower()
    if scheme in SQLITE_SCHEMES:
        return SqliteConsensus(url, shard)
    if scheme in POSTGRES_SCHEMES:
        return PostgresConsensus(url, shard)
    raise InvalidUpdates(
        f"consensus {redact_url(url)!r} is no consensus URL this version knows; use "
        "sqlite:///path/to/file.db (one machine) or postgresql://user@host:port/database",
        location=shard,
    )


class _SqlConsensus(Consensus):
    """What both databases share: the shard key, the URL kept out of sight, lazy connections."""

    def __init__(self, url: str, shard: str) -> None:
        self._url = url
        self.shard = shard
        self.redacted = redact_url(url)
        self._conn: Any = None
        self._pid = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.redacted!r}, shard={self.shard!r})"

    __str__ = __repr__

    @property
    def cache_key(self) -> str:
        return f"{type(self).__name__}:{self._url}#{self.shard}"

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


class SqliteConsensus(_SqlConsensus):
    """The log in a SQLite file (WAL mode): shared by the processes of one machine.

    SQLite's file locks do not work over network file systems: use it on a local disk, for
    one machine (Spark ``local[*]`` or ``local-cluster``), and PostgreSQL for a cluster."""

    def __init__(self, url: str, shard: str) -> None:
        super().__init__(url, shard)
        path = url.split(":", 1)[1]
        if not path.startswith("///"):
            raise InvalidUpdates(
                f"consensus {self.redacted!r}: a SQLite URL is sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db",
                location=shard,
            )
        path = urllib.parse.unquote(path[3:].split("?", 1)[0])
        if not path or path == ":memory:":
            raise InvalidUpdates(
                f"consensus {self.redacted!r} names no file; an in-memory SQLite database "
                "lives in one connection, use MemoryConsensus for that",
                location=shard,
            )
        self.path = os.path.abspath(os.path.expanduser(path))

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn  # type: ignore[no-any-return]
        self._conn = None
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
                self._set_up(conn)
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() >= deadline:
                    conn.close()
                    raise
                attempt += 1
                time.sleep(min(1.0, 0.01 * 2**attempt) * random.random())
            except BaseException:
                conn.close()
                raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        """WAL mode, full sync, and the two tables (idempotent)."""
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

    def head(self) -> VersionedData | None:
        with self._lock:
            try:
                row = (
                    self._connect()
                    .execute(
                        f"SELECT version, data FROM {ENTRIES} WHERE shard = ? "
                        "ORDER BY version DESC LIMIT 1",
                        (self.shard,),
                    )
                    .fetchone()
                )
            except sqlite3.Error as e:
                raise self._unreachable("read the head", e) from e
        return None if row is None else VersionedData(int(row[0]), bytes(row[1]))

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        base = expected or 0
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
                        (self.shard,),
                    ).rowcount
                else:
                    moved = conn.execute(
                        f"UPDATE {HEADS} SET head = head + 1 WHERE shard = ? AND head = ?",
                        (self.shard, base),
                    ).rowcount
                if moved == 1:
                    conn.execute(
                        f"INSERT INTO {ENTRIES} (shard, version, data) VALUES (?, ?, ?)",
                        (self.shard, base + 1, data),
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
        with self._lock:
            try:
                rows = (
                    self._connect()
                    .execute(
                        f"SELECT version, data FROM {ENTRIES} WHERE shard = ? AND version >= ? "
                        "ORDER BY version LIMIT ?",
                        (self.shard, from_version, -1 if limit is None else limit),
                    )
                    .fetchall()
                )
            except sqlite3.Error as e:
                raise self._unreachable("scan the log", e) from e
        return [VersionedData(int(v), bytes(d)) for v, d in rows]

    def truncate(self, below: int) -> int:
        with self._lock:
            try:
                cur = self._connect().execute(
                    f"DELETE FROM {ENTRIES} WHERE shard = ? AND version < ? AND version < "
                    f"(SELECT head FROM {HEADS} WHERE shard = ?)",
                    (self.shard, below, self.shard),
                )
            except sqlite3.Error as e:
                raise self._unreachable("truncate the log", e) from e
        return max(0, cur.rowcount)


class PostgresConsensus(_SqlConsensus):
    """The log in PostgreSQL (psycopg 3, autocommit): shared by every machine that reaches it.

    One round trip per compare-and-set, read and truncation; the tables are created on the
    first connection (``CREATE TABLE IF NOT EXISTS``; the user needs that right once)."""

    def __init__(self, url: str, shard: str) -> None:
        super().__init__(url, shard)
        rest = url.split(":", 1)[1]
        self._dsn = "postgresql:" + rest  # libpq knows postgresql:// and postgres:// only

    def _connect(self) -> Any:
        if self._conn is not None and self._pid == os.getpid() and not self._conn.closed:
            return self._conn
        self._conn = None
        psycopg = self._psycopg()
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in self._dsn:
            kwargs["connect_timeout"] = 10
        conn = psycopg.connect(self._dsn, **kwargs)
        try:
            _create_tables(conn)
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _psycopg(self) -> Any:
        try:
            import psycopg
        except ImportError as e:  # pragma: no cover - depends on the installed extras
            raise InvalidUpdates(
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
        row = self._run(
            "read the head",
            f"SELECT version, data FROM {ENTRIES} WHERE shard = %s ORDER BY version DESC LIMIT 1",
            (self.shard,),
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
        errors = self._errors()
        with self._lock:
            try:
                conn = self._connect()
            except errors as e:
                raise self._unreachable("connect", e) from e
            try:
                cur = conn.execute(sql, {"shard": self.shard, "base": base, "data": data})
            except errors as e:
                raise self._indeterminate(base + 1, e) from e
        return int(cur.rowcount) == 1

    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        rows = self._run(
            "scan the log",
            f"SELECT version, data FROM {ENTRIES} WHERE shard = %s AND version >= %s "
            "ORDER BY version LIMIT %s",
            (self.shard, from_version, limit),
        ).fetchall()
        return [VersionedData(int(v), bytes(d)) for v, d in rows]

    def truncate(self, below: int) -> int:
        cur = self._run(
            "truncate the log",
            f"DELETE FROM {ENTRIES} WHERE shard = %(shard)s AND version < %(below)s "
            f"AND version < (SELECT head FROM {HEADS} WHERE shard = %(shard)s)",
            {"shard": self.shard, "below": below},
        )
        return max(0, int(cur.rowcount))


def _create_tables(conn: Any) -> None:
    """Create the two tables if missing; a concurrent creator winning the race is fine."""
    import psycopg

    for ddl in (
        f"CREATE TABLE IF NOT EXISTS {ENTRIES} (shard TEXT NOT NULL, version BIGINT NOT NULL, "
        "data BYTEA NOT NULL, PRIMARY KEY (shard, version))",
        f"CREATE TABLE IF NOT EXISTS {HEADS} (shard TEXT PRIMARY KEY, head BIGINT NOT NULL)",
    ):
        try:
            conn.execute(ddl)
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            pass  # created by a racing connection between the check and the create

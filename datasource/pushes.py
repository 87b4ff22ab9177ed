"""The push ledger: which pushed filters a Spark scan of a relation may apply (Spark 4.3).

Spark 4.3 stores the read planned by a filter pushdown (partitions and reader) on the
*relation*, not on the scan, and plans a scan that has no pushable filter without asking
Python at all. So a scan runs whatever read the relation's latest push planned:

- two scans of one relation in one query (a table and a scalar subquery over it) both run the
  read of the last push;
- a later query over the same DataFrame or temporary view whose scan pushes nothing runs the
  read planned for an earlier query's filters.

The ledger keeps, per relation (the data source instance id) and on the host where Spark
plans, one record per push (a *generation*) and one *claim* per generation: the SQL execution
id of the first task that read it. A read applies its push's filters only when its task belongs
to the execution that claimed that push; any other execution (a later query that pushed
nothing, a re-run of the same plan, a task on another host that cannot see the ledger, a task
outside any SQL execution) reads unfiltered and lets Spark filter. A push's filter is the OR
of its own filters and those of every earlier push made since the newest claimed one (scans
planned for the same query), so a scan never runs a filter narrower than its own. Pushes at or
before the newest claimed one are dead: each push replaces the relation's read, and a physical
plan fixes its read when it first executes, so only plans that already executed (and claimed)
can still run them.

Invariants: a claim is created at most once (hard link, atomic create-if-absent) and never
changes; records are written before their generation is handed to Spark. Pruning: a push
record below the newest claimed generation is deleted by the next push (its read can only be
re-run, and a re-run whose record is gone reads unfiltered: slower, never wrong); claims are
kept, because a claim is what stops a second execution from claiming a push whose record it
saw just before the deletion; a relation's directory unused for `STALE_SECONDS` (a session
long gone) is deleted whole. Relied on: Spark
plans a session's queries one at a time, and a query's pushes happen before its execution
starts. Not covered (documented in docs/design.md): a push whose query never executes (only
``explain()``-ed) followed by a query over the same relation that pushes nothing: that query
claims the stale push and applies its filter.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass

from persistshard.core.filters import Pred

__all__ = ["LEDGER_DIR", "Push", "claimed_by", "record_push"]

#: Where the ledger lives: the temp directory of the host where Spark plans.
LEDGER_DIR = os.path.join(tempfile.gettempdir(), "persistshard-pushdown")

#: Unclaimed pushes of one relation beyond this many stop filtering (their OR is no filter).
MAX_PENDING = 32

#: A relation's ledger untouched this long is deleted by the next new relation's push.
STALE_SECONDS = 7 * 24 * 3600

_Entry = tuple[Pred | None, Pred | None]


@dataclass(frozen=True)
class Push:
    """One recorded push: the relation, its generation, and the filters its read applies
    (the OR over the pending pushes, this one included)."""

    instance_id: str
    generation: int
    entries: tuple[_Entry, ...]


def _dir(instance_id: str, root: str) -> str:
    return os.path.join(root, instance_id)


def _generations(directory: str) -> tuple[list[int], set[int]]:
    pushes, claims = [], set()
    for name in os.listdir(directory):
        stem, _, ext = name.partition(".")
        if not stem.isdigit():
            continue
        if ext == "push":
            pushes.append(int(stem))
        elif ext == "claim":
            claims.add(int(stem))
    return sorted(pushes), claims


def record_push(instance_id: str, entry: _Entry, *, root: str = LEDGER_DIR) -> Push:
    """Records a push of ``entry`` (row filter, result filter) for the relation
    ``instance_id`` and returns it with the entries of every unclaimed earlier push."""
    directory = _dir(instance_id, root)
    if not os.path.isdir(directory):
        _sweep_stale(root)
    os.makedirs(directory, exist_ok=True)
    pushes, claims = _generations(directory)
    newest_claimed = max(claims, default=-1)
    for gen in pushes:
        if gen < newest_claimed:  # dead (module docstring); its claim, if any, stays
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, f"{gen}.push"))
    entries: list[_Entry] = []
    for gen in pushes:
        if gen <= newest_claimed:
            continue  # claimed, or superseded before an execution began (module docstring)
        try:
            with open(os.path.join(directory, f"{gen}.push"), "rb") as f:
                entries.append(pickle.load(f))
        except FileNotFoundError:
            entries.append((None, None))  # unreadable: the widest filter, none
    entries.append(entry)
    if len(entries) > MAX_PENDING:
        entries = [(None, None)]
    # Past every claim too: records below the newest claim are pruned, claims are not.
    generation = max([*pushes, *claims], default=-1) + 1
    path = os.path.join(directory, f"{generation}.push")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(entry, f)
    os.replace(tmp, path)
    return Push(instance_id, generation, tuple(entries))


def _sweep_stale(root: str) -> None:
    """Delete the ledgers of relations that saw no push for `STALE_SECONDS`."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    cutoff = time.time() - STALE_SECONDS
    for name in names:
        path = os.path.join(root, name)
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and os.stat(path).st_mtime < cutoff:
                shutil.rmtree(path, ignore_errors=True)


def claimed_by(push: Push, execution_id: str | None, *, root: str = LEDGER_DIR) -> bool:
    """Whether a task of SQL execution ``execution_id`` may apply ``push``'s filters: the
    push is recorded on this host and ``execution_id`` is (or now becomes) its claimant."""
    if not execution_id:
        return False
    directory = _dir(push.instance_id, root)
    if not os.path.exists(os.path.join(directory, f"{push.generation}.push")):
        return False  # another host, or a cleared temp directory: read unfiltered
    claim = os.path.join(directory, f"{push.generation}.claim")
    tmp = f"{claim}.{os.getpid()}.{id(push)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(execution_id)
    try:
        os.link(tmp, claim)  # atomic create-if-absent
        return True
    except FileExistsError:
        with open(claim, encoding="utf-8") as f:
            return f.read() == execution_id
    finally:
        os.unlink(tmp)
